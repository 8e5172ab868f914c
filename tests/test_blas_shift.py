"""Shifted contractions through BLAS (blas_shift.py): every decomposition agrees with the
generated loops (blas=False) to rounding, forward and gradients, and the plan is a function of
the call signature."""
import numpy as np
import pytest

from tullio_py import Kernel, blas_shift, blas_shift_cost, jit, kernel
from tullio_py.frontends import numpy as numpy_frontend

R = np.random.default_rng(7)
BLOCKED_RATE = blas_shift_cost.BLOCKED_RATE     # the model's, before blocked_as_plain


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    """The cost model's choices checked here are its choices for one thread: the thread count
    blas_shift plans for (the machine's for every call, whatever its `threads`, so that the
    thread count changes no bit of a result) is pinned to 1."""
    monkeypatch.setattr(numpy_frontend, "shift_groups", lambda: 1)


# The BLAS decompositions on cases sized for BLAS against plain loops (conftest.py says why).
pytestmark = pytest.mark.usefixtures("blocked_as_plain")

# (statement, shapes of the inputs, whether the cost model should pick BLAS): each large
# enough (about a million multiply-adds) that BLAS clearly wins where it applies.
CASES = {
    "conv1d": ("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", {"x": (6, 16, 130), "w": (24, 16, 5)}, 1),
    "conv1d_nlc": ("y[b,i,o] := x[b,i+j,c] * w[o,c,j]", {"x": (6, 130, 16), "w": (24, 16, 5)}, 1),
    "stride2": ("y[b,o,i] := x[b,c,2i+j] * w[o,c,j]", {"x": (6, 16, 259), "w": (24, 16, 5)}, 1),
    "dilation2": ("y[b,o,i] := x[b,c,i+2j] * w[o,c,j]", {"x": (6, 16, 138), "w": (24, 16, 5)}, 1),
    "conv2d_nchw": ("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]",
                    {"x": (4, 8, 21, 23), "w": (16, 8, 3, 3)}, 1),
    "conv2d_nhwc": ("y[b,h,v,o] := x[b,h+i,v+j,c] * w[i,j,c,o]",
                    {"x": (4, 21, 23, 8), "w": (3, 3, 8, 16)}, 1),
    # no index is contracted between the reads: an elementwise product, not a BLAS problem
    "depthwise": ("y[b,c,i] := x[b,c,i+j] * w[c,j]", {"x": (9, 33, 301), "w": (33, 7)}, 0),
    "full_conv": ("y[b,o,i+j] := x[b,c,i] * w[o,c,j]", {"x": (6, 16, 126), "w": (24, 16, 5)}, 1),
    "bmm_shift": ("y[b,i,k] := A[b,i,j+1] * B[b,j,k]", {"A": (8, 64, 65), "B": (8, 64, 64)}, 1),
    "scaled": ("y[b,o,i] := 0.5 * x[b,c,i+j] * w[o,c,j] * alpha",
               {"x": (6, 16, 130), "w": (24, 16, 5)}, 1),
    "scalar_out": ("s := x[c,i+j] * w[c,j]", {"x": (64, 2000), "w": (64, 8)}, 1),
}


def _arrays(shapes, dtype=np.float64):
    return {n: R.standard_normal(s).astype(dtype) for n, s in shapes.items()}


def _plan(k: Kernel):
    plans = [p for p in k._shift.plans.values() if p is not None]
    return plans[-1] if plans else None


def _tol(dtype):
    return {"rtol": 2e-4, "atol": 2e-4} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_loops(case, monkeypatch):
    expr, shapes, blas = CASES[case]
    if not blas:        # (the loops' own rate: a case that is no BLAS problem stays loops)
        monkeypatch.setattr(blas_shift_cost, "BLOCKED_RATE", BLOCKED_RATE)
    arrays = _arrays(shapes)
    if "alpha" in expr:
        arrays["alpha"] = 1.7
    k, loops = Kernel(expr, threads=1), kernel(expr, blas=False)
    got, want = k(**arrays), loops(**arrays)
    assert (_plan(k) is not None) == bool(blas), "the cost model's choice changed"
    assert loops._shift is None
    np.testing.assert_allclose(got, want, **_tol(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_layouts_and_dtypes(layout, dtype):
    expr, shapes, _ = CASES["conv1d"]
    arrays = _arrays(shapes, dtype)
    if layout == "transposed":       # same values, memory in (i, c, b) order
        arrays["x"] = np.ascontiguousarray(arrays["x"].transpose(2, 1, 0)).transpose(2, 1, 0)
    elif layout == "sliced":         # every other sample along i and a channel window
        big = R.standard_normal((6, 19, 260)).astype(dtype)
        arrays["x"] = big[:, 2:18, ::2]
    k, loops = Kernel(expr, threads=1), kernel(expr, blas=False)
    got = k(**arrays)
    assert _plan(k) is not None
    np.testing.assert_allclose(got, loops(**arrays), **_tol(dtype))
    assert got.dtype == dtype


@pytest.mark.parametrize("assign", ["=", "+=", "-="])
def test_in_place(assign):
    """`=` overwrites only the covered elements (out is longer than the valid range), `+=`
    and `-=` accumulate onto the old contents."""
    expr = f"y[b,o,i] {assign} x[b,c,i+j] * w[o,c,j]"
    arrays = _arrays(CASES["conv1d"][1])
    start = R.standard_normal((6, 24, 130))
    k, loops = Kernel(expr, threads=1), kernel(expr, blas=False)
    got, want = start.copy(), start.copy()
    k(y=got, **arrays)
    loops(y=want, **arrays)
    assert _plan(k) is not None
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    if assign == "=":
        np.testing.assert_array_equal(got[:, :, 126:], start[:, :, 126:])


def test_shared_memory_falls_back():
    """An output that shares memory with an input runs the loops (no plan is executed)."""
    base = R.standard_normal((6, 24, 140))
    x, y = base[:, :16, :], base[:, :, :130]
    w = R.standard_normal((24, 16, 5))
    k = Kernel("y[b,o,i] += x[b,c,i+j] * w[o,c,j]", threads=1)
    assert k._shift.call({"x": x, "w": w}, k.ranges(y=y, x=x, w=w), y, y.dtype) is None


@pytest.mark.parametrize("case", ["conv1d", "stride2", "dilation2", "conv2d_nchw", "full_conv"])
def test_gradients_match_loops(case):
    expr, shapes, _ = CASES[case]
    arrays = _arrays(shapes)
    k, loops = Kernel(expr, threads=1), kernel(expr, blas=False)
    y = k(**arrays)
    dy = R.standard_normal(y.shape)
    got, want = k.vjp(dy, **arrays), loops.vjp(dy, **arrays)
    for name in arrays:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-9)
    used = [gk for gk in k._gradient()._kernels.values() if gk._shift and _plan(gk)]
    assert len(used) == 2, "both gradient statements should run through BLAS"
    assert "BLAS" in k.gradient_code


def test_plan_is_a_function_of_the_signature():
    expr, shapes, _ = CASES["conv2d_nchw"]
    arrays = _arrays(shapes)
    a, b = Kernel(expr, threads=1), Kernel(expr, threads=1)
    a(**arrays)
    a(**_arrays(shapes))
    b(**arrays)
    assert len(a._shift.plans) == 1 and _plan(a) == _plan(b)
    assert _plan(a) is not _plan(b)
    bigger = _arrays({"x": (4, 8, 33, 23), "w": (16, 8, 3, 3)})
    a(**bigger)
    assert len(a._shift.plans) == 2


def test_not_dispatched():
    """Statements outside the rule keep the loops: functions, masks, clamp, pads with a pad
    value other than 0, one read, max."""
    for expr in ["y[i] := exp(x[i+j]) * w[j]", "y[i] := x[i+j] * w[j] * (i < 3)",
                 "y[i] := x[clamp(i+j-1)] * w[j]", "y[i] := x[i+j]",
                 "(max) y[i] := x[i+j] * w[j]", "y[i] *= x[i+j] * w[j]"]:
        assert blas_shift.shifted(kernel(expr).equation) is None, expr
    padded = kernel("y[i] := x[pad(i+j-1, 1, 1)] * w[j]").equation
    assert blas_shift.shifted(padded, 1.5) is None
    assert isinstance(blas_shift.shifted(padded), blas_shift.Padded)
    assert kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", blas=False)._shift is None


def test_small_calls_keep_the_loops():
    k = Kernel("y[i] := x[i+j] * w[j]", threads=1)
    x, w = R.standard_normal(40), R.standard_normal(3)
    np.testing.assert_allclose(k(x=x, w=w), np.convolve(x, w[::-1], "valid"))
    assert _plan(k) is None


def _equals_torch(torch, y, ref, leaves):
    """y equals torch's ref, and so do their gradients for `leaves` for one random cotangent."""
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(got, want)


def test_torch_conv1d_forward_and_backward():
    torch = pytest.importorskip("torch")
    expr, shapes, _ = CASES["conv1d"]
    x = torch.randn(*shapes["x"], dtype=torch.float64, requires_grad=True)
    w = torch.randn(*shapes["w"], dtype=torch.float64, requires_grad=True)
    k = kernel(expr)
    _equals_torch(torch, k(x=x, w=w), torch.nn.functional.conv1d(x, w), (x, w))
    assert _plan(k) is not None


def test_torch_padded_conv1d_forward_and_backward():
    """A conv1d with zero padding 2 written with pad(): its forward and the gradient of w read
    x at pad(...), both through blas_shift_pad (torch's gemm under the torch frontend); equal
    to torch's conv1d(padding=2) and its gradients."""
    torch = pytest.importorskip("torch")
    x = torch.randn(16, 32, 132, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, 32, 5, dtype=torch.float64, requires_grad=True)
    k = kernel("y[b,o,i] := x[b,c,pad(i+j-2,2,2)] * w[o,c,j]")
    _equals_torch(torch, k(x=x, w=w), torch.nn.functional.conv1d(x, w, padding=2), (x, w))
    assert isinstance(k.shift_plan, blas_shift.Padded)
    assert any(p is not None for p in k.shift_plan.plans.values())


def test_explain_names_the_path_and_counts_the_work():
    expr, shapes, _ = CASES["conv1d"]
    arrays = _arrays(shapes)
    tuples = 6 * 24 * 126 * 16 * 5
    e = Kernel(expr, threads=1).explain(**arrays)
    assert e.path == "blas_shift" and e.flops == 2 * tuples
    assert e.bytes == sum(a.nbytes for a in arrays.values()) + 6 * 24 * 126 * 8
    assert e.seconds > 0 and e.peak_flops > 0 and e.bandwidth > 0 and e.fraction > 0
    loops = kernel(expr, blas=False).explain(**arrays)
    assert loops.path == "loops" and "order" in loops.detail and loops.flops == e.flops
    assert "blas_shift" in str(e)
    if "parallel" in loops.detail:          # the pool its threads belong to (threads.pool)
        assert jit.pool() in loops.threads and jit.pool().startswith("on ")


def test_complex_and_diagonal_output_with_pad():
    """Complex operands; a diagonal left-hand side (`y[o,i,i]`) writes only the diagonal and
    leaves the pad value elsewhere, as the loops do."""
    expr, shapes, _ = CASES["conv1d"]
    arrays = {n: (R.standard_normal(s) + 1j * R.standard_normal(s)) for n, s in shapes.items()}
    k = Kernel(expr, threads=1)
    np.testing.assert_allclose(k(**arrays), kernel(expr, blas=False)(**arrays), rtol=1e-10)
    assert _plan(k) is not None
    diag = "y[o,i,i] := x[c,i] * w[o,c]"
    # (a reduction of 512: BLAS clearly beats the blocked loops, which win at 64)
    x, w = R.standard_normal((512, 128)), R.standard_normal((64, 512))
    k = Kernel(diag, pad=-1.0, threads=1)
    got = k(x=x, w=w)
    np.testing.assert_allclose(got, kernel(diag, pad=-1.0, blas=False)(x=x, w=w), rtol=1e-10)
    assert _plan(k) is not None and (got == -1.0).sum() == 64 * 128 * 127


@pytest.mark.parametrize("case", ["conv1d", "full_conv"])
def test_new_output_statement_into_a_given_array(case):
    """run_with_ranges (dask blocks, gradients) hands a `:=` statement an output array, which
    may hold garbage: the covered elements are overwritten, as the loops do."""
    expr, shapes, _ = CASES[case]
    arrays = _arrays(shapes)
    k = Kernel(expr, threads=1)
    want = kernel(expr, blas=False)(**arrays)
    rng = k.ranges(**arrays)
    out = np.full(want.shape, np.nan)
    assert k.run_with_ranges(arrays, rng, out, {}) is None, "should run through BLAS"
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)


def test_pure_contraction_into_a_given_array():
    """The same for blas.py's whole-array contractions."""
    k = Kernel("C[i,k] := A[i,j] * B[j,k]")
    A, B = R.standard_normal((64, 64)), R.standard_normal((64, 64))
    out = np.full((64, 64), np.nan)
    assert k.run_with_ranges({"A": A, "B": B}, k.ranges(A=A, B=B), out, {}) is None
    np.testing.assert_allclose(out, A @ B, rtol=1e-12)


def test_register_blocked_loops_are_weighed_at_their_own_rate(monkeypatch):
    """A statement that has both a BLAS-over-views plan and register-blocked loops: the cost
    model weighs the loops at the blocked rate, so on one thread the local convolution keeps
    its blocked loops (at the plain-loop rate it went to a 30-step im2col plan, 1.7x slower).
    The same signature asked with plain loops still gets the BLAS plan."""
    monkeypatch.setattr(blas_shift_cost, "BLOCKED_RATE", BLOCKED_RATE)
    expr = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"
    x = R.standard_normal((32, 32, 8, 16)).astype(np.float32)
    W = R.standard_normal((32, 32, 3, 3, 8, 16)).astype(np.float32)
    arrays = {"x": x, "W": W}
    k = Kernel(expr, threads=1)
    rng = k.ranges(**arrays)
    shape = (30, 30, 16, 16)
    strides = np.empty(shape, np.float32).strides
    plain = Kernel(expr, threads=1).shift_plan.plan(arrays, rng, shape, strides,
                                                    np.dtype(np.float32), 1, lambda: False)
    assert plain is not None                      # the plain-loop rate loses to BLAS
    assert k.shift_plan.plan(arrays, rng, shape, strides, np.dtype(np.float32), 1,
                             lambda: True) is None
    e = k.explain(**arrays)
    assert e.path == "loops" and "register-blocked" in e.detail
    np.testing.assert_allclose(k(**arrays), kernel(expr, blas=False)(**arrays), rtol=1e-4,
                               atol=1e-4)


def test_blas_needs_no_margin_over_blocked_loops(monkeypatch):
    """Against register-blocked loops BLAS needs only to be cheaper in the model (their rate is
    measured on them), not MARGIN times cheaper as against plain loops.  With both rates set so
    that the loops take 1.5x the model's time of the best BLAS plan, a conv1d on 2 threads
    (32x64x260, 64 outputs, width 5) keeps its BLAS plan when its loops are blocked and runs
    its loops when they are plain."""
    expr = "y[b,o,i] := x[b,c,i+j] * w[o,c,j]"
    arrays = {"x": R.standard_normal((32, 64, 260)).astype(np.float32),
              "w": R.standard_normal((64, 64, 5)).astype(np.float32)}
    shape = (32, 64, 256)
    strides = np.empty(shape, np.float32).strides

    def plan(blocked):
        k = Kernel(expr, threads=2)         # (a new kernel: plans are kept per signature)
        return k.shift_plan.plan(arrays, k.ranges(**arrays), shape, strides,
                                 np.dtype(np.float32), 2, lambda: blocked)
    monkeypatch.setattr(blas_shift_cost, "BLOCKED_RATE", 1.0)       # BLAS always wins
    best = plan(True)
    assert best is not None
    work = 32 * 64 * 256 * 64 * 5
    rate = 2.0 * work / (2 * 1.5 * best.cost)       # the loops on 2 threads: 1.5x its cost
    monkeypatch.setattr(blas_shift_cost, "BLOCKED_RATE", rate)
    monkeypatch.setattr(blas_shift_cost, "LOOP_RATE", rate)
    assert blas_shift_cost.MARGIN > 1.5
    assert plan(True) == best
    assert plan(False) is None
