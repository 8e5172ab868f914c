"""Every candidate plan of blas_shift.py, not only the one the cost model picks, gives the
generated loops' result (blas=False) to rounding: each set of looped indices (shift indices
and a looped batch index), operands copied in either order, results stored step by step
(`:=`), added (`+=`) or added value by value of a shifted output index (col2im), on odd
sizes, strides, dilations and non-contiguous inputs."""
import contextlib

import numpy as np
import pytest

from tullio_py import Kernel, blas, blas_shift, kernel

R = np.random.default_rng(11)

# statement, input shapes, output shape for the in-place (gradient) statements
CASES = {      # each above blas.MIN_WORK multiply-adds
    "conv1d": ("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", {"x": (7, 9, 45), "w": (10, 9, 3)}, None),
    "conv1d_s2d2": ("y[b,o,i] := x[b,c,2i+2j] * w[o,c,j]", {"x": (6, 7, 95), "w": (12, 7, 3)},
                    None),
    "nchw": ("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]",
             {"x": (3, 6, 11, 13), "w": (7, 6, 3, 2)}, None),
    "nhwc": ("y[b,h,v,o] := x[b,h+i,v+j,c] * w[i,j,c,o]",
             {"x": (3, 11, 13, 6), "w": (2, 3, 6, 7)}, None),
    "dx": ("dx[b,c,i+j] += dy[b,o,i] * w[o,c,j]", {"dy": (7, 10, 43), "w": (10, 9, 3)},
           (7, 9, 45)),
    "dw": ("dw[o,c,j] += dy[b,o,i] * x[b,c,i+j]", {"dy": (7, 10, 43), "x": (7, 9, 45)},
           (10, 9, 3)),
    "dw_nhwc": ("dw[i,j,c,o] += dy[b,h,v,o] * x[b,h+i,v+j,c]",
                {"dy": (3, 10, 11, 7), "x": (3, 11, 13, 6)}, (2, 3, 6, 7)),
    "dx_nchw": ("dx[b,c,h+i,v+j] += dy[b,o,h,v] * w[o,c,i,j]",
                {"dy": (3, 7, 9, 12), "w": (7, 6, 3, 2)}, (3, 6, 11, 13)),
}
KERNELS = {name: (Kernel(expr, threads=1), kernel(expr, blas=False))
           for name, (expr, _, _) in CASES.items()}


def _noncontiguous(a):
    """The same values in memory reversed and strided (every other element of a bigger
    array, axes in reverse order)."""
    big = np.empty(tuple(2 * n for n in reversed(a.shape)))
    view = big[tuple(slice(None, None, 2) for _ in a.shape)].transpose()
    view[...] = a
    return view


def _gemm(name):
    """The frontend's gemm the steps go to (blas.gemm_provider), a no-op for numpy's own."""
    if name == "numpy":
        return contextlib.nullcontext()
    return blas.gemm_provider(pytest.importorskip("tullio_py.frontends.torch").torch_gemm)


@pytest.mark.parametrize("threads,gemm", [(1, "numpy"), (3, "numpy"), (1, "torch")])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_candidate_matches_the_loops(case, layout, threads, gemm):
    """... and on 3 threads, the steps of the first looped index shared between them; and
    with torch's gemm as the frontend's (storing, and adding in place into the output)."""
    expr, shapes, out_shape = CASES[case]
    k, loops = KERNELS[case]
    arrays = {n: R.standard_normal(s) for n, s in shapes.items()}
    if layout == "noncontiguous":
        arrays = {n: _noncontiguous(a) for n, a in arrays.items()}
    eq = k.equation
    start = None if out_shape is None else R.standard_normal(out_shape)
    given = {} if start is None else {eq.output: start.copy()}
    want = loops(**arrays, **given)
    want = given.get(eq.output, want)
    out = np.empty_like(want) if start is None else start
    rng = k.ranges(**arrays, **({} if start is None else {eq.output: out}))
    plans = blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype)
    assert len(plans) > 3
    looped = {p.loop for p in plans}
    assert any(n not in k._shift.shifts for S in looped for n in S), "no looped batch index"
    for p in plans:
        # a `:=` output: NaN where each element must be stored, zeros where added to
        got = out.copy() if start is not None else np.full_like(out, np.nan if p.write else 0)
        with _gemm(gemm):
            blas_shift.run(p, k._shift, arrays, got, False, p.write, threads)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=str(p.loop))
    if any(len(s.names) > 1 for s in eq.lhs.indices):
        assert any(p.scatter for p in plans), "no col2im plan"
    if start is None:
        # a `:=` statement's steps that cover their own elements store into the output
        assert any(p.write and p.loop for p in plans)
    else:
        assert not any(p.write for p in plans)


def test_transposed_copies_are_exercised():
    """Some plan copies an operand in the matrix's transposed order (the gemm reads the copy
    as a transposed view): dW of a conv1d, the im2col of x copied (c, j, i) for K = i."""
    expr, shapes, out_shape = CASES["dw"]
    k, _ = KERNELS["dw"]
    arrays = {n: R.standard_normal(s) for n, s in shapes.items()}
    out = np.zeros(out_shape)
    rng = k.ranges(**arrays, dw=out)
    plans = blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype)
    assert any(op[4] for p in plans for op in p.ops)


def test_conv1d_forward_loops_over_the_batch():
    """The cost model's choice for a conv1d large enough for BLAS: one gemm per batch element
    over its im2col copy, stored straight into the output (the copy stays in the cache; one
    im2col of the whole batch does not)."""
    k = Kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", threads=1)
    x, w = R.standard_normal((16, 32, 132)), R.standard_normal((32, 32, 5))
    got = k(x=x, w=w)
    np.testing.assert_allclose(got, KERNELS["conv1d"][1](x=x, w=w), rtol=1e-10, atol=1e-10)
    p = [p for p in k._shift.plans.values() if p is not None][-1]
    assert p.loop == ("b",) and p.write and p.direct and p.im2col


def test_threaded_forward_and_gradients():
    """A kernel on 2 threads: its conv1d forward and both gradients share the batch loop
    between threads (into its own elements; dW's into zeroed copies, summed), results equal
    to the loops'."""
    expr = CASES["conv1d"][0]
    k, loops = Kernel(expr, threads=2), KERNELS["conv1d"][1]
    x, w = R.standard_normal((16, 32, 132)), R.standard_normal((32, 32, 5))
    y = k(x=x, w=w)
    np.testing.assert_allclose(y, loops(x=x, w=w), rtol=1e-10, atol=1e-10)
    dy = R.standard_normal(y.shape)
    got, want = k.vjp(dy, x=x, w=w), loops.vjp(dy, x=x, w=w)
    for n in ("x", "w"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-10, atol=1e-10)
    plans = [p for kk in [k, *k._gradient()._kernels.values()] if kk._shift
             for p in kk._shift.plans.values() if p is not None]
    assert len(plans) == 3
    if blas_shift.blas_threads.available():
        assert {p.split for p in plans} >= {1, 2}, [(p.loop, p.split) for p in plans]
