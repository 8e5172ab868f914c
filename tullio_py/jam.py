"""Register blocking of the row form: whether a nest blocks (`jam_choice`), which left index
it jams (`jam_last`), whether a split loop may stay inside short left loops to be the jammed
one (`in_place`), and the work its tiles waste (`tile_waste`).  schedule.plan asks these;
codegen/blocked.py renders the blocked nest.
"""
from __future__ import annotations

import math

import numpy as np

from .guards import factor_reads
from .ir import Equation

JAM = 4          # output rows a register-blocked row form computes at once (Plan.jam)
JAM_LANES = (32, 16)   # elements of the contiguous index per accumulator tile (the first that fits)
JAM_WIDE = 8     # the same with 512-bit vectors (32 registers): 8 rows of 2 vectors each
JAM_OUTER = 64   # most iterations of left loops outside a jammed split loop (in_place)


def jam_choice(eq: Equation, loops: tuple, ranges: dict, guards, out_dtype: str,
               vector_bytes: int = 32) -> tuple:
    """Register blocking of a row-form sum (codegen/blocked.py): the left loop just outside
    the reductions is unrolled by JAM and jammed into the row loop, and each (JAM x lanes)
    tile of the output is summed in a local accumulator tile across the whole reduction, then
    stored once.  A streamed read that does not depend on the jammed index (B[j,k] of a matmul,
    the input x of a local convolution) is then loaded once for JAM sums instead of once per
    output row, and the output is not re-read and re-written at every reduction step.

    Rule: a `+` reduction assigned or accumulated (`:=`, `=`, `+=`, `-=`) without reading its
    own output, a jammed index with at least JAM values and a row of at least 16 (lanes 32,
    else 16), no guard on either index.  512 float32 matmul with blas=False, one thread:
    10.2 -> 3.2 ms (numpy 1.5 ms).  Where every read of the row also depends on the jammed
    index (a depthwise convolution y[b,c,i] := x[b,c,i+j] * w[c,j]: nothing is loaded once
    for several sums) the tile still keeps each sum in registers across the reduction, where
    the plain row form loads and stores the output row at every reduction step: that
    statement at 32x64x256 float32, width 5, 2 threads, 1.13 -> 0.17 ms.

    With 512-bit vectors (Plan.wide) the tile is JAM_WIDE rows (JAM when fewer) of two
    vectors (32 float32, 16 float64) or one: 16 accumulators of the 32 registers, loaded
    with 8 broadcasts and 2 loads per step.  512 float32 matmul, one thread, CPU time:
    3.4 -> 1.8 ms, numpy 1.6 ms (4x32 in 512-bit: 3.0 ms, 8 accumulators are too few to
    hide the latency; 12x32 spills)."""
    left = [k for k, l in enumerate(loops[:-1]) if not l.reduction]
    kind = np.dtype(out_dtype).kind
    if (not left or eq.reducer != "+" or eq.assign == "*=" or kind not in "fciu"
            or any(a.array == eq.output for a in eq.accesses())):
        return ()
    v, r = loops[left[-1]].index, loops[-1].index
    if left[-1] != len(left) - 1 or len(ranges[v]) < JAM:
        return ()
    factor, options = JAM, JAM_LANES
    if vector_bytes >= 64:          # JAM_LANES counts float32: the same bytes of the dtype
        factor = JAM_WIDE if len(ranges[v]) >= JAM_WIDE else JAM
        options = tuple(n * 4 // np.dtype(out_dtype).itemsize for n in JAM_LANES)
    lanes = next((n for n in options if len(ranges[r]) >= n), 0)
    if not lanes or any({v, r} & set(g.expr.names) for g in guards):
        return ()
    return (v, factor, lanes)



def in_place(eq: Equation, order: list, k: int, parallel: str, ranges: dict, guards,
             out_dtype: str, vector_bytes: int, loops: tuple) -> bool:
    """Whether the split loop `parallel` stays where it is in `order` (the row form's loop
    order; `k` left indices before the row, so the jam candidate is order[k - 1]; `loops`:
    the Loops of `order` with `parallel` split), inside the other left loops, rather than
    moving outermost: where it is the index the row form jams (its blocks then run in
    parallel: codegen/blocked.py's prange over them) and the loops outside it run at most
    JAM_OUTER times (each a parallel region of its own).  Moved outermost, the jammed index
    would be another, shorter one, and the nest would not block at all.  A convolution's
    weight gradient with the channel in the lanes, dW'[i,j,o,c] += dy[b,o,p,q] *
    x'[b,p+i,q+j,c] (conv2d NCHW 16x32x34x34, 64 outputs, 3x3; o split): i and j, 3 values
    each, outside; o jammed."""
    if k < 1 or order[k - 1] != parallel or \
            math.prod(len(ranges[n]) for n in order[:k - 1]) > JAM_OUTER:
        return False
    return bool(jam_choice(eq, loops, ranges, guards, out_dtype, vector_bytes))



def tile_waste(plan, ranges: dict) -> float:
    """A blocked plan's work over the statement's (>= 1; 1.0 unblocked): last tiles overlap
    (codegen/blocked.py), so a row of 34 in tiles of 32 sums 64 elements: 1.88."""
    out = 1.0
    for n, size in ((plan.jam[0], plan.jam[1]), (plan.loops[-1].index, plan.jam[2])) \
            if plan.jam else ():
        out *= -(-max(len(ranges[n]), 1) // size) * size / max(len(ranges[n]), 1)
    return out



def jam_last(eq: Equation, left: list, row: str, ranges: dict) -> list:
    """The left indices of a row-form nest (outer to inner, the row excluded), the one to be
    jammed (jam_choice: the last) chosen so that the fewest reads along the row depend on it:
    a read of the row that the jammed index selects is loaded once per jammed value (`factor`
    vector loads per reduction step), one it does not select once for all of them.  Ties keep
    the given order.  conv2d NCHW y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]: h (x depends on
    it: 8 vector loads and one broadcast of w per step) gives way to o (one vector load of x
    and 8 broadcasts of w)."""
    rows = [{n for s in a.indices for n in s.names} for a in factor_reads(eq.rhs)]
    rows = [names for names in rows if row in names]

    def selected(n):            # the row's reads that n selects
        return sum(n in names for names in rows)
    fit = [n for n in left if len(ranges[n]) >= JAM]
    best = min(reversed(fit), key=selected, default=None)
    if best is None or (left[-1] in fit and selected(best) == selected(left[-1])):
        return left
    return [n for n in left if n != best] + [best]
