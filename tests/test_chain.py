"""Chains: several statements as one kernel (chain.py, chain_text.py, chain_grad.py,
frontends/torch_chain.py).  The forward against the statements run one by one (bit for bit,
row groups included) and numpy; the vjp against finite differences, torch's own layers and
the printed gradient statements run one by one; torch's gradcheck; the rules with carets."""
import numpy as np
import pytest

from tullio_py import Tape, jit, kernel, tullio
from tullio_py import chain as chain_mod, chain_grad
from tullio_py.errors import ArgumentError, ParseError
from tullio_py.parse import parse

SM = """(max) m[i] := x[i,j]
e[i,j] := exp(x[i,j] - m[i])
z[i] := e[i,j]
y[i,j] := e[i,j] / z[i]"""
LN = ("mu[i] := x[i,j] * inv_n; var[i] := (x[i,j] - mu[i])**2 * inv_n; "
      "y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]")
K_SM = kernel(SM, nograd=("m",))
K_SM_ALL = kernel(SM)                        # the max differentiated too (argmax helper)
K_LN = kernel(LN)
K_SM0 = kernel(SM, nograd=("m",), fuse=False, blas=False)
K_LN0 = kernel(LN, fuse=False, blas=False)
ONE = {t: kernel(t) for t in SM.split("\n") + LN.split("; ")}   # the statements one by one
EPS = 1e-5
SHAPE = (300, 40)       # one shape: the kernels compiled for it serve every test


@pytest.fixture(autouse=True, scope="module")
def small_blocks():
    """Blocks of rows of 16 kB: several blocks, so several tasks, at these sizes."""
    names = ("BLOCK_BYTES", "SUMS_BLOCK_BYTES")
    saved = [(m, n, getattr(m, n)) for m in (chain_mod, chain_grad) for n in names]
    for m, n, _ in saved:
        setattr(m, n, 1 << 14)
    yield
    for m, n, v in saved:
        setattr(m, n, v)


def data(shape=SHAPE, dtype=np.float64, seed=0):
    r = np.random.default_rng(seed)
    x = (r.standard_normal(shape) * 3).astype(dtype)
    return x, r.standard_normal(shape[1]).astype(dtype), r.standard_normal(shape[1]).astype(dtype)


def ln_args(x, g, bb):
    return dict(x=x, inv_n=1.0 / x.shape[1], eps=EPS, g=g, bb=bb)


def by_statements(text, arrays):
    ns = dict(arrays)
    for t in [s.strip() for s in text.replace(";", "\n").split("\n")]:
        k = ONE[t]
        ns[k.equation.output] = k(**{n: ns[n] for n in (*k.equation.arrays, *k.equation.params)})
    return ns


# ----------------------------------------------------------------------------- forward
def test_forward_equals_statements_one_by_one():
    """fuse=False: each statement by its own kernel, bit for bit; the default runs row groups
    (one pass over blocks of rows), equal but for the last bits of sums (codegen/rows.py)."""
    x, g, bb = data()
    for k, k0, text, args in [(K_SM, K_SM0, SM, {"x": x}), (K_LN, K_LN0, LN, ln_args(x, g, bb))]:
        want = by_statements(text, args)["y"]
        assert np.array_equal(k0(**args), want)
        assert k0.last_groups == tuple((j,) for j in range(len(k.statements)))
        np.testing.assert_allclose(k(**args), want, rtol=1e-14, atol=1e-15)
        assert k.last_groups == (tuple(range(len(k.statements))),)     # one pass
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(K_SM(x=x), ref / ref.sum(1, keepdims=True), rtol=1e-13)
    mu = x.mean(1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + EPS) * g + bb
    np.testing.assert_allclose(K_LN(**ln_args(x, g, bb)), ref, rtol=1e-11, atol=1e-12)


def test_row_groups_do_not_depend_on_threads():
    x, g, bb = data(seed=3)
    dy = np.random.default_rng(6).standard_normal(x.shape)
    want = K_LN(**ln_args(x, g, bb)), K_LN.vjp(dy, **ln_args(x, g, bb))["x"]
    assert "rows" in [s.kind for s in K_LN.gradient_plan.steps]
    with jit.thread_budget(1):
        got = K_LN(**ln_args(x, g, bb)), K_LN.vjp(dy, **ln_args(x, g, bb))["x"]
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_tullio_reads_the_scope_and_separators():
    x = np.arange(12.0).reshape(3, 4)
    a = tullio("s[i] := x[i,j]; t[i] := s[i] * 2")           # x from the caller's scope
    b = tullio("s[i] := x[i,j]\n\n  t[i] := s[i] * 2\n", x=x)
    c = tullio("s[i] := x[i,\n j]; t[i] := s[i] * 2", x=x)    # a newline inside brackets
    assert np.array_equal(a, x.sum(1) * 2) and np.array_equal(b, a) and np.array_equal(c, a)


def test_scalar_temporary_and_its_gradient():
    """A 0-d temporary is read as a scalar; its gradient flows back like any other."""
    k = kernel("s := x[i] * x[i]; y[i] := x[i] / s")
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(k(x=x), x / (x @ x))
    dy = np.array([0.3, 1.0, -2.0])
    got = k.vjp(dy, x=x)["x"]
    num = [((k(x=x + h) - k(x=x - h)) @ dy) / 2e-6 for h in np.eye(3) * 1e-6]
    np.testing.assert_allclose(got, num, rtol=1e-6)


def test_gather_through_a_temporary():
    """An index array the chain computes: its statements run one by one (the values decide
    the ranges); the gradient scatters back through the gather."""
    x, J = np.arange(6.0), np.array([5, 0, 2, 5])
    k = kernel("K[n] := J[n] + 0; y[n] := x[K[n]] * x[K[n]]")
    assert np.array_equal(k(x=x, J=J), x[J] ** 2) and k.last_groups == ((0,), (1,))
    want = np.zeros(6)
    np.add.at(want, J, 2 * x[J] * np.arange(1.0, 5.0))
    assert np.array_equal(k.vjp(np.arange(1.0, 5.0), x=x, J=J)["x"], want)


# ----------------------------------------------------------------------------- gradients
def directional(f, arrays, name, dy, v, h=1e-6):
    """d/dt sum(f(arrays with name + t v) * dy) at 0, by central differences."""
    a = arrays[name]
    up, dn = f(**{**arrays, name: a + h * v}), f(**{**arrays, name: a - h * v})
    return ((up - dn) * dy).sum() / (2 * h)


@pytest.mark.parametrize("k", [K_SM, K_SM_ALL, K_LN], ids=["softmax", "softmax_max", "ln"])
def test_vjp_matches_finite_differences(k):
    x, g, bb = data(seed=1)
    arrays = ln_args(x, g, bb) if k is K_LN else {"x": x}
    r = np.random.default_rng(2)
    dy = r.standard_normal(x.shape)
    got = k.vjp(dy, **arrays)
    assert set(got) == ({"x", "g", "bb"} if k is K_LN else {"x"})
    for name in got:
        v = r.standard_normal(arrays[name].shape)
        np.testing.assert_allclose((got[name] * v).sum(), directional(k, arrays, name, dy, v),
                                   rtol=1e-6)


def test_vjp_matches_torch_layers_and_groups_rows():
    torch = pytest.importorskip("torch")
    x, g, bb = data()
    dy = np.random.default_rng(4).standard_normal(x.shape)
    xt, gt, bt = (torch.tensor(a, requires_grad=True) for a in (x, g, bb))
    torch.softmax(xt, -1).backward(torch.tensor(dy))
    for k in (K_SM, K_SM_ALL):
        np.testing.assert_allclose(k.vjp(dy, x=x)["x"], xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    assert [s.kind for s in K_SM.gradient_plan.steps] == ["rows"]
    xt.grad = None
    torch.nn.functional.layer_norm(xt, (x.shape[1],), gt, bt, EPS).backward(torch.tensor(dy))
    got = K_LN.vjp(dy, **ln_args(x, g, bb))
    for name, t in [("x", xt), ("g", gt), ("bb", bt)]:
        np.testing.assert_allclose(got[name], t.grad.numpy(), rtol=1e-8, atol=1e-10)


def test_gradient_row_groups_against_steps_one_by_one(monkeypatch):
    x, _, _ = data(seed=5)
    dy = np.random.default_rng(6).standard_normal(x.shape)
    want = K_SM.vjp(dy, x=x)["x"]
    monkeypatch.setattr(chain_grad, "ROWS", False)
    k = chain_mod.Chain(SM, K_SM.options)
    np.testing.assert_allclose(k.vjp(dy, x=x)["x"], want, rtol=1e-13, atol=1e-15)
    assert "rows" not in [s.kind for s in k.gradient_plan.steps]


def run_printed(k, arrays, dy):
    """The printed gradient statements run one by one with tullio() into zeroed arrays."""
    ns = k.run(**arrays)
    names = k.gradient_names
    ns[names[k.result]] = dy
    for n, d in names.items():
        if n != k.result and isinstance(ns[n], np.ndarray):
            ns[d] = np.zeros(ns[n].shape)
    for text in k.gradient_equations:
        eq = parse(text)
        reads = [*eq.arrays, *eq.params] + ([eq.output] if eq.assign != ":=" else [])
        out = tullio(text, **{n: ns[n] for n in reads})
        if eq.assign == ":=":
            ns[eq.output] = out
    return {n: ns[names[n]] for n in k.inputs if names[n] in ns}


@pytest.mark.parametrize("k", [K_SM0, K_SM_ALL, K_LN0], ids=["softmax", "softmax_max", "ln"])
def test_printed_gradient_reproduces_vjp(k):
    """Bit for bit with one kernel per statement and no BLAS (fuse=False, blas=False); the
    default (row groups, fused nests) agrees to rounding."""
    x, g, bb = data(seed=7)
    arrays = ln_args(x, g, bb) if k is K_LN0 else {"x": x}
    dy = np.random.default_rng(8).standard_normal(x.shape)
    got = k.vjp(dy, **arrays)
    printed = run_printed(k, arrays, dy)
    assert set(printed) == set(got)
    for n in got:
        if k is K_SM_ALL:
            np.testing.assert_allclose(printed[n], got[n], rtol=1e-12, atol=1e-14)
        else:
            assert np.array_equal(printed[n], got[n])
    if k is K_SM_ALL:          # the argmax helper, renamed to the chain's names
        assert any(":=" in e and "m_arg" in e for e in k.gradient_equations)


def test_torch_one_node_gradcheck_and_first_order_only():
    torch = pytest.importorskip("torch")
    x, g, bb = data(seed=9)
    xt, gt, bt = (torch.tensor(a, requires_grad=True) for a in (x, g, bb))
    n = x.shape[1]
    assert torch.autograd.gradcheck(lambda x: K_SM(x=x), (xt,), fast_mode=True)
    assert torch.autograd.gradcheck(
        lambda x, g, b: K_LN(x=x, g=g, bb=b, inv_n=1 / n, eps=EPS), (xt, gt, bt), fast_mode=True)
    y = K_LN(x=xt, g=gt, bb=bt, inv_n=1 / n, eps=EPS)
    assert type(y.grad_fn).__name__ == "ChainFunctionBackward"     # one node for the chain
    (dx,) = torch.autograd.grad(y.sum(), xt, create_graph=True)
    with pytest.raises(RuntimeError):
        dx.sum().backward()
    with torch.no_grad():
        np.testing.assert_array_equal(K_LN(x=xt, g=gt, bb=bt, inv_n=1 / n, eps=EPS).numpy(),
                                      K_LN(**ln_args(x, g, bb)))
    # only the inputs that require grad get one
    gt2 = torch.tensor(g)
    K_LN(x=xt, g=gt2, bb=bt, inv_n=1 / n, eps=EPS).sum().backward()
    assert gt2.grad is None and bt.grad is not None


def test_tape_records_the_statements():
    x, g, bb = data(seed=10)
    dy = np.random.default_rng(11).standard_normal(x.shape)
    with Tape() as tape:
        y = K_LN(**ln_args(x, g, bb))
    assert len(tape.records) == 3
    tape.backward(y, dy)
    got = K_LN.vjp(dy, **ln_args(x, g, bb))
    for name, a in [("x", x), ("g", g), ("bb", bb)]:
        np.testing.assert_allclose(tape.grad(a), got[name], rtol=1e-12, atol=1e-14)


def test_nograd_holds_a_temporary_constant():
    x = np.array([[1.0, 2.0], [3.0, 5.0]])
    k = kernel("s[i] := x[i,j]; y[i,j] := x[i,j] * s[i]", nograd=("s",))
    assert np.array_equal(k.vjp(np.ones((2, 2)), x=x)["x"], [[3.0, 3.0], [8.0, 8.0]])
    assert kernel("s[i] := x[i,j]; y[i,j] := x[i,j] * s[i]", nograd=("x",)).vjp(
        np.ones((2, 2)), x=x) == {}


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("text,rule,caret", [
    ("e[i,j] := exp(x[i,j] - m[i]); (max) m[i] := x[i,j]",
     "statement 2 of the chain: this statement defines m, which statement 1 reads before", "m[i]"),
    ("m[i] := x[i,j]; x[i,j] := m[i] * 2", "defines x, which statement 1 reads before", "x[i,j]"),
    ("m[i] := x[i,j]; m[i] := x[i,j] * 2; y[i] := m[i]",
     "m is defined by statement 1 already", "m[i]"),
    ("m[i] := x[i,j]; y[i] += m[i]", "'+=' updates an array in place", "+="),
    ("m[i] := x[i,j]; y[i] := x[i,j]", "statement 1 of the chain: m is not read by any later",
     "m[i]"),
    ("m[i] := x[i,j]; y[i,j] := x[i,j] * m", "m is read as a scalar, but statement 1", "m"),
    ("m[i] := x[i,j] * c; y[i] := m[i] * c[i]", "c is read as an array here and as a scalar",
     "c[i]"),
    ("m[i] := x[i,j]\ny[i] := m[i] ^ 2", "statement 2 of the chain: '^' is not a power",
     "m[i] ^ 2"),
])
def test_bad_chains(text, rule, caret):
    with pytest.raises(ParseError) as info:
        kernel(text)
    e = info.value
    assert rule in e.rule, e.rule
    assert e.text[e.span[0]:e.span[1]] == caret, str(e)
    assert "^" in str(e).splitlines()[2]


def test_bad_arguments():
    x = np.ones((2, 3))
    with pytest.raises(ArgumentError, match="missing array: x"):
        K_SM()
    with pytest.raises(ArgumentError, match="e is defined by statement 2 of the chain"):
        K_SM(x=x, e=x)
    with pytest.raises(ArgumentError, match="not used by the chain: q"):
        K_SM(x=x, q=x)
    with pytest.raises(ArgumentError, match="nograd names 'q', which is neither"):
        kernel(SM, nograd=("q",))
    with pytest.raises(ArgumentError, match="nograd names 'y', the chain's result"):
        kernel(SM, nograd=("y",))
    with pytest.raises(ArgumentError, match="ranges names 'q'"):
        kernel(SM, ranges={"q": 3})
    with pytest.raises(ParseError, match="one statement per call"):    # a single statement
        kernel("y[i] := x[i];")


def test_a_chain_answers_the_kernel_attributes():
    """Code that walks the kernel cache reads `threads` and `target` of whatever it holds."""
    for opts in ({}, {"threads": 1}):
        k = kernel("m[i] := x[i,j]; y[i,j] := x[i,j] - m[i]", **opts)
        one = kernel("m[i] := x[i,j]", **opts)
        assert (k.threads, k.target) == (one.threads, one.target)
    assert kernel("m[i] := x[i,j]; y[i,j] := x[i,j] - m[i]", threads=1).threads == 1
