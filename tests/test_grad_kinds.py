"""Gradients of every kind beyond plain sums: many-to-one reads (clamp, mod, padded gathers),
(*) reductions and *= (exact with zeros), 0-d parameters.  Each against float64 central finite
differences; where torch has the layer, against torch autograd on torch's own ops; and the
printed equations, run with tullio(), against vjp bit for bit (fuse=False)."""
import numpy as np
import pytest
import torch

from tullio_py import kernel, tullio
from tullio_py.ir import Wrapped

from test_grad import finite_difference
from test_grad_equations import run_printed, run_statements

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
    """torch's F.pad(mode=...) + conv2d, forward and gradients (torch autograd): 2-D
    replicate and circular padding."""
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


@pytest.mark.parametrize("v", [[2.0, 3.0, 5.0], [2.0, 0.0, 5.0], [0.0, 3.0, 0.0]])
def test_product_to_a_scalar(v):
    """Helpers with a scalar result (read as parameters by the gradient statement)."""
    k = kernel("(*) p := v[i]", fuse=False)
    v = np.array(v)
    g = k.vjp(1.5, v=v)
    vt = torch.tensor(v, requires_grad=True)
    vt.prod().backward(torch.tensor(1.5, dtype=torch.float64))
    np.testing.assert_allclose(g["v"], vt.grad.numpy(), rtol=1e-14)
    printed_match(k, np.array(1.5), dict(v=v), k(v=v))


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


# ----------------------------------------------------------------------------- forward mode
def fd_jvp(f, arrays, tangents, eps=1e-6):
    """(f(x + eps t) - f(x - eps t)) / 2 eps: the directional derivative along the tangents."""
    def at(sign):
        return f(**{n: (a + sign * eps * tangents[n] if n in tangents else a) for n, a in arrays.items()})
    return (at(1) - at(-1)) / (2 * eps)


def run_printed_tangent(k, arrays, tangents, out):
    """Run k.tangent_equations with tullio() into a zeroed d<out>; inputs without a tangent get
    zeros (the printed statements name every input's tangent d<input>)."""
    eq = k.equation
    ns = {**arrays, **{"d" + n: np.zeros_like(a) for n, a in arrays.items()
                       if isinstance(a, np.ndarray) and a.dtype.kind in "fc"},
          **{"d" + n: t for n, t in tangents.items()}, eq.output: out,
          "d" + eq.output: np.zeros_like(out)}
    return run_statements(k.tangent_equations, ns)["d" + eq.output]


F = torch.nn.functional
ZA = _zeros(r(3, 4), (0, 1, 2))
JV = [
    ("matmul", "C[i,k] := A[i,j] * B[j,k]", {}, dict(A=r(3, 4), B=r(4, 2)), ("A", "B"),
     lambda A, B: A @ B),
    ("matmul float32", "C[i,k] := A[i,j] * B[j,k]", {},
     dict(A=r(3, 4).astype(np.float32), B=r(4, 2).astype(np.float32)), ("A",), None),
    ("valid convolution", "y[i] := x[i+k] * w[k]", {}, dict(x=r(9), w=r(3)), ("x", "w"),
     lambda x, w: F.conv1d(x[None, None], w[None, None])[0, 0]),
    ("replicate padding", "y[i] := x[clamp(i+k-1)] * w[k]", {"ranges": {"i": 7}},
     dict(x=r(7), w=r(3)), ("x", "w"),
     lambda x, w: F.conv1d(F.pad(x[None, None], (1, 1), mode="replicate"), w[None, None])[0, 0]),
    ("full convolution (shifted left side)", "y[i+j] := x[i] * h[j]", {}, dict(x=r(5), h=r(3)),
     ("x", "h"), None),
    ("max", "(max) m[i] := A[i,j] * w[j]", {}, dict(A=r(3, 5), w=r(5)), ("A", "w"),
     lambda A, w: (A * w).amax(1)),
    ("product with zeros", "(*) p[i] := A[i,j]", {}, dict(A=ZA), ("A",), lambda A: A.prod(1)),
    ("product to a scalar", "(*) p := v[i]", {}, dict(v=np.array([2.0, 0.0, 5.0, 1.5])), ("v",),
     lambda v: v.prod()),
    ("product, finaliser", "(*) p[i] := A[i,j] * w[j] |> tanh", {}, dict(A=ZA, w=r(4)), ("A", "w"),
     lambda A, w: torch.tanh((A * w).prod(1))),
    ("log-sum-exp", "lse[i] := exp(A[i,j]) |> log", {}, dict(A=r(3, 4)), ("A",),
     lambda A: torch.logsumexp(A, 1)),
    ("0-d scale", "y[i] := s * x[i] + t", {}, dict(s=np.array(1.5), t=np.array(0.2), x=r(4)),
     ("s", "x", "t"), lambda s, t, x: s * x + t),
    ("gather", "y[n] := x[J[n]] * w[n]", {}, dict(x=r(4), w=r(5), J=np.array([3, 0, 0, 2, 1])),
     ("x", "w"), None),
    ("complex", "y[i] := z[i] * conj(z[i]) * w[i] + z[i] * w[i]", {},
     dict(z=r(3) + 1j * r(3), w=r(3) + 1j * r(3)), ("z", "w"), None),
]


@pytest.mark.parametrize("title,expr,options,arrays,which,torch_fn", JV, ids=[j[0] for j in JV])
def test_jvp(title, expr, options, arrays, which, torch_fn):
    k = kernel(expr, fuse=False, **options)
    out = k(**arrays)
    tangents = {n: (r(*np.shape(arrays[n])) + (1j * r(*np.shape(arrays[n]))
                                               if arrays[n].dtype.kind == "c" else 0)
                    ).astype(arrays[n].dtype) for n in which}
    t = k.jvp(tangents, **arrays)
    assert t.dtype == out.dtype and t.shape == out.shape
    if out.dtype == np.float64 or out.dtype == np.complex128:
        ref = fd_jvp(k, arrays, tangents)
        assert np.abs(t - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1e-12), (t, ref)
    else:
        np.testing.assert_allclose(t, tangents["A"] @ arrays["B"], rtol=1e-5, atol=1e-5)
    # one input's tangent alone (the others zero) adds up to the whole
    first = k.jvp({which[0]: tangents[which[0]]}, **arrays)
    rest = k.jvp({n: tangents[n] for n in which[1:]}, **arrays)
    np.testing.assert_allclose(first + rest, t, rtol=1e-12, atol=1e-12)
    # the printed statements reproduce jvp bit for bit
    np.testing.assert_array_equal(run_printed_tangent(k, arrays, tangents, out), t)
    # jvp and vjp are each other's transpose: <jvp(t), c> = sum <t, vjp(c)>
    cot = r(*out.shape).astype(out.dtype)
    g = k.vjp(cot, **arrays)
    lhs = np.real(np.vdot(cot, t))
    rhs = sum(np.real(np.vdot(g[n], tangents[n])) for n in which)
    tol = 1e-4 if out.dtype == np.float32 else 1e-10
    assert abs(lhs - rhs) <= tol * max(abs(lhs), 1.0), (lhs, rhs)
    if torch_fn is not None:
        names = [n for n in torch_fn.__code__.co_varnames[:torch_fn.__code__.co_argcount]]
        primals = tuple(torch.tensor(arrays[n]) for n in names)
        tans = tuple(torch.tensor(tangents[n]) if n in tangents else torch.zeros_like(p)
                     for n, p in zip(names, primals))
        _, want = torch.func.jvp(torch_fn, primals, tans)
        np.testing.assert_allclose(t, want.numpy(), rtol=1e-10, atol=1e-12)


def test_jvp_of_times_equal_and_in_place_forms():
    C0, A, dA = r(3), ZA, r(3, 4)
    k = kernel("C[i] *= A[i,j]", fuse=False)
    t = k.jvp({"A": dA}, C=C0, A=A)

    def f(A):
        C = C0.copy()
        k(C=C, A=A)
        return C
    ref = fd_jvp(f, dict(A=A), {"A": dA})
    np.testing.assert_allclose(t, ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(run_printed_tangent(k, dict(A=A), {"A": dA}, C0), t)
    # '-=' subtracts; the output's old value is held constant
    k2 = kernel("y[i] -= x[i,j] * w[j]")
    x, w, dx = r(3, 4), r(4), r(3, 4)
    np.testing.assert_allclose(k2.jvp({"x": dx}, y=r(3), x=x, w=w), -(dx @ w), rtol=1e-13)
    with pytest.raises(Exception, match="does not read"):
        k2.jvp({"q": dx}, y=r(3), x=x, w=w)


def test_tangent_equations_read_well():
    k = kernel("C[i,k] := A[i,j] * B[j,k]")
    k.jvp({"A": r(2, 3)}, A=r(2, 3), B=r(3, 4))
    assert k.tangent_equations == ["dC[i, k] += dA[i, j] * B[j, k]",
                                   "dC[i, k] += dB[j, k] * A[i, j]"]


# ----------------------------------------------------------------------------- second order
def test_hessian_vector_product_through_gradient_kernels():
    """The gradient statements as Kernels: their jvp is a Hessian-vector product (against
    finite differences of the gradient), their vjp its transpose (a symmetric Hessian)."""
    k = kernel("y[i] := tanh(x[i+k] * w[k])")
    x, w, cot = r(8), r(3), r(6)

    def grad(x, w):
        return k.vjp(cot, x=x, w=w)
    grad(x, w)
    gk = k.gradient_kernels()
    assert set(gk) == {"x", "w"} and all(len(v) == 1 for v in gk.values())
    gx, gw = gk["x"][0], gk["w"][0]
    names = {"d" + k.equation.output: cot, "x": x, "w": w}
    vx, vw = r(8), r(3)
    tx = gx.jvp({"x": vx, "w": vw}, dx=np.zeros(8), **{n: names[n] for n in gx.equation.arrays})
    tw = gw.jvp({"x": vx, "w": vw}, dw=np.zeros(3), **{n: names[n] for n in gw.equation.arrays})
    eps = 1e-6
    gp, gm = grad(x + eps * vx, w + eps * vw), grad(x - eps * vx, w - eps * vw)
    np.testing.assert_allclose(tx, (gp["x"] - gm["x"]) / (2 * eps), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(tw, (gp["w"] - gm["w"]) / (2 * eps), rtol=1e-6, atol=1e-8)
    # vjp of the gradient statements: u . (H v) == v . (H u)
    ux, uw = r(8), r(3)
    hx = gx.vjp(ux, dx=np.zeros(8), **{n: names[n] for n in gx.equation.arrays})
    hw = gw.vjp(uw, dw=np.zeros(3), **{n: names[n] for n in gw.equation.arrays})
    lhs = ux @ tx + uw @ tw
    rhs = vx @ (hx["x"] + hw["x"]) + vw @ (hx["w"] + hw["w"])
    assert abs(lhs - rhs) <= 1e-10 * max(abs(lhs), 1.0)
