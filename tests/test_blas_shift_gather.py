"""blas_shift_gather.py: a convolution's input gradient `dx[b,c,h+i,v+j] += dy * w` run as
gemms over a zero-padded im2col copy of dy (the gather form) gives the generated loops'
result (blas=False) to rounding: odd sizes, `-=` with a scale, non-contiguous inputs and
output, numpy's gemm and torch's, steps shared by threads; statements it does not take
keep blas_shift's own plans."""
import contextlib

import numpy as np
import pytest

from tullio_py import Kernel, blas, blas_shift, blas_shift_gather, kernel

R = np.random.default_rng(5)

CASES = {      # statement, input shapes, output shape
    "conv1d": ("dx[b,c,i+j] += dy[b,o,i] * w[o,c,j]", {"dy": (7, 10, 43), "w": (10, 9, 3)},
               (7, 9, 45)),
    "nchw": ("dx[b,c,h+i,v+j] += dy[b,o,h,v] * w[o,c,i,j]",
             {"dy": (3, 7, 9, 12), "w": (7, 6, 3, 2)}, (3, 6, 11, 13)),
    "nhwc": ("dx[b,h+i,v+j,c] -= dy[b,h,v,o] * w[i,j,c,o] * s",
             {"dy": (5, 9, 12, 7), "w": (3, 2, 6, 7)}, (5, 11, 13, 6)),
}
KERNELS = {name: (Kernel(expr, threads=1), kernel(expr, blas=False))
           for name, (expr, _, _) in CASES.items()}


# The BLAS plans on cases sized for BLAS against plain loops (conftest.py says why).
pytestmark = pytest.mark.usefixtures("blocked_as_plain")


def _noncontiguous(a):
    big = np.empty(tuple(2 * n for n in reversed(a.shape)))
    view = big[tuple(slice(None, None, 2) for _ in a.shape)].transpose()
    view[...] = a
    return view


def _every_other(a):
    big = np.empty((2 * a.shape[0],) + a.shape[1:])
    big[::2] = a
    return big[::2]


def _gemm(name):
    if name == "numpy":
        return contextlib.nullcontext()
    frontend = pytest.importorskip("tullio_py.frontends.torch")
    return blas.gemm_provider(frontend.torch_gemm, frontend.torch_copy)


@pytest.mark.parametrize("threads,gemm", [(1, "numpy"), (3, "numpy"), (1, "torch"),
                                          (2, "torch")])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("case", list(CASES))
def test_gather_plan_matches_the_loops(case, layout, threads, gemm):
    expr, shapes, out_shape = CASES[case]
    k, loops = KERNELS[case]
    arrays = {n: R.standard_normal(s) for n, s in shapes.items()}
    start = R.standard_normal(out_shape)
    if layout == "noncontiguous":       # (the output every other batch element of a bigger one)
        arrays = {n: _noncontiguous(a) for n, a in arrays.items()}
        start = _every_other(start)
    scalars = {"s": 0.75} if "* s" in expr else {}
    want = start.copy()
    loops(**arrays, **scalars, dx=want)
    rng = k.ranges(**arrays, **scalars, dx=start)
    p = blas_shift_gather.plan(k.equation, k._shift.reads, arrays, rng, start.shape,
                               start.strides, start.dtype, threads if gemm == "torch" else 0)
    assert p is not None and p.loop == ("b",) and p.cost > 0
    got = start.copy() if layout == "contiguous" else _every_other(start)
    with _gemm(gemm):
        blas_shift.run(p, k._shift, {**arrays, **scalars}, got, False, False, threads)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_conv1d_input_gradient_runs_as_a_gather():
    """The cost model's choice for a conv1d's input gradient large enough for BLAS (one
    thread, numpy's gemm) against plain loops: the gather plan, a few batch elements per step;
    the vjp equals the loops'.  (Its register-blocked loops on a padded copy of dy,
    relayout.py, beat that plan; priced as plain loops, the gather plan is kept for this
    test.)"""
    expr = "y[b,o,i] := x[b,c,i+j] * w[o,c,j]"
    k, loops = Kernel(expr, threads=1), kernel(expr, blas=False)
    x, w = R.standard_normal((16, 64, 132)), R.standard_normal((64, 64, 5))
    dy = R.standard_normal((16, 64, 128))
    got, want = k.vjp(dy, x=x, w=w), loops.vjp(dy, x=x, w=w)
    for n in ("x", "w"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-10, atol=1e-10)
    plans = [p for g in k._gradient()._kernels.values() if g._shift is not None
             for p in g._shift.plans.values() if p is not None]
    gathers = [p for p in plans if getattr(p, "gather", False)]
    assert len(gathers) == 1 and gathers[0].group > 1, plans


@pytest.mark.parametrize("expr", [
    "dx[b,c,i+2j] += dy[b,o,i] * w[o,c,j]",          # a dilated shift
    "dx[b,c,i+j] += dy[b,c,i] * w[c,j]",              # c read by both (depthwise)
    "dx[b,c,i+j] := dy[b,o,i] * w[o,c,j]",            # not an accumulation
    "dx[b,c,i+j] += dy[b,o,i] * w[o,c,j,b]",          # the batch read by both
])
def test_statements_the_gather_does_not_take(expr):
    k = Kernel(expr, threads=1)
    assert blas_shift_gather.form(k.equation, k._shift.reads) is None
