"""Kernel.vjp against central finite differences (float64), closed forms, and the rules:
first-maximal-element gradients, nograd/grad=False, integer and index arrays,
threaded vs serial."""
import numpy as np
import pytest

from tullio_py import GradientError, SummationWarning, kernel, tullio

RNG = np.random.default_rng(1)


def rand(*shape, pos=False):
    a = RNG.standard_normal(shape)
    return np.abs(a) + 0.5 if pos else a


def crand(*shape):
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


def finite_difference(f, arrays, name, cot, eps=1e-6):
    """d/dx of sum(f(x) * cot) (for complex x: d/dRe + i d/dIm of Re(sum(conj(cot) f)))."""
    x = arrays[name]
    grad = np.zeros_like(x)
    loss = lambda y: np.real(np.sum(np.conj(cot) * y))  # noqa: E731  (sum(y*cot) when real)
    xs = x.copy()       # one copy, each element moved and put back (not two copies per element)
    for idx in np.ndindex(*x.shape):
        for step in ((1,) if x.dtype.kind != "c" else (1, 1j)):
            v = xs[idx]
            xs[idx] = v + eps * step
            up = loss(f(**{**arrays, name: xs}))
            xs[idx] = v - eps * step
            down = loss(f(**{**arrays, name: xs}))
            xs[idx] = v
            grad[idx] += (up - down) / (2 * eps) * (1 if step == 1 else 1j)
    return grad


def check_fd(expr, options=None, cot=None, **arrays):
    k = kernel(expr, **(options or {}))
    out = k(**arrays)
    cot = RNG.standard_normal(out.shape) if cot is None else cot
    grads = k.vjp(cot, **arrays)
    assert grads, expr
    for name, g in grads.items():
        ref = finite_difference(k, arrays, name, cot)
        scale = max(np.abs(ref).max(), 1e-12)
        assert np.abs(g - ref).max() / scale < 1e-6, (expr, name, g, ref)
    return k, grads


# Every differentiable feature, each once (small sizes: finite differences call the forward).
FEATURES = [
    ("C[i,k] := A[i,j] * B[j,k]", {}, dict(A=rand(3, 4), B=rand(4, 2))),
    ("y[i] := exp(x[i]) + log(p[i]) + log1p(p[i]) + expm1(x[i]) + sqrt(p[i])", {},
     dict(x=rand(4), p=rand(4, pos=True))),
    ("y[i] := sin(x[i]) * cos(x[i]) + tan(x[i]) + tanh(x[i]) + sinh(x[i]) + cosh(x[i]) "
     "+ arctan(x[i]) + sigmoid(x[i])", {}, dict(x=rand(4))),
    ("y[i] := abs(x[i]) + relu(x[i]) + max(x[i], w[i]) * min(x[i], 2.0*w[i])", {},
     dict(x=rand(6), w=rand(6))),
    ("y[i] := where(x[i] > 0, log(x[i]), x[i]**2) / w[i]", {}, dict(x=rand(6), w=rand(6, pos=True))),
    ("y[i] := x[i]**3 + x[i]**w[i] + 2.5**w[i] + x[i]**-0.5", {}, dict(x=rand(4, pos=True), w=rand(4))),
    ("y[i] := A[i,j] * (A[i,j] + x[j]) - x[j] / A[i,j]", {}, dict(A=rand(3, 3, pos=True), x=rand(3))),
    ("C[i,k] := A[i,j] * B[j,k] * (i <= k)", {}, dict(A=rand(3, 3), B=rand(3, 3))),
    ("n[i] := A[i,j]**2 |> sqrt", {}, dict(A=rand(3, 4))),
    ("n[i] := A[i,j] |> exp", {}, dict(A=rand(3, 4) * 0.3)),
    ("n[i] := A[i,j] * 0.3 |> tanh", {}, dict(A=rand(3, 4))),
    ("n[i] := A[i,j] |> cos", {}, dict(A=rand(3, 4))),
    ("n[i] := A[i,j] |> abs", {}, dict(A=rand(3, 4))),
    ("n[i] := A[i,j] * 0.2 |> sigmoid", {}, dict(A=rand(3, 4))),
    ("y[i] := s * x[i] * w[i]", {}, dict(x=rand(4), w=rand(4), s=1.7)),
    ("(max) m[i] := A[i,j] * w[j]", {}, dict(A=rand(4, 5), w=rand(5))),
    ("(min) m[i] := A[i,j,k] + w[k]", {}, dict(A=rand(3, 4, 2), w=rand(2))),
    ("y[i] := x[J[i]] * w[i]", {}, dict(x=rand(4), w=rand(6), J=np.array([0, 1, 1, 3, 0, 2]))),
    ("y[i] := x[i+k] * w[k]", {"ranges": {"i": 3}}, dict(x=rand(8), w=rand(3))),
    ("y[i] := x[clamp(i+k-1)] * w[k] + x[mod(i-k)]", {"ranges": {"i": 5}},
     dict(x=rand(5), w=rand(3))),
    # pad() positions no rewrite can make bare (stride 2, both ends padded): the gradient
    # drops the writes outside x, also beside a position the rewrite could solve
    ("y[p] := x[pad(2*p+2*j-3)] * w[j]", {"ranges": {"p": 6}}, dict(x=rand(13), w=rand(3))),
    ("y[p,r] := x[pad(2*p+2*j-3),pad(r+k-1)] * w[j,k]", {"ranges": {"p": 4, "r": 4}},
     dict(x=rand(7, 4), w=rand(3, 2))),
    ("y[i] := z[i] * conj(z[i]) * w[i] + abs(z[i]) + real(z[i] * w[i]) + imag(w[i]) * z[i]", {},
     dict(z=crand(3), w=crand(3))),
    ("C[i,k] := A[i,j] * B[j,k] |> exp", {}, dict(A=crand(2, 3) * 0.3, B=rand(3, 2) * 0.3)),
]


@pytest.mark.parametrize("expr,options,arrays", FEATURES, ids=[f[0] for f in FEATURES])
def test_vjp_matches_finite_differences(expr, options, arrays):
    check_fd(expr, options, **arrays)


def test_matmul_closed_form():
    A, B = rand(5, 4), rand(4, 3)
    dC = rand(5, 3)
    g = kernel("C[i,k] := A[i,j] * B[j,k]").vjp(dC, A=A, B=B)
    np.testing.assert_allclose(g["A"], dC @ B.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g["B"], A.T @ dC, rtol=1e-12, atol=1e-12)


def test_in_place_forms_with_ranges():
    """`=` into a larger array with ranges=: the gradient iterates exactly the forward's tuples."""
    k = kernel("y[i] = x[i+k] * w[k]", ranges={"i": range(1, 4)})
    x, w, cot = rand(8), rand(3), rand(9)

    def f(x, w):
        y = np.zeros(9)
        k(y=y, x=x, w=w)
        return y
    g = k.vjp(cot, x=x, w=w)
    for name, arr in (("x", x), ("w", w)):
        ref = finite_difference(f, dict(x=x, w=w), name, cot)
        np.testing.assert_allclose(g[name], ref, rtol=1e-6, atol=1e-9)
    g2 = kernel("y[i] -= x[i] * w[i]").vjp(cot[:8], x=x, w=rand(8))
    assert np.all(np.sign(g2["x"]) != 0)


def test_max_gradient_goes_to_first_maximal_element():
    A = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    g = kernel("(max) m[i] := A[i,j]").vjp(np.ones(2), A=A)["A"]
    np.testing.assert_array_equal(g, [[0, 1, 0, 0], [1, 0, 0, 0]])
    B = np.zeros((1, 2, 2))
    g = kernel("(min) m[i] := B[i,j,k]").vjp(np.ones(1), B=B)["B"]
    np.testing.assert_array_equal(g, [[[1, 0], [0, 0]]])
    # the same on threads, for a size that runs threaded
    big = np.round(RNG.standard_normal((300, 200)))
    g1 = kernel("(max) m[i] := A[i,j]", threads=True).vjp(np.ones(300), A=big)["A"]
    g2 = kernel("(max) m[i] := A[i,j]", threads=False).vjp(np.ones(300), A=big)["A"]
    np.testing.assert_array_equal(g1, g2)
    first = (big == big.max(1, keepdims=True)).argmax(1)
    np.testing.assert_array_equal(g1.argmax(1), first)
    assert g1.sum() == 300


def test_argmax_position_is_exact_past_two_to_the_24_tuples():
    """The argmax helper holds integer positions (a float32 one rounded positions 19999995,
    19999996 and 19999997 to one, and the gradient went to three elements); the printed
    equations, run with tullio(), give the same."""
    k = kernel("(max) m := x[i,j]")
    x = np.zeros((5000, 4000), np.float32)
    x[4999, 3997] = 1                      # position 19999997, odd: float32 cannot hold it
    g = k.vjp(np.float32(2.0), x=x)["x"]
    assert g.dtype == np.float32 and g.sum() == 2 and g[4999, 3997] == 2
    helper, grad = k.gradient_equations["x"]
    arg = tullio(helper, x=x, m=k(x=x))
    assert arg.dtype.kind == "i" and arg == 4999 * 4000 + 3997
    dx = np.zeros_like(x)
    tullio(grad, dx=dx, dm=np.float32(2.0), m_arg=arg)
    np.testing.assert_array_equal(dx, g)


def test_options_and_errors():
    A, B = rand(3, 3), rand(3, 3)
    assert set(kernel("C[i,k] := A[i,j] * B[j,k]", nograd=("B",)).vjp(np.ones((3, 3)), A=A, B=B)) == {"A"}
    with pytest.raises(GradientError, match="grad=False"):
        kernel("C[i,k] := A[i,j] * B[j,k]", grad=False).vjp(np.ones((3, 3)), A=A, B=B)
    k = kernel("C[i] *= A[i,j]")     # (gradients of (*) and *=: tests/test_grad_kinds.py)
    with pytest.raises(GradientError, match="before the statement"):
        k.vjp(np.ones(3), A=A)
    ints = np.arange(9).reshape(3, 3)
    assert set(kernel("C[i,k] := A[i,j] * B[j,k]").vjp(np.ones((3, 3)), A=ints, B=B)) == {"B"}
    with pytest.raises(GradientError, match="finaliser"):
        kernel("n[i] += A[i,j] |> exp").vjp(np.ones(3), A=A)
    J = np.array([2, 0])
    assert set(kernel("y[i] := x[J[i]]").vjp(np.ones(2), x=rand(3), J=J)) == {"x"}


def test_threaded_and_serial_gradients_agree():
    A, B = rand(60, 50), rand(50, 40)
    dC = rand(60, 40)
    expr = "C[i,k] := A[i,j] * B[j,k]"
    g1 = kernel(expr, threads=True).vjp(dC, A=A, B=B)
    g0 = kernel(expr, threads=False).vjp(dC, A=A, B=B)
    for n in g1:
        np.testing.assert_allclose(g1[n], g0[n], rtol=1e-12, atol=1e-12)
    # integers: the gradient equations themselves, run threaded and serial, agree exactly
    Ai, Bi, dCi = (RNG.integers(-9, 9, s) for s in ((60, 50), (50, 40), (60, 40)))
    for eqs in kernel(expr).gradient_equations.values():
        for e in eqs:
            name = e.split("[")[0]
            shape = {"dA": Ai.shape, "dB": Bi.shape}[name]
            outs = []
            for threads in (True, False):
                d = np.zeros(shape, np.int64)
                pool = {"dC": dCi, "A": Ai, "B": Bi}
                tullio(e, **{name: d}, **{n: pool[n] for n in kernel(e).equation.arrays},
                       threads=threads)
                outs.append(d)
            np.testing.assert_array_equal(outs[0], outs[1])
            np.testing.assert_array_equal(outs[0], dCi @ Bi.T if name == "dA" else Ai.T @ dCi)


def test_hand_written_shifted_gradient_matches_vjp():
    """The forward forms with a shifted left side, written by hand, give vjp's numbers; the
    copied Tullio line with '=' reading its own output warns."""
    x, W = rand(5, 5, 2, 2), rand(5, 5, 3, 3, 2, 2)
    k = kernel("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]")
    dout = rand(*k(x=x, W=W).shape)
    g = k.vjp(dout, x=x, W=W)
    dx = np.zeros_like(x)
    tullio("dx[s+i,t+j,c1,b] += dout[s,t,c2,b] * W[s+i,t+j,i,j,c1,c2]", dx=dx, dout=dout, W=W)
    np.testing.assert_allclose(dx, g["x"], rtol=1e-12)
    with pytest.warns(SummationWarning):
        tullio("dx[s+i,t+j,c1,b] = dx[s+i,t+j,c1,b] + dout[s,t,c2,b] * W[s+i,t+j,i,j,c1,c2]",
               dx=np.zeros_like(x), dout=dout, W=W)


def test_scalar_output_cotangent_forms():
    """A scalar output's cotangent may be a Python number, a numpy scalar or a 0-d array."""
    k = kernel("s := x[i] * w[i]")
    x, w = rand(4), rand(4)
    out = k(x=x, w=w)
    for cot in (2.0, np.float64(2), np.full_like(out, 2)):
        g = k.vjp(cot, x=x, w=w)
        np.testing.assert_allclose(g["x"], 2 * w, rtol=1e-14)
        np.testing.assert_allclose(g["w"], 2 * x, rtol=1e-14)


@pytest.mark.parametrize("blas", [True, False])
def test_contraction_gradients_through_blas(blas):
    """Gradients that are pure contractions over whole arrays (dA = dC @ B.T) run through BLAS
    unless blas=False; both give the closed form."""
    k = kernel("C[i,k] := A[i,j] * B[j,k]", blas=blas)
    A, B = rand(48, 40), rand(40, 44)               # 84480 multiply-adds: above blas.MIN_WORK
    dC = rand(48, 44)
    g = k.vjp(dC, A=A, B=B)
    np.testing.assert_allclose(g["A"], dC @ B.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g["B"], A.T @ dC, rtol=1e-12, atol=1e-12)
    assert ("through BLAS" in k.gradient_code) == blas


FUSED_CASES = [
    # local convolution: dx and dW share (p,q,i,j,c1,c2,b) and run as one loop nest (with 5
    # output channels, too few to block dW over them; with more, dW runs register-blocked on
    # its own, vjp_plan.relaid, checked in test_blocking.py)
    ("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
     dict(x=(12, 12, 4, 8), W=(12, 12, 3, 3, 4, 5)), True),
    # -= forward with a mask: the sign and the guard carry into the fused kernel
    ("out[s,t,c2,b] -= x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2] * (c1 <= c2)",
     dict(out=(10, 10, 8, 8), x=(12, 12, 4, 8), W=(12, 12, 3, 3, 4, 8)), True),
    # threads split i, which dw's left side lacks: never fused across that split
    ("y[i] := x[i,j] * w[j]", dict(x=(400, 300), w=(300,)), None),
]


@pytest.mark.parametrize("expr,shapes,expect_fused", FUSED_CASES, ids=["conv", "masked -=", "mv"])
def test_fused_gradients_match_one_by_one(expr, shapes, expect_fused):
    arrays = {n: rand(*s) for n, s in shapes.items()}
    k, one = kernel(expr, blas=False), kernel(expr, blas=False, fuse=False)
    serial = kernel(expr, blas=False, threads=False)
    out = k(**{n: a.copy() for n, a in arrays.items()})
    cot = rand(*np.shape(out))
    g = k.vjp(cot, **arrays)
    ref = one.vjp(cot, **arrays)
    g1 = serial.vjp(cot, **arrays)
    for name in ref:
        scale = np.abs(ref[name]).max()
        np.testing.assert_allclose(g[name], ref[name], rtol=1e-13, atol=1e-13 * scale)
        np.testing.assert_array_equal(g1[name], g[name])   # thread count never changes a bit
    if expect_fused is not None:
        assert ("def _tullio_fused" in k.gradient_code) == expect_fused
    assert "def _tullio_fused" not in one.gradient_code
    if ":=" in expr:            # (an in-place forward would accumulate over the FD calls)
        fd = finite_difference(k, arrays, "x", cot)
        assert np.abs(g["x"] - fd).max() <= 1e-6 * max(np.abs(fd).max(), 1e-12)


def test_a_left_side_writing_each_element_once_runs_as_a_scatter():
    """rewrite.injective: `dx[b, 2h+i] += ...` with i of at most 2 values (pooling's gradient,
    stride >= window) writes each element once; its loops run over (b, h, i) as written, not
    solved for i over every element of dx.  Three values of i overlap: the same kernel then
    runs solved (a decision per call signature, never a stale one).  Both against numpy, and
    max-pooling's vjp (which runs such a statement) against finite differences."""
    k = kernel("dx[b, 2h+i] += dy[b, h] * w[i]", threads=False)
    dy = rand(3, 5)
    for n, solved in [(2, False), (3, True), (2, False), (1, False)]:
        w, dx = rand(n), rand(3, 11)
        want = dx.copy()
        for h in range(5):
            want[:, 2 * h:2 * h + n] += dy[:, h:h + 1] * w
        k(dx=dx, dy=dy, w=w)
        np.testing.assert_allclose(dx, want, rtol=1e-12)
        assert (k.last.solved is not None) == solved
    pool = kernel("(max) y[b,h,v] := x[b,2h+i,2v+j]", ranges={"i": 2, "j": 2})
    x, cot = rand(2, 6, 4), rand(2, 3, 2)
    got = pool.vjp(cot, x=x)["x"]
    np.testing.assert_allclose(got, finite_difference(pool, {"x": x}, "x", cot), atol=1e-6)
