"""Every candidate plan of blas_shift.py, not only the one the cost model picks, gives the
generated loops' result (blas=False) to rounding: each set of looped indices (shift indices
and a looped batch index), operands copied in either order, results stored step by step
(`:=`), added (`+=`) or added value by value of a shifted output index (col2im), on odd
sizes, strides, dilations and non-contiguous inputs."""
import contextlib
from dataclasses import replace

import numpy as np
import pytest

from tullio_py import Kernel, blas, blas_shift, blas_shift_cost, blas_shift_pad, jit, kernel

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


# The BLAS plans on cases sized for BLAS against plain loops (conftest.py says why).
pytestmark = pytest.mark.usefixtures("blocked_as_plain")


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
    frontend = pytest.importorskip("tullio_py.frontends.torch")
    return blas.gemm_provider(frontend.torch_gemm, frontend.torch_copy)


def _setup(k, loops, shapes, out_shape, layout):
    """Random inputs (non-contiguous views for that layout), a given output's start values
    (None for `:=`), the loops' result, the output array the plans write and the ranges."""
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
    return arrays, eq, start, want, out, rng


@pytest.mark.parametrize("threads,gemm", [(1, "numpy"), (3, "numpy"), (1, "torch"),
                                          (3, "torch")])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_candidate_matches_the_loops(case, layout, threads, gemm):
    """... and on 3 threads, the steps of the first looped index shared between them; and
    with torch's gemm and copy as the frontend's (storing, and adding in place into the
    output; the steps in order on this thread whatever the group count), the arrangements
    chosen for torch's pool of that many threads."""
    _, shapes, out_shape = CASES[case]
    k, loops = KERNELS[case]
    arrays, eq, start, want, out, rng = _setup(k, loops, shapes, out_shape, layout)
    plans = blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype,
                                  threads if gemm == "torch" else 0)
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
    _, shapes, out_shape = CASES["dw"]
    k, _ = KERNELS["dw"]
    arrays = {n: R.standard_normal(s) for n, s in shapes.items()}
    out = np.zeros(out_shape)
    rng = k.ranges(**arrays, dw=out)
    plans = blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype)
    assert any(op[4] for p in plans for op in p.ops)


def test_weight_gradient_puts_the_longer_side_on_the_left_and_sums_its_steps(monkeypatch):
    """conv1d's dW over a batch of 32 on numpy's BLAS: dy's 64 output channels on the left would
    take x's im2col as a transposed right operand, 1 + TRANS_B/64 times slower; the model puts
    x's merged (c, j), 320 rows, on the left, and the steps' (c, j, o) results, which reach dW
    (o, c, j) only through a strided pass, are summed first and added once (accumulate).
    Without the transposed operand's price it kept dy on the left."""
    k = Kernel("dw[o,c,j] += dy[b,o,i] * x[b,c,i+j]", threads=1)
    arrays = {"dy": R.standard_normal((32, 64, 256)).astype(np.float32),
              "x": R.standard_normal((32, 64, 260)).astype(np.float32)}
    out = np.zeros((64, 64, 5), np.float32)
    rng = k.ranges(**arrays, dw=out)

    def plan():
        k._shift.plans.clear()
        return k._shift.plan(arrays, rng, out.shape, out.strides, out.dtype, 1)
    p = plan()
    assert p.loop == ("b",) and p.left == 1 and p.accumulate and p.im2col, p
    with jit.thread_budget(1, 0):       # (explain plans for the budget's threads)
        said = k.explain(**arrays, dw=out.copy()).detail
    assert "summed over the steps, then added into the output once" in said, said
    monkeypatch.setattr(blas_shift_cost, "TRANS_B", 0.0)
    p0 = plan()
    assert p0.left == 0 and not p0.accumulate, p0


@pytest.mark.parametrize("expr", ["dw[o,c,j] -= 0.5 * dy[b,o,i] * x[b,c,i+j]",
                                  "dw[o,c,j] = dy[b,o,i] * x[b,c,i+j]",
                                  "dw[o,c,i,j] += dy[b,o,h,v] * x[b,c,h+i,v+j]"])
def test_accumulated_steps_match_the_loops(expr):
    """Every candidate whose steps add into one block of the output, made to sum its steps
    first (Plan.accumulate; the model asks for it on larger sizes), gives the loops' numbers:
    `-=` with a scale, `=` over old values, conv2d's dW."""
    k, loops = Kernel(expr, threads=1), kernel(expr, blas=False)
    _, shapes, out_shape = CASES["dw"] if "h" not in expr else (
        None, {"dy": (3, 7, 9, 12), "x": (3, 6, 11, 13)}, (7, 6, 3, 2))
    arrays = {n: R.standard_normal(s) for n, s in shapes.items()}
    start = R.standard_normal(out_shape)
    want = start.copy()
    loops(**arrays, dw=want)
    rng = k.ranges(**arrays, dw=start)
    plans = [replace(p, accumulate=True) for p in blas_shift.candidates(
        k._shift, arrays, rng, start.shape, start.strides, start.dtype)
        if p.loop and not p.write and not p.scatter and not p.views[2].sub]
    assert len(plans) >= 2
    for p in plans:
        got = start.copy()
        blas_shift.run(p, k._shift, arrays, got, k.equation.assign == "=", p.write)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=str(p.loop))


def test_conv1d_forward_loops_over_the_batch():
    """The cost model's choice for a conv1d large enough for BLAS: one gemm per batch element
    over its im2col copy, stored straight into the output (the copy stays in the cache; one
    im2col of the whole batch does not)."""
    k = Kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", threads=1)
    # (64 channels: with 32 the register-blocked loops are as fast, and the model picks them)
    x, w = R.standard_normal((16, 64, 132)), R.standard_normal((64, 64, 5))
    got = k(x=x, w=w)
    np.testing.assert_allclose(got, KERNELS["conv1d"][1](x=x, w=w), rtol=1e-10, atol=1e-10)
    p = [p for p in k._shift.plans.values() if p is not None][-1]
    assert p.loop == ("b",) and p.write and p.direct and p.im2col


def test_batched_gemm_writes_the_output_in_its_own_layout():
    """A conv2d NCHW forward with nothing looped: the im2col copy of x keeps the batch index
    as an axis of its own, y[b] = w @ im2col(x)[b] as one batched gemm stored straight into
    y (no product in the gemm's layout copied into y's after, on the calling thread alone),
    the arrangement for torch's pool of 2 threads; equal to the loops'."""
    _, shapes, _ = CASES["nchw"]
    k, loops = KERNELS["nchw"]
    arrays, eq, _, want, out, rng = _setup(k, loops, shapes, None, "contiguous")
    plans = blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype, 2)
    p = next(p for p in plans if p.loop == ())
    assert p.direct and p.im2col and p.mm_shape[0] == shapes["x"][0], p.mm_shape
    got = np.full_like(out, np.nan)
    with _gemm("torch"):
        blas_shift.run(p, k._shift, arrays, got, False, p.write)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_products_into_shifted_windows_are_added_on_the_frontends_pool():
    """Plans whose output view is no matmul result (dx's window at one shift: h and v not one
    axis, or the col2im of a batch of products) add each product into it through the
    frontend's copy (torch's add, on its pool), not numpy's add on the calling thread;
    equal to the loops'."""
    frontend = pytest.importorskip("tullio_py.frontends.torch")
    _, shapes, out_shape = CASES["dx_nchw"]
    k, loops = KERNELS["dx_nchw"]
    arrays, eq, start, want, out, rng = _setup(k, loops, shapes, out_shape, "contiguous")
    adding, scattered = [], []
    for p in blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype, 2):
        added = []

        def copy(dst, src, add=False):
            added.append(add)
            return frontend.torch_copy(dst, src, add)
        got = start.copy()
        with blas.gemm_provider(frontend.torch_gemm, copy):
            blas_shift.run(p, k._shift, arrays, got, False, False)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        if True in added:
            adding.append(p.loop)
        if p.scatter:                   # col2im of a batch of products, value by value
            scattered.append(True in added)
    assert len(adding) > 1, adding
    assert scattered and all(scattered), scattered


@pytest.mark.parametrize("name", ["nchw", "dx_nchw", "dw"])
def test_steps_check_the_frontends_arrays_once(name):
    """Under a frontend that says which arrays it takes (gemm_provider's `views`), every
    gemm and copy of a plan's steps is told the arrays were checked (views of arrays checked
    once per call) when the masters pass: the same bits as with every call checking its own
    arrays.  With a read-only input each call checks (and leaves the product to numpy's
    BLAS).  Every result equal to the loops'."""
    frontend = pytest.importorskip("tullio_py.frontends.torch")
    expr, shapes, out_shape = CASES[name]
    k, loops = KERNELS[name]
    arrays, eq, start, want, out, rng = _setup(k, loops, shapes, out_shape, "contiguous")
    seen = []

    def gemm(a, b, o, alpha, beta, checked=False):
        seen.append(checked)
        return frontend.torch_gemm(a, b, o, alpha, beta, checked)

    def copy(dst, src, add=False, checked=False):
        seen.append(checked)
        return frontend.torch_copy(dst, src, add, checked)
    plans = blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides, out.dtype, 2)
    assert plans
    for p in plans:
        got = {}
        for views, writeable in ((frontend.torch_views, True), (None, True),
                                 (frontend.torch_views, False)):
            ins = {n: a.copy() for n, a in arrays.items()}
            for a in ins.values():
                a.flags.writeable = writeable
            seen.clear()
            res = start.copy() if start is not None else np.zeros(out.shape)
            with blas.gemm_provider(gemm, copy, views):
                blas_shift.run(p, k._shift, ins, res, False, p.write and start is None)
            np.testing.assert_allclose(res, want, rtol=1e-10, atol=1e-10)
            assert seen and set(seen) == {views is not None and writeable}, (p.loop, seen)
            got[views is not None, writeable] = res
        np.testing.assert_array_equal(got[True, True], got[False, True])


def test_threaded_forward_and_gradients():
    """A kernel on 2 threads: its conv1d forward and both gradients share the batch loop
    between threads (into its own elements; dW's into zeroed copies, summed), results equal
    to the loops'.  (dx's blocked loops on a padded copy of dy, relayout.py, win against
    BLAS here; priced as plain loops, dx keeps its BLAS plan for this test.)"""
    expr = CASES["conv1d"][0]
    k, loops = Kernel(expr, threads=2), KERNELS["conv1d"][1]
    # (64 channels: with 32 the forward's register-blocked loops on 2 threads are as fast as
    # the gemms, and the cost model picks them)
    x, w = R.standard_normal((16, 64, 132)), R.standard_normal((64, 64, 5))
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


# pad() reads (the gather form of the printed gradients, padded forwards): statement, input
# shapes, output shape for the in-place statements (it starts non-zero: `+=` adds to it);
# each sub-range above blas.MIN_WORK multiply-adds
PAD_CASES = {
    "dx": ("dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j]", {"dy": (16, 12, 43), "w": (12, 9, 3)},
           (16, 9, 45)),
    "dx_dilated": ("dx[b,c,p] += dy[b,o,pad(p-2*j)] * w[o,c,j]",
                   {"dy": (12, 12, 91), "w": (12, 7, 3)}, (12, 7, 95)),
    "dx_nchw": ("dx[b,c,p,q] += dy[b,o,pad(p-i),pad(q-j)] * w[o,c,i,j]",
                {"dy": (8, 12, 9, 12), "w": (12, 8, 3, 2)}, (8, 8, 11, 13)),
    "dx_nhwc": ("dx[b,p,q,c] -= dy[b,pad(p-i),pad(q-j),o] * w[i,j,c,o]",
                {"dy": (8, 9, 12, 12), "w": (3, 2, 8, 12)}, (8, 11, 13, 8)),
    "same": ("y[b,o,i] := x[b,c,pad(i+j-1,1,1)] * w[o,c,j]",
             {"x": (16, 9, 45), "w": (12, 9, 3)}, None),
    "dw_strided": ("dw[o,c,j] = dy[b,o,i] * x[b,c,pad(2i+j-1,1,1)]",
                   {"dy": (16, 16, 23), "x": (16, 12, 45)}, (16, 12, 3)),
}
PAD_KERNELS = {name: (Kernel(expr, threads=1), kernel(expr, blas=False))
               for name, (expr, _, _) in PAD_CASES.items()}


@pytest.mark.parametrize("threads,gemm", [(1, "numpy"), (3, "numpy"), (1, "torch"),
                                          (3, "torch")])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("case", list(PAD_CASES))
def test_padded_reads_match_the_loops(case, layout, threads, gemm):
    """A statement reading pad(...) runs as blas_shift plans over sub-ranges where the padded
    reads fall inside their arrays (blas_shift_pad.py): every candidate plan run on every
    sub-range (as Padded.call runs them: `=` zeroes the covered elements first, a `:=`
    output starts zeroed), and the kernel's own call, give the loops' result (blas=False)."""
    _, shapes, out_shape = PAD_CASES[case]
    k, loops = PAD_KERNELS[case]
    sh = k.shift_plan
    assert isinstance(sh, blas_shift.Padded)
    arrays, eq, start, want, out, rng = _setup(k, loops, shapes, out_shape, layout)
    fixed, parts = blas_shift_pad.sub_ranges(sh.slots, [arrays[a.array].shape
                                                        for a in sh.reads], rng)
    assert fixed and len(parts) > 1
    subs = [blas_shift.candidates(sh.inner, arrays, r, out.shape, out.strides, out.dtype,
                                  threads if gemm == "torch" else 0) for r in parts]
    assert len({len(c) for c in subs}) == 1 and len(subs[0]) > 1
    for c in range(len(subs[0])):
        got = np.zeros_like(out) if start is None else start.copy()
        if eq.assign == "=":
            got[...] = 0
        with _gemm(gemm):
            for plans in subs:
                blas_shift.run(plans[c], sh.inner, arrays, got, False, False, threads)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=str(c))
    mine = {} if start is None else {eq.output: start.copy()}
    with _gemm(gemm):
        got = k(**arrays, **mine)
    np.testing.assert_allclose(mine.get(eq.output, got), want, rtol=1e-10, atol=1e-10)


def test_padded_gradient_runs_through_blas():
    """The printed input gradient of a conv1d, dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j], at a
    size where BLAS wins against plain loops: one sub-range per value of j, each a blas_shift
    plan; equal to the vjp's dx.  (Its blocked loops on a padded copy of dy, relayout.py, win
    against both here: 0.76 ms against BLAS's 1.70, one thread; priced as plain loops, the
    test keeps BLAS.)"""
    k = Kernel("dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j]", threads=1)
    conv = Kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", threads=1)
    x, w = R.standard_normal((16, 32, 132)), R.standard_normal((32, 32, 5))
    dy = R.standard_normal((16, 32, 128))
    got = k(dy=dy, w=w, dx=np.zeros_like(x))
    np.testing.assert_allclose(got, conv.vjp(dy, x=x, w=w)["x"], rtol=1e-10, atol=1e-10)
    p = [p for p in k.shift_plan.plans.values() if p is not None][-1]
    assert p.fixed == ("j",) and len(p.parts) == 5
    assert [r["p"] for r, _ in p.parts] == [range(j, j + 128) for j in range(5)]


def test_padded_reads_keep_the_loops_where_they_must():
    """A pad value other than 0 reads non-zero outside the arrays: no Padded (the loops run
    it); a sub-range too small for BLAS keeps the loops for the whole statement."""
    assert kernel(PAD_CASES["dx"][0], pad=1.5).shift_plan is None
    k, loops = PAD_KERNELS["dx"]
    dy, w = R.standard_normal((2, 3, 4)), R.standard_normal((3, 2, 3))
    got, want = k(dy=dy, w=w, dx=np.ones((2, 2, 6))), loops(dy=dy, w=w, dx=np.ones((2, 2, 6)))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    rng = k.ranges(dy=dy, w=w, dx=got)
    assert k.shift_plan.plan({"dy": dy, "w": w}, rng, got.shape, got.strides, got.dtype) is None
