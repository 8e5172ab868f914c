"""Shifted contractions -> BLAS over strided views.

A statement whose right-hand side is a product of two array reads at affine indices (shifts,
strides, dilations: `y[b,o,i] := x[b,c,2i+j] * w[o,c,j]`), times scalars, summed over the
indices missing on the left, is a pure contraction once some indices are held fixed.  For each
value of the "looped" indices S, every access is a strided view of its array (numpy
as_strided: no copy) in which each remaining index is one axis with one stride, and the
left-hand view writes each element once; the step is one `np.matmul` over those views (extra
free indices become broadcast batch axes: numpy loops over gemm calls in C).  Conv1d with
S = {j}: `y[b,:,:] += w[:,:,j] @ x[b,:,j:j+L]` for each j.  S may also be empty: x[b,c,i+j]
is then a view with two axes of the same stride, and merging (c, j) into matmul's K copies it
once (im2col) before one large gemm.

Which S, and for each operand whether its free indices that do not merge into one matrix
dimension become batch axes or are merged by a copy, is decided by a cost model
(blas_shift_cost.py, constants measured by benchmarks/blas_shift_costs.py) from the call's
shapes, strides and ranges, once per call signature: the same signature always runs the same
plan.  S may also hold one non-shift index of the larger read (a convolution's batch index):
each step's im2col copy then stays in the cache, and its steps are cut into groups (as many
as the machine's threads), shared by Python threads calling single-threaded gemms
(blas_threads.py).  Neither plan nor groups depend on a call's `threads`, which so changes no
bit of the result (a gemm rounds by its thread count; loops sum in another order than BLAS).
Under a frontend's gemm on its own pool (torch's: blas.gemm_provider) the steps run in order on
the calling thread, each gemm and im2col copy spread over that pool, and the cost model
prices plans for it (one call per step for a whole batch of products, the result added in
place, the work shared by the pool's threads): a conv1d's forward and input gradient become
a loop over the shift index j of batched gemms over the batch.  There the result repeats bit
for bit at one torch.get_num_threads(), and may change in the last bits with it (torch's BLAS
splits a long sum, a weight gradient's, over its threads; the plan may change with it).
An output dimension of several indices (`dx[b,c,i+j] += ...`) keeps all but one of them as
axes of the matmul result, added into the output value by value (col2im).  Ranges need not
cover the arrays (views are cut to them), so gradient statements run with the forward's
ranges go the same way.  blas.py keeps the pure contractions over whole arrays; `blas=False`
keeps the generated loops for both.

Reads at pad(affine) run over the sub-ranges where they fall inside their arrays
(blas_shift_pad.py).  Not dispatched: anything but two float/complex reads times scalars
(functions, masks, clamp/mod, gathers, pads with a pad value other than 0), other
reductions, finalisers, `*=`, an output read on the right or sharing memory with an input,
accesses outside the arrays (the loops report those), small work.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from . import blas_shift_cost as model
from . import blas_shift_gather as gather
from . import blas_threads, memory
from .blas import MIN_WORK, factors, pooled_gemm, provider_slowdown
from .blas_shift_cost import blasable as _blasable
from .blas_shift_cost import chain as _chain
from .blas_shift_cost import merges as _merges
from .blas_shift_cost import prod as _prod
from .blas_shift_pad import Padded
from .blas_shift_run import run, step_groups, step_threads  # noqa: F401  (run: a plan's steps)
from .ir import Access, Affine, Const, Equation, Param, Wrapped
from .memo import Memo
from .ranges import affine_bounds, output_shape
from .signature import CallSignature

# most values of the scattered indices of one step (each is one np.add into the output)
MAX_SCATTER = 64


class Shifted:
    """A statement that may run as shifted contractions; remembers plans per call signature."""

    def __init__(self, eq: Equation, reads: tuple, scale: tuple):
        self.eq, self.reads, self.scale = eq, reads, scale
        accs = (eq.lhs,) + reads
        # indices that share an array dimension with another: the candidates for S
        self.shifts = tuple(n for n in eq.indices
                            if any(len(s.terms) > 1 and n in s.names
                                   for a in accs for s in a.indices))
        names = [s.names for s in eq.lhs.indices]       # every element of a new output written
        self.full = all(isinstance(s, Affine) and s.is_bare for s in eq.lhs.indices) and \
            len(set(names)) == len(names)
        self.plans = Memo("blas_shift.plans", 64)   # call signature -> Plan or None
        self.read_names = tuple(dict.fromkeys(a.array for a in reads))  # what plans depend on

    # ------------------------------------------------------------------ per call
    def factor(self, arrays: dict):
        """The statement's scale factors multiplied, negated for `-=`: what each step's
        product is multiplied by before it is added into the output."""
        scale = 1
        for s in self.scale:
            scale = scale * (arrays[s] if isinstance(s, str) else s)
        return -scale if self.eq.assign == "-=" else scale

    def plan(self, arrays: dict, rng: dict, out_shape, out_strides, dtype, loop_threads=1,
             blocked=None):
        """The plan for this call signature, or None (the loops run it).  `loop_threads`: the
        loops' threads BLAS must beat: one count for all calls (never the call's own).
        `blocked()`: the register-blocked loops' tile waste (>= 1), 0 when they are not
        blocked (asked only when a plan is chosen; a fact of the same call signature, so the
        memo stays right)."""
        pooled = pooled_gemm()
        slow = provider_slowdown()
        key = CallSignature.of(arrays, rng, dtype, out_shape,
                               (loop_threads, tuple(out_strides), pooled, slow), self.read_names)
        try:
            return self.plans[key]
        except KeyError:
            p = self.plans[key] = _choose(self, arrays, rng, out_shape, out_strides, dtype,
                                          loop_threads, blocked, pooled, slow)
            return p

    def call(self, arrays: dict, rng: dict, out, dtype, pad=0, loop_threads=1, blocked=None,
             threads=None):
        """Run through BLAS if the plan says so: the output (new when `out` is None, else
        `out`, updated) or None when the generated loops should run it instead (nothing was
        written).  A `:=` statement given an output (run_with_ranges) overwrites the elements
        it covers, like `=`.  `loop_threads`: as for `plan` (and run's `groups`); `threads`:
        the threads this call may use, which change no bit of the result."""
        eq = self.eq
        fresh = out is None
        if fresh:
            shape = tuple(output_shape(eq, rng))
            strides = _c_strides(shape, dtype.itemsize)
        else:
            shape, strides, dtype = out.shape, out.strides, out.dtype
        p = self.plan(arrays, rng, shape, strides, dtype, loop_threads, blocked)
        if p is None:
            return None
        # When each step covers its own elements, `:=` and `=` store the product (matmul
        # writes straight into the output where its layout allows).
        overwrite = eq.assign in (":=", "=")
        write = p.write
        if fresh:
            out = (memory.empty(shape, dtype) if write and self.full else
                   memory.full(shape, pad, dtype))
        elif any(np.may_share_memory(out, arrays[a.array]) for a in self.reads):
            return None
        zero = not write and ((fresh and pad != 0) or (overwrite and not fresh))
        run(p, self, arrays, out, zero, write, loop_threads, threads)
        return out


def shifted(eq: Equation, pad=0) -> Shifted | Padded | None:
    """A Shifted for `eq` if it is a product of two reads at affine indices, a Padded
    (blas_shift_pad.py) if some of those are pad(affine) with the pad value `pad` 0, else
    None."""
    if eq.reducer != "+" or eq.finaliser or eq.assign not in (":=", "=", "+=", "-="):
        return None
    if not all(isinstance(s, Affine) for s in eq.lhs.indices):
        return None
    reads, scale, slots = [], [], []
    for f in factors(eq.rhs):
        if isinstance(f, Access) and f.indices and all(isinstance(s, Affine) or _padded(s)
                                                       for s in f.indices):
            slots += [(len(reads), d, s.inner) for d, s in enumerate(f.indices) if _padded(s)]
            reads.append(replace(f, indices=tuple(s.inner if _padded(s) else s
                                                  for s in f.indices)))
        elif isinstance(f, Param) or (isinstance(f, Const) and not isinstance(f.value, bool)):
            scale.append(f.name if isinstance(f, Param) else f.value)
        else:
            return None
    if len(reads) != 2 or any(a.array == eq.output for a in reads):
        return None
    used = {n for a in reads for s in a.indices for n in s.names}
    if not {n for s in eq.lhs.indices for n in s.names} <= used:
        return None
    if not slots:
        return Shifted(eq, tuple(reads), tuple(scale))
    if pad != 0:
        return None
    inner = replace(eq, assign="-=" if eq.assign == "-=" else "+=")
    return Padded(eq, Shifted(inner, tuple(reads), tuple(scale)), tuple(slots))


def _padded(s) -> bool:
    return isinstance(s, Wrapped) and s.kind == "pad" and isinstance(s.inner, Affine)


def _c_strides(shape, itemsize):
    out, acc = [], itemsize
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


# ----------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class _View:
    """A master view of one access: axes = its S indices, then its remaining indices."""
    start: tuple          # element index of the origin (every index at its range start)
    labels: tuple         # axis labels
    shape: tuple
    strides: tuple        # bytes
    sub: tuple            # positions in the S tuple of its S axes
    span: int             # elements of the array one step's view touches


@dataclass(frozen=True)
class Plan:
    loop: tuple           # S: indices looped over in Python, each a range of positions
    steps: tuple          # lengths of the S ranges
    views: tuple          # _View of read 0, read 1, output
    ops: tuple            # per read: (axes summed first, transpose, matmul shape, copy to
                          # C order, swap the matrix axes after the copy)
    left: int             # which read is matmul's left operand
    res_shape: tuple      # matmul result reshaped to one axis per label
    mm_shape: tuple       # matmul result: batch axes, then the two matrix dimensions
    out_perm: tuple       # output view axes in the order of res_shape
    small: int            # the read the scale multiplies (the smaller view)
    cost: float           # the model's seconds (for explain and tests)
    im2col: bool          # some operand is copied into a merged (im2col-style) matrix
    write: bool           # each step stores its result (no two steps share an element)
    direct: bool          # ... and the gemm writes it straight into the output
    scatter: tuple = ()   # indices of the result added into the output value by value
    scatter_steps: tuple = ()
    scatter_axes: tuple = ()    # their axes in the result
    split: int = 0        # the first looped index's steps may run on several threads, each
                          # into its own output elements (1) or into its own zeroed copy of a
                          # small output, summed after (2)
    accumulate: bool = False    # the steps' results summed in their own order, added into
                                # the output once (blas_shift_cost.accumulates)


def _view(acc: Access, shape, strides, rng: dict, S: tuple) -> _View | None:
    """Master view of `acc` for looped indices S; None if it leaves the array."""
    iv = {n: (r.start, r.stop) for n, r in rng.items()}
    start = []
    for d, s in enumerate(acc.indices):
        b = affine_bounds(s, iv)
        if b is None or b[0] < 0 or b[1] >= shape[d]:
            return None
        start.append(s.const + sum(c * rng[n].start for n, c in s.terms))
    names = list(dict.fromkeys(n for s in acc.indices for n in s.names))
    labels = [n for n in S if n in names] + [n for n in names if n not in S]
    st = tuple(sum(s.coef(n) * strides[d] for d, s in enumerate(acc.indices)) for n in labels)
    span = _prod(1 + sum(abs(c) * (len(rng[n]) - 1) for n, c in s.terms if n not in S)
                 for s in acc.indices)
    return _View(tuple(start), tuple(labels), tuple(len(rng[n]) for n in labels), st,
                 tuple(S.index(n) for n in labels if n in S), span)


def _choose(sh: Shifted, arrays, rng, out_shape, out_strides, dtype, loop_threads=1,
            blocked=None, pooled=False, slow=1.0):
    """The cheapest plan over every valid S and operand arrangement, or None.  LOOP_RATE is
    one thread's: loops on n threads run about n times faster (bench_suite: the local
    convolution's loops 2.0x on 2 threads), which the comparison must count, or a statement
    whose loops scale well is sent to many small gemms that do not.  Register-blocked loops
    (`blocked()`) run at BLOCKED_RATE instead.  `pooled`: the steps run in order on the
    frontend's pool (blas.pooled_gemm), which spreads every plan's gemms alike: none is cheaper
    for sharing its steps between threads, and several threads price the pool's calls; `slow`:
    the pool's gemm against the model's (blas.provider_slowdown)."""
    # (on one thread torch's calls open no parallel region: numpy's model, which measured
    # closer there: dW of a conv1d, 32 steps 2.8 ms against one im2col and gemm 3.6-7.9 ms)
    plans = candidates(sh, arrays, rng, out_shape, out_strides, dtype,
                       loop_threads if pooled and loop_threads > 1 else 0, slow)
    threaded = loop_threads > 1 and blas_threads.available() and not pooled
    if plans:       # (none: out of bounds, or the call does not qualify)
        g = gather.plan(sh.eq, sh.reads, arrays, rng, out_shape, out_strides, dtype,
                        loop_threads if pooled and loop_threads > 1 else 0, slow)
        plans = plans + [g] if g is not None else plans
    best = min(plans, key=lambda p: p.cost / (min(loop_threads, p.steps[0])
                                              if threaded and p.split else 1), default=None)
    if best is None:
        return None
    work = _prod(len(rng[n]) for n in sh.eq.indices)
    # (BLOCKED_RATE is float32's: a vector holds half as many float64s)
    # Against register-blocked loops no margin: BLOCKED_RATE comes from the blocked loops'
    # own measurements, and with the margin a conv1d on 2 threads (32x64x260, 64 outputs,
    # width 5) ran its blocked loops in 3.9 ms instead of BLAS's 2.3-3.4 ms.
    # (blocked() answers the tiles' waste, 0 for loops that are not blocked: a row of 34 in
    # tiles of 32 does 1.88x the work, conv2d NCHW's padded input gradient)
    waste = float(blocked()) if blocked is not None else 0.0
    fast = waste > 0
    rate = (model.BLOCKED_RATE * 4 / max(np.dtype(dtype).itemsize, 4) / waste if fast
            else model.LOOP_RATE)
    if (1.0 if fast else model.MARGIN) * best.cost > 2.0 * work / (rate * max(1, loop_threads)):
        return None
    return best


def candidates(sh: Shifted, arrays, rng, out_shape, out_strides, dtype, pool=0,
               slow=1.0) -> list:
    """For each valid S, its cheapest arrangement (empty when the call does not qualify);
    benchmarks/blas_shift_costs.py --validate times them all against the model's choice.
    `pool`: the threads of the frontend's pool the steps run on (blas.pooled_gemm), else 0;
    `slow`: its gemm's time over the model's."""
    eq = sh.eq
    arrs = [arrays[a.array] for a in sh.reads]
    if dtype.kind not in "fc" or any(a.dtype.kind not in "fc" for a in arrs):
        return []
    if any(len(rng[n]) == 0 for n in eq.indices) or \
            _prod(len(rng[n]) for n in eq.indices) < MIN_WORK:
        return []
    if any(s == 0 and n > 1 for s, n in zip(out_strides, out_shape)):
        return []               # a broadcast output: several elements share memory
    # Besides the shift indices, one index of the larger read may be looped over too (the
    # batch index of a convolution): each step's im2col copy then stays in the cache.
    big = max(range(2), key=lambda i: arrs[i].size)
    blocks = [()] + [(n,) for n in dict.fromkeys(x for s in sh.reads[big].indices
                                                 for x in s.names) if n not in sh.shifts]
    overwrite = eq.assign in (":=", "=")
    plans = []
    for k in range(len(sh.shifts) + 1):
        for shift in combinations(sh.shifts, k):
            for S in ((*b, *shift) for b in blocks):
                # An output dimension of several indices (dx[b,c,i+j]) would be written twice
                # by one matmul result: all but its longest index stay axes of the result,
                # added into the output one value at a time (col2im).
                scat = tuple(n for s in eq.lhs.indices for n in sorted(
                    (n for n in s.names if n not in S), key=lambda n: -len(rng[n]))[1:])
                if _prod(len(rng[n]) for n in scat) > MAX_SCATTER:
                    continue
                views = [_view(a, x.shape, x.strides, rng, S) for a, x in zip(sh.reads, arrs)]
                vo = _view(eq.lhs, out_shape, out_strides, rng, S + scat)
                if vo is None or None in views:
                    return []       # out of bounds: the loops raise the proper error
                # each step writes its own output elements: a looped index alone in a
                # dimension of the output
                disjoint = not scat and all(any(s.names == (n,) for s in eq.lhs.indices)
                                            for n in S)
                p = _arrange(S, views, vo, rng, dtype.itemsize, disjoint and overwrite, scat,
                             pool, slow)
                plans.append(replace(p, split=_split(eq, S, out_shape, out_strides, dtype)))
    return plans


def _split(eq: Equation, S, out_shape, out_strides, dtype) -> int:
    """Plan.split: how steps of the first looped index may share the work between threads."""
    if not S:
        return 0
    if any(s.names == (S[0],) for s in eq.lhs.indices):
        return 1
    small = _prod(out_shape) * dtype.itemsize <= model.CACHE
    contiguous = tuple(out_strides) in (_c_strides(out_shape, dtype.itemsize),
                                        _c_strides(out_shape[::-1], dtype.itemsize)[::-1])
    named = any(S[0] in s.names for s in eq.lhs.indices)
    return 2 if small and contiguous and not named else 0


def _arrange(S, views, vo, rng, itemsize, write=False, scat=(), pool=0, slow=1.0) -> Plan:
    """The cheapest matmul arrangement for one S: which read is on the left, which of each
    read's free indices merge into the matrix dimension (the rest become broadcast batch
    axes), and the order of the contracted indices.  `write`: each step stores its result
    (no two steps write the same element of a `:=` or `=` output); `scat`: indices of the
    result added into the output one value at a time."""
    size = {n: len(rng[n]) for n in rng}
    labels = [v.labels[len(v.sub):] for v in views]
    lo = vo.labels[len(vo.sub):] + scat
    strides = [dict(zip(v.labels, v.strides)) for v in (*views, vo)]
    so = strides[2]
    by_out = sorted(lo, key=lambda n: -abs(so[n]))           # output axes, outer to inner
    batch = [n for n in by_out if n in labels[0] and n in labels[1]]
    free = [[n for n in by_out if n in labels[i] and n not in labels[1 - i]] for i in (0, 1)]
    red = [n for n in labels[0] if n in labels[1] and n not in lo]
    k_orders = {tuple(sorted(red, key=lambda n: -abs(strides[i][n]))) for i in (0, 1)}
    spans = [v.span for v in views]
    best = None
    for left in (0, 1):
        right = 1 - left
        for kk in sorted(k_orders):
            for ma in _merges(free[left], size, strides[left], so):
                for nb in _merges(free[right], size, strides[right], so):
                    c = model.cost(S, labels, left, list(kk), ma, nb, batch, free, lo, size,
                                   strides, itemsize, write, spans,
                                   _prod(size[x] for x in scat), pool, slow)
                    if best is None or c < best[0]:
                        best = (c, left, list(kk), ma, nb)
    cost, left, kk, ma, nb = best
    right = 1 - left
    ga = [n for n in free[left] if n not in ma]
    gb = [n for n in free[right] if n not in nb]
    ops = [None, None]
    for i, g_own, g_other, mine, first in ((left, ga, gb, ma, True), (right, gb, ga, nb, False)):
        summed = tuple(a for a, x in enumerate(labels[i]) if x not in lo and x not in red)
        kept = [x for x in labels[i] if x in lo or x in red]
        st = strides[i]
        views_ok = _chain(mine, size, st) and _chain(kk, size, st)
        matrix = _blasable(mine, kk, st, itemsize) if first else _blasable(kk, mine, st, itemsize)
        groups = (mine, kk) if first else (kk, mine)
        inner = groups[0] + groups[1]
        # a copied operand is copied in the cheaper of the matrix's two orders (the gemm
        # takes the other as a transposed view)
        flip = not (views_ok and matrix) and model.flip_copy(labels[i], groups, size, st,
                                                             itemsize)
        order = batch + g_own + (groups[1] + groups[0] if flip else inner)
        ones = [1] * len(g_other)
        mm = [size[x] for x in batch] + ([size[x] for x in g_own] + ones if first else
                                         ones + [size[x] for x in g_own])
        two = ([_prod(size[x] for x in mine), _prod(size[x] for x in kk)] if first else
               [_prod(size[x] for x in kk), _prod(size[x] for x in mine)])
        mm += two[::-1] if flip else two
        contig = views_ok and not matrix
        ops[i] = (summed, tuple(kept.index(x) for x in order), tuple(mm), contig, flip)
    res = batch + ga + gb + ma + nb
    small = 0 if _prod(size[x] for x in labels[0]) <= _prod(size[x] for x in labels[1]) else 1
    im2col = any(len(set(v.strides[len(v.sub):])) < len(v.strides) - len(v.sub)
                 for v in views)
    direct = write and _chain(ma, size, so) and _chain(nb, size, so) and \
        _blasable(ma, nb, so, itemsize)
    kept = [x for x in res if x not in scat]
    acc = not direct and model.accumulates(S, lo, res, size, so, itemsize, write,
                                           _prod(size[x] for x in scat), pool)
    return Plan(tuple(S), tuple(size[x] for x in S), (views[0], views[1], vo), tuple(ops),
                left, tuple(size[x] for x in res),
                tuple(size[x] for x in batch + ga + gb) + (_prod(size[x] for x in ma),
                                                           _prod(size[x] for x in nb)),
                tuple(sorted(kept, key=lo.index).index(x) for x in kept), small,
                cost, im2col, write, direct, tuple(scat),
                tuple(size[x] for x in scat), tuple(res.index(x) for x in scat),
                accumulate=acc)
