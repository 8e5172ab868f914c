"""Gradients of every kind beyond plain sums: many-to-one reads (clamp, mod, padded gathers),
(*) reductions and *= (exact with zeros), 0-d parameters.  Each against float64 central finite
differences; where torch has the layer, against torch autograd on torch's own ops; and the
printed equations, run with tullio(), against vjp bit for bit (fuse=False)."""
import numpy as np
import pytest
import torch

from tullio_py import kernel
from tullio_py.ir import Wrapped

from test_grad import finite_difference
from test_grad_equations import run_printed

RNG = np.random.default_rng(7)


def r(*shape):
    return RNG.standard_normal(shape)


def fd_check(k, cot, arrays, names=None, tol=1e-6):
    g = k.vjp(cot, **arrays)
    for name in names or g:
        ref = finite_difference(k, arrays, name, cot)
        assert np.abs(g[name] - ref).max() <= tol * max(np.abs(ref).max(), 1e-12), (name, g[name], ref)
    return g


def printed_match(k_one, cot, arrays, out):
    """The printed equations of the fuse=False kernel reproduce its vjp bit for bit."""
    g = k_one.vjp(cot, **arrays)
    printed = run_printed(k_one, cot, arrays, out)
    assert set(printed) == set(g)
    for name in g:
        np.testing.assert_array_equal(printed[name], g[name], err_msg=name)
    return g


# ----------------------------------------------------------------------------- many-to-one reads
J = np.array([0, 3, 5, 5, 1])
MANY = [
    ("replicate padding", "y[i] := x[clamp(i+k-1)] * w[k]", {"ranges": {"i": 6}},
     dict(x=r(6), w=r(3))),
    ("circular padding", "y[i] := x[mod(i+k-1)] * w[k]", {"ranges": {"i": 6}},
     dict(x=r(6), w=r(3))),
    ("2-D replicate", "y[i,j] := x[clamp(i+a-1), clamp(j+b-1)] * w[a,b]",
     {"ranges": {"i": 4, "j": 5}}, dict(x=r(4, 5), w=r(3, 3))),
    ("clamp and mod of one array", "y[i] := x[clamp(i+k-1)] * w[k] + x[mod(i-k)]",
     {"ranges": {"i": 5}}, dict(x=r(5), w=r(3))),
    ("padded gather", "y[n,i] := x[pad(J[n]+i-1, 1, 1)] * w[i]", {}, dict(x=r(6), w=r(3), J=J)),
    ("circular gather", "y[n,i] := x[mod(J[n]+i)] * w[i]", {}, dict(x=r(6), w=r(3), J=J)),
]


@pytest.mark.parametrize("title,expr,options,arrays", MANY, ids=[m[0] for m in MANY])
def test_many_to_one_gradients(title, expr, options, arrays):
    k = kernel(expr, **options)
    out = k(**arrays)
    cot = r(*out.shape)
    g = fd_check(k, cot, arrays, [n for n in arrays if n != "J"])
    one = kernel(expr, fuse=False, **options)
    g1 = printed_match(one, cot, arrays, out)
    for name in g:
        np.testing.assert_allclose(g[name], g1[name], rtol=1e-13, atol=1e-13)
    # the gradient of x keeps the wrapped position on its left side: a scatter with +=
    lines = k.gradient_equations["x"]
    assert all(" += " in line for line in lines)
    assert any(isinstance(s, Wrapped) for line in lines for s in kernel(line).equation.lhs.indices)


@pytest.mark.parametrize("mode,expr", [("replicate", "y[c,i,j] := x[e,clamp(i+a-1),clamp(j+b-1)] * w[c,e,a,b]"),
                                       ("circular", "y[c,i,j] := x[e,mod(i+a-1),mod(j+b-1)] * w[c,e,a,b]")])
def test_padded_convolution_against_torch(mode, expr):
    """torch's F.pad(mode=...) + conv2d, forward and gradients (torch autograd)."""
    x, w = r(2, 5, 6), r(3, 2, 3, 3)
    k = kernel(expr, ranges={"i": 5, "j": 6})
    y = k(x=x, w=w)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    yt = torch.nn.functional.conv2d(torch.nn.functional.pad(xt[None], (1, 1, 1, 1), mode=mode), wt)[0]
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    cot = r(*y.shape)
    yt.backward(torch.tensor(cot))
    g = k.vjp(cot, x=x, w=w)
    np.testing.assert_allclose(g["x"], xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g["w"], wt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_many_to_one_gradient_runs_race_free_on_threads():
    """Large enough to run threaded: no index of dx[clamp(i+k-1)] is safe to split, so the
    schedule gives each block of b its own copy of dx (combined in order after); the blocks are
    fixed, so any thread count gives the same bits, and serial loops agree to rounding."""
    expr = "y[b,i] := x[clamp(i+k-1)] * w[b,k]"
    x, w = r(2000), r(8, 3)
    cot = r(8, 2000)
    g = kernel(expr, ranges={"i": 2000}, fuse=False).vjp(cot, x=x, w=w)
    code = kernel(expr, ranges={"i": 2000}, fuse=False).gradient_code
    assert "_part" in code and "_prange" in code
    g1 = kernel(expr, ranges={"i": 2000}, fuse=False, threads=1).vjp(cot, x=x, w=w)
    g0 = kernel(expr, ranges={"i": 2000}, fuse=False, threads=False).vjp(cot, x=x, w=w)
    np.testing.assert_array_equal(g["x"], g1["x"])
    np.testing.assert_allclose(g["x"], g0["x"], rtol=1e-12, atol=1e-12)
    want = np.zeros(2000)
    np.add.at(want, np.clip(np.arange(2000)[:, None] + np.arange(3) - 1, 0, 1999),
              np.einsum("bi,bk->ik", cot, w))
    np.testing.assert_allclose(g["x"], want, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- (*) and *=
def _zeros(A, per_row):
    A = A.copy()
    for i, row in enumerate(A):
        row[RNG.choice(row.size, size=min(per_row[i], row.size), replace=False)] = 0.0
    return A


PROD = kernel("(*) p[i] := A[i,j]")
PROD_ONE = kernel("(*) p[i] := A[i,j]", fuse=False)
PROD_W = kernel("(*) p[i] := A[i,j] * w[j] |> tanh", fuse=False)


@pytest.mark.parametrize("zeros", [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 2, 5)],
                         ids=["no zero", "one zero", "two zeros", "many zeros"])
def test_product_gradient_is_exact_with_zeros(zeros):
    A = _zeros(r(3, 5), zeros)
    cot = r(3)
    out = PROD(A=A)
    g = fd_check(PROD, cot, dict(A=A))
    At = torch.tensor(A, requires_grad=True)
    At.prod(1).backward(torch.tensor(cot))
    np.testing.assert_allclose(g["A"], At.grad.numpy(), rtol=1e-13, atol=1e-13)
    assert np.isfinite(g["A"]).all()
    printed_match(PROD_ONE, cot, dict(A=A), out)


def test_product_with_factors_and_finaliser():
    A, w = _zeros(r(3, 4), (1, 0, 2)), r(4)
    cot = r(3)
    out = PROD_W(A=A, w=w)
    g = fd_check(PROD_W, cot, dict(A=A, w=w))
    At, wt = torch.tensor(A, requires_grad=True), torch.tensor(w, requires_grad=True)
    torch.tanh((At * wt).prod(1)).backward(torch.tensor(cot))
    np.testing.assert_allclose(g["A"], At.grad.numpy(), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(g["w"], wt.grad.numpy(), rtol=1e-13, atol=1e-13)
    printed_match(PROD_W, cot, dict(A=A, w=w), out)


def test_times_equal_gradient():
    """C[i] *= A[i,j]: vjp takes C's value before the statement (as the call does)."""
    k = kernel("C[i] *= A[i,j]", fuse=False)
    C0, A = r(3), _zeros(r(3, 4), (0, 1, 2))
    cot = r(3)
    g = k.vjp(cot, C=C0, A=A)
    At = torch.tensor(A, requires_grad=True)
    (torch.tensor(C0) * At.prod(1)).backward(torch.tensor(cot))
    np.testing.assert_allclose(g["A"], At.grad.numpy(), rtol=1e-13, atol=1e-13)

    def f(A):
        C = C0.copy()
        k(C=C, A=A)
        return C
    np.testing.assert_allclose(g["A"], finite_difference(f, dict(A=A), "A", cot), rtol=1e-6, atol=1e-9)
    printed = run_printed(k, cot, dict(A=A), C0)
    np.testing.assert_array_equal(printed["A"], g["A"])


# ----------------------------------------------------------------------------- 0-d parameters
SCALARS = [
    ("learnable scale", "y[i] := s * x[i]", dict(s=np.array(1.3), x=r(5))),
    ("scale and shift inside a function", "y[i] := tanh(s * A[i,j] + t) * w[j]",
     dict(s=np.array(0.7), t=np.array(-0.2), A=r(3, 4), w=r(4))),
    ("scale of a max", "(max) m[i] := s * A[i,j] + t", dict(s=np.array(2.0), t=np.array(0.5), A=r(3, 4))),
    ("complex scale", "y[i] := s * z[i] + conj(s) * x[i]",
     dict(s=np.array(0.3 - 0.8j), z=r(4) + 1j * r(4), x=r(4))),
]


@pytest.mark.parametrize("title,expr,arrays", SCALARS, ids=[s[0] for s in SCALARS])
def test_zero_d_parameters_get_gradients(title, expr, arrays):
    k = kernel(expr, fuse=False)
    out = k(**arrays)
    cot = r(*out.shape) if out.dtype.kind != "c" else r(*out.shape) + 1j * r(*out.shape)
    g = fd_check(k, cot, arrays)
    assert set(g) == set(arrays)
    for n in ("s", "t"):
        if n in arrays:
            assert g[n].shape == () and g[n].dtype == arrays[n].dtype
    if out.dtype.kind != "c":
        printed_match(k, cot, arrays, out)
    # a Python scalar stays a constant: no gradient
    assert "s" not in k.vjp(cot, **{**arrays, "s": arrays["s"].item()})


def test_zero_d_parameter_matches_torch():
    s, x, w = np.array(1.7), r(4, 3), r(3)
    k = kernel("y[i] := s * x[i,j] * w[j]")
    cot = r(4)
    g = k.vjp(cot, s=s, x=x, w=w)
    st = torch.tensor(s, requires_grad=True)
    (st * torch.tensor(x) @ torch.tensor(w)).backward(torch.tensor(cot))
    np.testing.assert_allclose(g["s"], st.grad.numpy(), rtol=1e-13)
