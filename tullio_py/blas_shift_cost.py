"""The cost model of blas_shift.py's plans: seconds for one arrangement of matmuls over
strided views, from shapes, strides and the constants below (measured by
benchmarks/blas_shift_costs.py; `--validate` times every candidate against the model).

One np.matmul gemm of (m, k) x (k, n) takes
    T_CALL + 2 m n k / PEAK * (1 + H/m + H/n + H/k)
(small dimensions waste the gemm kernel's blocking); each step of the Python loop over the
looped indices costs T_STEP.  Copies (an operand merged into a matrix, im2col-style) and the
result's trip into the output move their bytes at BW, or at BW_CACHE when one step's copy fits
in CACHE bytes (it is still in the cache when the gemm reads it: a loop over the batch index
keeps each step's im2col matrix there); an element of a strided access costs up to a cache
line (LINE bytes).  A result the gemm can write straight into the output moves nothing more;
one written through a temporary costs 2 passes over it, one added to the output 3.  A
gemm whose right operand is a transposed view (numpy's BLAS packs it more slowly) takes
1 + TRANS_B/m times longer; where the steps add into one output block the same for every
step (a weight gradient looped over the batch) in an order other than the result's, the
results are summed in a block of the result's own order and added into the output once
(`accumulates`).
"""
from __future__ import annotations

from itertools import pairwise

# Measured by benchmarks/blas_shift_costs.py --threads 1 (float32, OpenBLAS 0.3.31 SkylakeX via
# numpy 2, 2-core AVX-512 machine shared with other jobs, load average 2): PEAK 1.45e11, H 2.85,
# T_CALL 8.1e-7 from a fit of np.matmul times (median error 10%); T_STEP 2.45e-6 one step of
# the loop; BW 1.37e10 a 16 MB copy, BW_CACHE 2.4e10 a 256 KB one repeated; LOOP_RATE 6.5e9
# the generated loops (blas=False) on conv1d / conv2d (the earlier 3.4e9 was measured at load
# 8-11).  `--validate` timed the candidates of 11 conv1d / conv2d / depthwise forward and
# gradient statements (load 7-9): the model picked the fastest in all 11 (load 2-2.5, before
# CACHE was raised to the L2 size: 5 of 11, at most 1.94x off, the NHWC forward).
PEAK = 1.45e11
H = 2.9
T_CALL = 8.1e-7
T_STEP = 2.4e-6
BW = 1.4e10
BW_CACHE = 2.4e10
CACHE = 2 << 20     # bytes one step's copy may take and stay in the cache (L2 of this machine)
LINE = 64           # bytes a strided access moves at most per element (a cache line)
LOOP_RATE = 6.5e9
# The register-blocked loops (Plan.jam) per thread: the slowest of the blocked forwards in
# benchmarks/bench_limits.py (2 threads, load 1.2): LocallyConnected2d 77 GFLOP/s, the local
# convolution 106, matmul 235 -> 3.8e10 flop/s per thread.  Against the plain loops' rate the
# model sent the local convolution on one thread to a 30-step im2col plan (1.04 ms) instead
# of its blocked loops (about 0.6 ms).  Float32's rate: blas_shift halves it for float64 (a
# vector holds half as many), which keeps small float64 convolutions (tests/test_blas_shift.py's
# conv2d, 1.8 M multiply-adds) on BLAS, as measured (BLAS 0.27 ms, blocked loops 0.2-0.4 ms).
# Measured again on an AMD Zen 4 (2 cores, AVX-512, load 0.4-1.3), where this model's PEAK is
# 1.6x the gemm fit (9.0e10) and torch's MKL gemm runs at 4.7e10-6.7e10 flop/s on one thread,
# 3.1e10-5.3e10 per thread on two: the blocked loops, with a short reduction kept rolled
# inside a long one (schedule.plan), beat both on every convolution of bench_layers at one
# thread (conv1d forward 3.1 against BLAS's 4.7-5.3 ms, conv2d NCHW 6.9-7.7 against 9.4-9.8,
# NHWC 6.0-7.0 against 7.5-8.7; conv1d's input gradient on a padded copy, relayout.py, 3.7-4.6
# against 6.0-6.8) and tie on conv2d's input gradients: in this model's units 1.2e11.  (On the
# Intel machine where 3.8e10 was measured, MKL's sgemm ran at 275 GFLOP/s on 2 threads: the
# rate of the loops against the gemm's is the machine's, and this constant is this one's.)
BLOCKED_RATE = 1.2e11
# BLAS must beat the loops by this factor: measured times of many small gemms run above the
# model's (a depthwise conv, gemms of 1x5x8192, modelled 1.5 ms, took 7 ms).
MARGIN = 2.0
# A step through a frontend's gemm and copy on its own pool (blas.gemm_provider: torch's),
# per call: torch_gemm on 4x4 matrices 10 us (2-d) to 18 us (batched), torch_copy 5 us, against
# numpy's 0.7 and 0.3 us (2 threads, load 1.5).  One call takes a whole batch of products.
T_POOL = 1.2e-5
# ... and on several threads each call is a parallel region whose threads all must get a
# CPU: on this shared 2-core machine one region of torch's pool took ~20 us idle, 10 ms at
# load 5 (32 torch.addmm calls of 64x64x256: 380 ms), and the plans of many calls ran 10-40x
# slower than those of a few (conv1d, load 5-7: the forward and gradients 1470 ms against
# 71 ms, torch's own 118 ms); an expected wait per region keeps the calls few (a plan of a
# few batched gemms against one im2col and gemm: both kept, 32 steps of small ones not).
# On the idle machine (load 1), bench_layers' conv1d / conv2d NCHW / NHWC forward+backward at
# 2 threads, two runs each: 3e-4: 9.4-9.2 / 18.2-19.5 / 17.4-20.4 ms; 1e-4: 7.3-8.2 /
# 17.9-18.5 / 16.5-17.1 ms; 0: 8.0-8.1 / 15.2-15.9 / 16.1-16.5 ms: the middle value.
T_REGION = 1e-4
# A gemm of m rows whose right operand is a transposed view takes 1 + TRANS_B/m times the
# time of the same product in C order (benchmarks/blas_shift_costs.py `trans_b`, numpy's
# OpenBLAS 0.3.31 on an AMD Zen 5, 1 thread, load 0.2: 22.5; 1.37x at m=64, 1.08x at m=288).
# torch's MKL gemm showed no such difference (the pool's gemms are not charged it).  Without
# it a conv2d NCHW's dW put its 64 output channels on the left (NT, 4.5 ms of gemm) rather
# than its 288 merged input positions (2.9-3.4 ms).
TRANS_B = 22.5
GRAIN = 32768       # elements below which torch's elementwise ops run on the calling thread


def prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def c_order(shape) -> list:
    """C-order strides of `shape` in elements."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


def chain(labels, size, stride) -> bool:
    """Whether axes `labels` (outer to inner) merge into one axis without a copy."""
    labels = [n for n in labels if size[n] != 1]
    return all(stride[a] == stride[b] * size[b] for a, b in pairwise(labels))


def blasable(outer, inner, stride, itemsize) -> bool:
    """A matrix whose rows or columns are contiguous (gemm takes it without a copy)."""
    return ((not inner or abs(stride[inner[-1]]) == itemsize)
            or (not outer or abs(stride[outer[-1]]) == itemsize))


def merges(free, size, stride, out_stride=None):
    """Candidate matrix dimensions from an operand's free indices (given outer to inner in
    the output): the innermost run that merges as a view of the operand, all of them (a
    copy) in the output's order or the operand's, or the innermost run that merges as a
    view of the output (`out_stride`; copied, the others batch axes: the gemm's result is
    then the output's own layout, a conv2d NCHW's y[b] = w @ im2col(x)[b] over the batch)."""
    if not free:
        return [[]]
    own = sorted(free, key=lambda n: -abs(stride[n]))
    k = len(own) - 1
    while k > 0 and chain(own[k - 1:k + 1], size, stride):
        k -= 1
    tail = len(free) - 1
    while out_stride is not None and tail > 0 and chain(free[tail - 1:tail + 1], size,
                                                        out_stride):
        tail -= 1
    out = []
    for c in (own[k:], list(free), own, list(free[tail:])):
        if c not in out:
            out.append(c)
    return out


def cost(S, labels, left, kk, ma, nb, batch, free, lo, size, strides, itemsize,
         write=False, spans=None, adds=1, pool=0, slow=1.0) -> float:
    """Seconds the model gives one arrangement; `write`: each step's result may be stored
    into the output (no two steps write the same element) rather than added to it; `spans`:
    elements of each read one step touches (fewer than its view's when axes overlap);
    `adds`: np.add calls that take one step's result into the output (col2im); `pool`: the
    threads of a frontend's pool the gemms and copies run on (0: numpy's), which calls a
    step's batch of gemms at once (T_POOL per call), spreads its work over its threads and
    adds the result into the output in place where the output's view is a matmul result;
    `slow`: the pool's gemm time over this model's (blas.provider_slowdown)."""
    right = 1 - left
    moved = 0.0
    calls_made, regions = 1, 1
    trans_b = False     # the right operand reaches the gemm as a transposed view
    for i, mine, first in ((left, ma, True), (right, nb, False)):
        st = strides[i]
        views = chain(mine, size, st) and chain(kk, size, st)      # else reshape copies
        matrix = (blasable(mine, kk, st, itemsize) if first else
                  blasable(kk, mine, st, itemsize))                  # else copied for gemm
        groups = (mine, kk) if first else (kk, mine)
        if not first:
            trans_b = (flip_copy(labels[i], groups, size, st, itemsize)
                       if not (views and matrix) else
                       bool(mine) and abs(st[mine[-1]]) != itemsize)
        if not (views and matrix):
            moved += copy_time(labels[i], groups, size, st, itemsize,
                               spans[i] if spans else None)
            calls_made += 1
            # (torch copies fewer than GRAIN elements on the calling thread)
            regions += prod(size[x] for x in labels[i]) >= GRAIN
    ga = [n for n in free[left] if n not in ma]
    gb = [n for n in free[right] if n not in nb]
    res = batch + ga + gb + ma + nb
    so = strides[2]
    direct = write and chain(ma, size, so) and chain(nb, size, so) and blasable(
        ma, nb, so, itemsize)
    if pool:    # the pool's gemm also adds in place into an output of one block (else it
        # adds a new block's product: one more pass and region, frontends/torch.torch_gemm)
        gg = batch + ga + gb
        gemm_ok = adds == 1 and chain(ma, size, so) and chain(nb, size, so) and \
            blasable(ma, nb, so, itemsize)
        direct = gemm_ok and (chain(gg + ma + nb, size, so) or chain(gg + nb + ma, size, so))
        if gemm_ok and not direct:
            moved += 3 * copy_bytes(lo, res, size, so, itemsize) / BW
            regions += 1
            direct = True
    alone = 0.0         # numpy's passes on the calling thread alone (the pool's own share)
    once = 0.0          # the summed results' one trip into the output (`accumulates`)
    if not direct:      # the product through a new block, stored or added into the output
        nbytes = prod(size[x] for x in res) * itemsize
        passes = (2 if write else 3) * copy_bytes(lo, res, size, so, itemsize)
        speed = BW_CACHE if nbytes <= CACHE else BW
        if pool and adds == 1:      # the pool's copy or add (frontends/torch.torch_copy)
            moved += passes / BW
            regions += 1
            calls_made += 1
        elif accumulates(S, lo, res, size, so, itemsize, write, adds, pool):
            alone, once = 3 * nbytes / speed, passes / speed
        else:
            alone = passes / speed
    m, n, k = (prod(size[x] for x in g) for g in (ma, nb, kk))
    calls = prod(size[x] for x in batch + ga + gb)
    gemm = 2.0 * m * n * k / PEAK * (1 + H / m + H / n + H / k +
                                      (TRANS_B / m if trans_b and not pool else 0))
    if pool:
        gemm *= slow
        waits = regions * T_REGION if pool > 1 else 0
        return prod(size[x] for x in S) * (adds * T_STEP + calls_made * T_POOL + waits + alone
                                           + (calls * (T_CALL + gemm) + moved) / pool)
    return prod(size[x] for x in S) * (adds * T_STEP + calls * (T_CALL + gemm) + moved + alone) \
        + once


def accumulates(S, lo, res, size, so, itemsize, write, adds, pool) -> bool:
    """Whether the steps' results are summed in a block of the result's order and added into
    the output once: numpy's steps (no pool) that add (not `write`, no col2im) into one output
    block, the same at every step (no looped index names an output axis), which the result
    reaches only through a strided pass.  conv1d's dW[o,c,j] with x's merged (c, j) on the
    left: 32 steps of a (320, 64) result added into (64, 320) each, or once."""
    steps = prod(size[x] for x in S)
    return (not pool and not write and adds == 1 and steps > 1 and not any(x in so for x in S)
            and copy_bytes(lo, res, size, so, itemsize) >
            prod(size[x] for x in res) * itemsize * 1.5)


def copy_time(labels, groups, size, stride, itemsize, span=None) -> float:
    """Seconds of one step's copy of a view (axes `labels`) into a matrix whose two
    dimensions merge the axes `groups`, in the cheaper of its two orders: the source's
    traffic (each element of the array once per step: `span` of them) from memory, the copy
    written at BW_CACHE when it fits in the cache."""
    n = prod(size[x] for x in labels)
    a, b = groups
    src = min(copy_bytes(labels, a + b, size, stride, itemsize),
              copy_bytes(labels, b + a, size, stride, itemsize))
    if span is not None and span < n:
        src *= span / n
    dest = n * itemsize
    return src / BW + dest / (BW_CACHE if dest <= CACHE else BW)


def flip_copy(labels, groups, size, stride, itemsize) -> bool:
    """Whether the copy of a matrix whose dimensions merge axes `groups` goes faster in the
    transposed order."""
    a, b = groups
    return copy_bytes(labels, b + a, size, stride, itemsize) < \
        copy_bytes(labels, a + b, size, stride, itemsize)


def _at_speed(nbytes: float, footprint: float) -> float:
    """Seconds to move `nbytes` whose result takes `footprint` bytes: from the cache when it
    fits there."""
    return nbytes / (BW_CACHE if footprint <= CACHE else BW)


def copy_bytes(labels, order, size, stride, itemsize) -> float:
    """Bytes of memory traffic of a pass over a view (axes `labels`) in the axis order
    `order`: its contiguous runs plus a cache line per run, or a cache line per element
    (at most) when the innermost axis is strided."""
    run, prev = 1, None
    for x in reversed(order):
        if size[x] == 1:
            continue
        if prev is None and abs(stride[x]) != itemsize:
            return prod(size[y] for y in labels) * min(abs(stride[x]), LINE)
        if prev is not None and stride[x] != stride[prev] * size[prev]:
            break
        run, prev = run * size[x], x
    return prod(size[y] for y in labels) / run * (run * itemsize + LINE)
