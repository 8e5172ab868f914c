"""Kernels built from an `Equation`: the same results as from the statement's text, and every
statement another stage derives (gradients, the Tape's helpers, torch.compile's ops, vjp of
a subset) is built from its Equation, never printed and parsed again -- checked by making
`parse` raise once the forward kernel exists."""
import sys

import numpy as np
import pytest

from tullio_py import Tape, kernel
from tullio_py.ir import Access, Affine, Binary, Equation, IndexValue
from tullio_py.kernel import Kernel
from tullio_py.parse import parse

rng = np.random.default_rng(11)


def _no_parse(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("parse() called for a derived statement")
    for module in ("tullio_py.parse", "tullio_py.kernel"):     # (the package's `kernel` is
        monkeypatch.setattr(sys.modules[module], "parse", boom)   # the function)


CASES = [
    ("C[i,k] := A[i,j] * B[j,k]", {}, lambda A, B: A @ B),
    ("y[i] := x[i+j] * h[j]", {}, lambda x, h: np.convolve(x, h[::-1], "valid")),
    ("(max) m[i] := A[i,j]", {}, lambda A: A.max(1)),
    ("v[i] := x[i] * j", {"ranges": {"j": 4}}, lambda x: 6 * x),     # j: a value only
]
ARRAYS = {"A": rng.standard_normal((3, 4)), "B": rng.standard_normal((4, 5)),
          "x": rng.standard_normal(9), "h": rng.standard_normal(3)}


@pytest.mark.parametrize("text,options,ref", CASES, ids=[c[0] for c in CASES])
def test_kernel_from_equation_matches_kernel_from_text(text, options, ref):
    given = tuple(options.get("ranges", ()))
    eq = parse(text, given)
    arrays = {n: ARRAYS[n] for n in eq.arrays}
    want = ref(**arrays)
    from_text = Kernel(text, **options)(**arrays)
    from_eq = Kernel(eq, **options)(**arrays)
    np.testing.assert_allclose(from_text, want, rtol=1e-12)
    np.testing.assert_array_equal(from_eq, from_text)
    # a parameter that ranges= names is an index, as when parsing the text with ranges=
    np.testing.assert_array_equal(Kernel(parse(text), **options)(**arrays), from_text)


def test_kernel_from_equation_is_cached_by_equation():
    eq = parse("y[i] := x[i] * 2")
    assert kernel(eq) is kernel(parse("y[i] := x[i] * 2")) and kernel(eq) is not kernel(str(eq))
    assert repr(kernel(eq)) == "kernel('y[i] := x[i] * 2')"


@pytest.mark.parametrize("make", [lambda t: t, parse], ids=["text", "Equation"])
def test_constants_of_different_types_are_different_statements(make):
    """`x[i] * 2` and `x[i] * 2.0` on integers: numpy's dtypes, whichever ran first (caches
    keyed by the statement must not take one for the other)."""
    from tullio_py import tullio
    x = np.arange(5)
    for text in ("y[i] := x[i] * 2", "y[i] := x[i] * 2.0", "y[i] := x[i] * 2"):
        k = kernel(make(text))
        want = x * (2.0 if "2.0" in text else 2)
        assert k(x=x).dtype == want.dtype and tullio(text, x=x).dtype == want.dtype
        np.testing.assert_array_equal(k(x=x), want)


def test_derived_equation_reads_zero_d_arrays_as_parameters():
    """A statement built by another stage may read a 0-d array without brackets (Access with
    no indices): the Kernel reads it as the parameter parse would make of its text."""
    i = (Affine((("i", 1),)),)
    eq = Equation(Access("dx", i), "+=", Binary("*", Access("ds", ()), Access("w", i)))
    k = Kernel(eq)
    assert k.equation.params == ("ds",) and k.equation == parse(str(eq))
    w, dx = rng.standard_normal(4), np.zeros(4)
    k(dx=dx, ds=2.5, w=w)
    np.testing.assert_allclose(dx, 2.5 * w, rtol=1e-15)


def test_gradient_kernels_are_built_without_parsing(monkeypatch):
    """`(max) m[i] := x[i,j] + w[k]`: the gradient of w reads j only as a value (which tuple
    was the maximum); it is still iterated, with no ranges= naming it."""
    k = Kernel("(max) m[i] := x[i,j] + w[k]")       # a fresh kernel: no gradient kernels yet
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(5)
    dm = rng.standard_normal(3)
    _no_parse(monkeypatch)
    g = k.vjp(dm, x=x, w=w)
    total = x[:, :, None] + w[None, None, :]
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for i in range(3):              # the first maximal (j, k) in index order gets it all
        j, kk = np.unravel_index(np.argmax(total[i]), total[i].shape)
        dx[i, j] += dm[i]
        dw[kk] += dm[i]
    np.testing.assert_allclose(g["x"], dx, rtol=1e-14)
    np.testing.assert_allclose(g["w"], dw, rtol=1e-14)
    built = list(k.gradient_side()._kernels.values())
    assert any(kg.equation.value_indices for kg in built)       # the case is exercised
    assert all(kg.given == {} for kg in built)                  # with no ranges= naming j


def test_tape_helper_kernels_are_built_without_parsing(monkeypatch):
    """`=` reading its own old value (the old-value kernel) and `*=` (the factor kernel)."""
    from tullio_py import tullio
    C0 = rng.standard_normal((3, 2))
    X = rng.uniform(0.5, 1.5, (3, 4))
    y0 = rng.standard_normal(3)
    C, y = C0.copy(), y0.copy()
    with Tape() as tape:
        tullio("C_eqk[i,j] = -1.3 * C_eqk[i,j] + C_eqk[i,j]**2", C_eqk=C)
        tullio("y_eqk[i] *= X_eqk[i,j]", y_eqk=y, X_eqk=X)
    _no_parse(monkeypatch)
    gC, gy = rng.standard_normal(C.shape), rng.standard_normal(3)
    tape.backward([C, y], [gC, gy])
    np.testing.assert_allclose(tape.grad(C), gC * (-1.3 + 2 * C0), rtol=1e-13)
    np.testing.assert_allclose(tape.grad(y), gy * X.prod(1), rtol=1e-13)
    np.testing.assert_allclose(tape.grad(X), (gy * y0)[:, None] * X.prod(1)[:, None] / X,
                               rtol=1e-12)


def test_subset_vjp_kernel_is_built_without_parsing(monkeypatch):
    from tullio_py.frontends import vjp as vjp_mod
    k = Kernel("C[i,k] := A[i,j] * B[j,k]")
    A, B, dC = ARRAYS["A"], ARRAYS["B"], rng.standard_normal((3, 5))
    _no_parse(monkeypatch)
    g = vjp_mod.vjp(k, dC, {"A": A, "B": B}, {"B"})
    assert list(g) == ["B"]
    np.testing.assert_allclose(g["B"], A.T @ dC, rtol=1e-12)


def test_torch_compile_ops_find_the_traced_kernel(monkeypatch):
    """The custom ops' key is a string; the Kernel filed under it when the key was built is
    the one the ops run (no parse), here one whose `j` is read only as a value."""
    torch = pytest.importorskip("torch")
    from tullio_py.frontends import torch_ops
    k = kernel(parse("v_ops[i] := x[i] * j", ("j",)), ranges={"j": 4})
    x = torch.tensor(rng.standard_normal(6), requires_grad=True)
    cf = torch.compile(lambda x: k(x=x).sin().sum(), fullgraph=True, backend="aot_eager")
    with monkeypatch.context() as m:
        _no_parse(m)
        r = cf(x)
        r.backward()
    xs = x.detach().numpy()
    np.testing.assert_allclose(r.item(), np.sin(6 * xs).sum(), rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), 6 * np.cos(6 * xs), rtol=1e-12)
    # a registry miss (a fresh process) rebuilds the same statement from the key's text,
    # parsed with its value-only indices
    key = torch_ops._key(k, ("x",), ())
    torch_ops._BY_KEY.clear()
    torch_ops._decode.cache_clear()
    parsed = []
    real = sys.modules["tullio_py.parse"].parse
    monkeypatch.setattr(sys.modules["tullio_py.parse"], "parse",
                        lambda *a: parsed.append(a) or real(*a))
    rebuilt = torch_ops._decode(key)[0]
    assert parsed == [(str(k.equation), ("j",))]
    assert rebuilt.equation == k.equation and isinstance(rebuilt.equation.rhs.right, IndexValue)
    y = torch.ops.tullio_py.forward(key, [x.detach()], [])
    np.testing.assert_allclose(y.numpy(), 6 * xs, rtol=1e-12)
