"""Reads taken as copies in another axis order, so that a statement's loops run register-blocked.

The rule.  Let `r` be the index of the output's last (contiguous) axis.  A statement whose
loops would sum a reduction index innermost -- one short sum per output element, whose
vector lanes the compiler adds across at its end -- runs several times faster in the row
form of schedule.jam_choice: `r` in the vector lanes, several values of another left index
at once, every loaded value feeding several accumulators.  That form needs every array read
along `r` to have `r` in its last axis.  So every array read with `r` (coefficient +-1) in an
axis other than its last gets that axis moved last, in a C-contiguous copy (so does an array
read along `r` in its last axis that is not C-contiguous), and the statement reads the copies.

Worked example: a locally connected layer's weight gradient, batch 16, 30x30 positions,

    dW[c1,i,j,c2,s,t] += dout[s,t,c2,b] * x[s+i,t+j,c1,b]

sums b (16 long, contiguous in both reads) innermost: 1.04 million sums of 16.  `t` is the
output's last index; it is axis 1 of dout and of x, so the statement reads
dout' = dout.transpose(0, 2, 3, 1) and x' = x.transpose(0, 2, 3, 1) instead:

    dW[c1,i,j,c2,s,t] += dout'[s,c2,b,t] * x'[s+i,c1,b,t+j]

and t runs in the vector lanes, b summed in registers, for several c2 at once.

When it applies (`choose`): no gathers; the output's last index a bare index; the statement
not a pure contraction that BLAS takes whole, nor a scatter; the copies small next to the work
(their elements at most an eighth of the iterations); and the moved statement then runs
register-blocked loops (not BLAS).  The sums then run in another order: the result may differ
from the statement's own loops in the last bits (as BLAS's would).  The choice depends only on
the statement and the arrays' shapes, dtypes and strides (a call signature), so one signature
always gets the same bits.  The gradient side (vjp_plan) and a Kernel's own call
(frontends/numpy) ask the same question, so a printed gradient statement run on its own
reproduces the vjp's numbers exactly.

Padded copies.  A read through `pad()` bounds its loops with guards (the loop over `p` of
dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j] stops where p-j leaves dy), and guarded loops are not
register-blocked.  Such an array is read instead from a copy widened on each padded axis by the
elements the pad expression reaches outside it (lo before, hi after; over the statement's
ranges p-j runs from -4 to 259 on dy's 256: lo 4, hi 4), filled with the kernel's pad value,
and the statement reads it with `pad(e)` written `e + lo`:

    dx[b,c,p] += dy'[b,o,p-j+4] * w[o,c,j]         (dy' = dy with 4 pad values each side)

Every read of the moved statement is checked in bounds of its copy before the choice is made.
A padded read also counts as a copy for the rule above, with the same conditions.  conv1d's
dx at 32x64x260, width 5, float32, 2 threads: 8.4 ms through BLAS over strided views, 3.5 ms
in blocked loops on the padded copy.

A scratch output in another axis order.  Blocked tiles run along the output's last index `r`;
a last tile overlaps the one before it (codegen/blocked.py), so a row of 34 in tiles of 32 sums
64 elements: conv2d NCHW's input gradient dx[b,c,p,q] += dy[b,o,pad(p-i),pad(q-j)] * w[o,c,i,j]
does 1.88x its work.  Where the padded statement's tiles waste at least WASTE, another left
index `c` of at least SCRATCH_ROW values may run in the lanes instead: the statement computes
into a C-contiguous scratch with `c` as its last axis (`Output`), every read of `c` copied with
`c` last, every read of the longest reduction index copied with that index just before (the
inner loop then streams both reads: dy'[b,p,q,o], w'[i,j,o,c]), and the scratch is taken into
the output (stored, added or subtracted) after the loops:

    dx'[b,p,q,c] := dy'[b,p-i+2,q-j+2,o] * w'[i,j,o,c]        then dx += dx' (axes back)

at 16x32x34x34 (64 outputs, 3x3), float32, one thread: 9.0-9.8 ms -> the moved statement's
3.8 ms plus the copies.  Beside padded copies (or on short rows), over the whole output; it
runs on its own kernel's call (vjp_plan.py runs a statement that `may_pad` alone), where the
scratch is made, and the plan a vjp keeps per signature never holds one.

Short rows.  A statement with nothing to copy whose loops do not block because its output's
last index is short (a weight gradient's kernel width) takes the same scratch, another left
index in the lanes (`_short_row`): conv2d NCHW's dW[o,c,i,j] += dy[b,o,p,q] * x[b,c,p+i,q+j]
runs as dW'[o,i,j,c] := dy[b,o,p,q] * x'[b,p+i,q+j,c], 8 values of o at once, 16x32x34x34,
64 outputs, 3x3 float32: 3.6 ms on one thread (2.2 on two) against 7.4 (5.2) by im2col and
BLAS and 37 ms in its own loops (AMD Zen 5).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from . import blas, memo, schedule, threads
from .guards import linear, top_factors
from .ir import Access, Affine, Binary, Compare, Equation, Param, Wrapped, map_expr
from .ranges import affine_bounds
from .signature import CallSignature
from .relayout_copies import (Copy, Output, copies, scratch, standin, take,  # noqa: F401
                              target_shape)

# (relayout_copies.py's names, which the callers of this module use through it)
__all__ = ["COPY_SHARE", "WASTE", "SCRATCH_ROW", "Copy", "Output", "axes", "choose", "copies",
           "gather", "in_bounds", "may_pad", "moved", "padded", "pads", "scratch", "standin",
           "take", "target_shape"]

# A copy pays when its elements are at most this fraction of the statement's iterations.
COPY_SHARE = 1 / 8
WASTE = 1.25        # tiles' work over the statement's from which a scratch output is weighed
SCRATCH_ROW = 32    # least values of the index a scratch output runs in the lanes
_SCRATCH = memo.Memo("relayout.scratch", 256)
_CHOICES = memo.Memo("relayout.choices", 256)   # (kernel, signature) -> choice


def axes(eq: Equation, rng: dict, arrays: dict) -> dict:
    """{array: axis order of its copy} for statement `eq` over ranges `rng` reading `arrays`
    (name -> array or scalar); {} where the rule of this module does not apply."""
    last = eq.lhs.indices[-1] if eq.lhs.indices else None
    if eq.gathers() or not (isinstance(last, Affine) and last.is_bare):
        return {}
    r = last.names[0]
    out: dict = {}
    for a in eq.accesses():
        v = arrays.get(a.array)
        if a.array == eq.output or not isinstance(v, np.ndarray) or v.ndim < 2:
            continue
        dims = [d for d, x in enumerate(a.indices) if r in x.names]
        if not dims:
            continue
        if len(dims) != 1 or not (isinstance(a.indices[dims[0]], Affine)
                                  and abs(a.indices[dims[0]].coef(r)) == 1):
            return {}
        order = tuple(d for d in range(v.ndim) if d != dims[0]) + tuple(dims)
        if out.setdefault(a.array, order) != order:
            return {}           # read along r in two different axes
    out = {n: o for n, o in out.items()
           if o != tuple(range(len(o))) or not arrays[n].flags.c_contiguous}
    if not out or not _small_copies(arrays, out, rng):
        return {}
    return out


def _small_copies(arrays: dict, names, rng: dict) -> bool:
    """Whether copies of the arrays `names` hold at most COPY_SHARE of the iterations."""
    return sum(arrays[n].size for n in names) <= COPY_SHARE * math.prod(map(len, rng.values()))


def _plain_pad(s) -> bool:
    """`pad(e)` around an affine `e`, without bounds of its own: what a padded copy replaces."""
    return (isinstance(s, Wrapped) and s.kind == "pad" and s.lo is None
            and isinstance(s.inner, Affine))


def pads(eq: Equation, rng: dict, arrays: dict) -> dict:
    """{array: ((lo, hi) per axis)} for the arrays statement `eq` reads through `pad(e)` with an
    affine `e` (see the module's docstring), over ranges `rng`; {} where none is or one cannot
    be (a pad with bounds of its own, a pad around a gather)."""
    bounds = {n: (r.start, r.stop) for n, r in rng.items()}
    out: dict = {}
    for a in eq.accesses():
        if not any(isinstance(s, Wrapped) for s in a.indices):
            continue
        v = arrays.get(a.array)
        if a.array == eq.output or not isinstance(v, np.ndarray):
            return {}
        widths = list(out.get(a.array, [(0, 0)] * v.ndim))
        for d, s in enumerate(a.indices):
            if not isinstance(s, Wrapped):
                continue
            if not _plain_pad(s):
                return {}
            b = affine_bounds(s.inner, bounds)
            if b is None:
                return {}
            widths[d] = (max(widths[d][0], -b[0], 0), max(widths[d][1], b[1] - v.shape[d] + 1, 0))
        out[a.array] = tuple(widths)
    return out


def moved(eq: Equation, order: dict) -> Equation:
    """`eq` reading each array of `order` ({name: Copy or axis order}) as its copy: its axes
    in the copy's order, each index shifted by the padding before it (`pad(e)` read as `e + lo`
    on a padded axis)."""
    def slot(s, lo):
        inner = s.inner if isinstance(s, Wrapped) else s
        return Affine.of(inner.terms, inner.const + lo, inner.span) if lo else inner

    def read(n):
        if not isinstance(n, Access) or n.array not in order or \
                isinstance(order[n.array], Output):
            return n
        c = Copy.of(order[n.array])
        if not c.pads:
            return Access(n.array, tuple(n.indices[d] for d in c.axes), n.span)
        return Access(n.array, tuple(slot(n.indices[d], lo) for d, (lo, _) in
                                     zip(c.axes, c.pads)), n.span)
    rhs = map_expr(eq.rhs, read)
    o = order.get(eq.output)
    if isinstance(o, Output):
        lhs = Access(eq.lhs.array, tuple(eq.lhs.indices[d] for d in o.axes), eq.lhs.span)
        return replace(eq, lhs=lhs, assign=":=", rhs=rhs)
    return replace(eq, rhs=rhs)


def in_bounds(eq: Equation, rng: dict, arrays: dict) -> bool:
    """Whether every affine read of `eq` over `rng` stays inside its array (the arrays given
    as arrays or stand-ins): the check a padded copy must pass before it is chosen."""
    bounds = {n: (r.start, r.stop) for n, r in rng.items()}
    for a in eq.accesses():
        v = arrays.get(a.array)
        if a.array == eq.output or not isinstance(v, np.ndarray):
            continue
        for d, s in enumerate(a.indices):
            if not isinstance(s, Affine):
                return False
            b = affine_bounds(s, bounds)
            if b is not None and (b[0] < 0 or b[1] >= v.shape[d]):
                return False
    return True


def choose(kernel, kernel_for, arrays: dict, rng: dict, out: np.ndarray, pad: bool = True,
           finite: bool = False):
    """(axis orders, moved Equation, its ranges) when `kernel`'s statement over `rng`, reading
    `arrays` into `out` (an array or a stand-in of its shape and dtype), should read relaid
    copies (the rule of this module); None when it runs as it stands.  `kernel_for(eq)`: the
    Kernel that runs a moved statement.  `pad` False: no padded copies (their choice may
    depend on the call's values, see `padded`: a plan kept for a signature must not make it).
    A statement with a shifted left side is weighed as the gather its loops run (`gather`).
    `finite`: take the values `padded` checks as finite (what the signature alone decides).

    The answer is a fact of the call signature and of the values `padded` checks: it is
    weighed once per signature with those values taken as finite, remembering which arrays
    were so taken, and each call checks only them (a conv2d NCHW input gradient under torch:
    about 0.7 ms a call weighed anew, against a check of w's 18 thousand values)."""
    # (per Kernel object, which the entry holds so that its id is not reused; with what the
    # weighing reads besides the signature: the thread budget, the frontend's gemm, the
    # module's thresholds)
    key = (id(kernel), CallSignature.of(
        arrays, rng, out.dtype, out.shape,
        (pad, finite, tuple(out.strides), bool(out.flags.writeable), blas.pooled_gemm(),
         blas.provider_slowdown(), getattr(threads.budgets, "n", None), threads.max_threads(),
         WASTE, SCRATCH_ROW, COPY_SHARE)))
    hit = _CHOICES.get(key)
    if hit is None or hit[0] is not kernel:
        taken: list = []        # arrays `padded` took as finite
        got = _choose(kernel, kernel_for, arrays, rng, out, pad, finite or pad, taken)
        hit = _CHOICES[key] = (kernel, got, tuple(taken) if not finite else ())
    _, got, taken = hit
    if any(not np.isfinite(arrays[n]).all() for n in taken):
        return _choose(kernel, kernel_for, arrays, rng, out, pad, False, [])
    return got


def _choose(kernel, kernel_for, arrays: dict, rng: dict, out: np.ndarray, pad: bool,
            finite: bool, taken: list):
    """choose, weighed: `taken` receives the arrays `padded` took as finite."""
    if kernel.blas_plan is not None and blas.worth(kernel.blas_plan, rng, arrays):
        return None
    plan, _, low = kernel.plan_for(arrays, rng, out.dtype, out.shape)
    if plan.scatter:
        return None
    if low.solved is not None and pad:
        geq, grng = gather(low, arrays)
        if geq is not None and pads(geq, grng, arrays):
            kernel, rng = kernel_for(geq), grng
    eq = kernel.equation
    # (a padded copy only where the guarded loops are not register-blocked already: the local
    # convolution's dx, blocked over c1 with its guards on p and q outside the tile, took
    # 0.34 ms as it stands and 1.53 ms on a padded copy)
    order = axes(eq, rng, arrays)
    widths = padded(kernel, rng, arrays, finite, taken) if pad and not plan.jam else {}
    if not (order or widths):
        return _short_row(kernel, kernel_for, eq, rng, arrays, out) if pad and not \
            plan.jam else None
    if widths:
        if eq.gathers() or not _small_copies(arrays, dict.fromkeys((*order, *widths)), rng):
            return None
        both = {}
        for n in dict.fromkeys((*order, *widths)):
            ax = order.get(n, tuple(range(arrays[n].ndim)))
            both[n] = Copy(ax, tuple(widths[n][d] for d in ax) if n in widths else (),
                           kernel.pad)
        order = both
    m = moved(eq, order)
    gm, stand = kernel_for(m), copies(arrays, order, run=False)
    if widths and not in_bounds(m, rng, stand):
        return None
    mplan = gm.plan_for(stand, rng, out.dtype, out.shape)[0]
    if not mplan.jam:
        return None
    waste = schedule.tile_waste(mplan, rng)
    if widths and waste >= WASTE:
        alt = _scratch_alt(kernel_for, eq, rng, arrays, out, widths, kernel.pad, True)
        if alt is not None and alt[1] < waste:
            order = alt[0]
    return _weighed(kernel_for, eq, order, arrays, rng, out)


def _scratch_alt(kernel_for, eq: Equation, rng: dict, arrays: dict, out, widths: dict, fill,
                 stream: bool):
    """_scratch_order's answer, a fact of the signature: weighed once (~0.6 ms)."""
    key = (eq, stream, SCRATCH_ROW, CallSignature.of(arrays, rng, out.dtype, out.shape,
                                                     (tuple(widths.items()), repr(fill))))
    alt = _SCRATCH.get(key, False)
    if alt is False:
        alt = _SCRATCH[key] = _scratch_order(kernel_for, eq, rng, arrays, out, widths, fill,
                                             stream)
    return alt


def _weighed(kernel_for, eq: Equation, order: dict, arrays: dict, rng: dict, out):
    """(order, moved statement, rng), or None where BLAS takes the moved statement: BLAS
    weighed against the loops that would run (the scratch's, where `order` has an Output: on
    one thread the padded copy's tiles of 32 over rows of 34 lost to BLAS, 9.3 against 9.5 ms
    in the model, and the statement ran its own BLAS plan in 6.5-8.5 ms instead of the
    scratch's loops in 4.9 ms)."""
    m = moved(eq, order)
    if any(isinstance(c, Output) for c in order.values()):
        out = standin(target_shape(order, eq.output, out.shape), out.dtype)
    if kernel_for(m).uses_blas(copies(arrays, order, run=False), rng, out):
        return None
    return order, m, rng


def _short_row(kernel, kernel_for, eq: Equation, rng: dict, arrays: dict, out):
    """A scratch output for a statement with nothing to copy or pad whose own loops do not
    block, its output's last index too short for the lanes (the module's docstring: a
    convolution's weight gradient).  Taken where the scratch's tiles waste less than WASTE and
    BLAS does not win; only on a kernel's own call (`pad`: a vjp plan runs it alone)."""
    if not eq.reduction_indices:        # (the gain is sums kept in registers)
        return None
    alt = _scratch_alt(kernel_for, eq, rng, arrays, out, {}, kernel.pad, False)
    if alt is None or alt[1] >= WASTE or not _small_copies(
            arrays, [n for n, c in alt[0].items() if not isinstance(c, Output)], rng):
        return None
    return _weighed(kernel_for, eq, alt[0], arrays, rng, out)


def _scratch_order(kernel_for, eq: Equation, rng: dict, arrays: dict, out, widths: dict, fill,
                   stream: bool = True):
    """(order with an Output, its tiles' waste) for the left index that wastes least in the
    lanes of a scratch output (the module's docstring), or None.  `stream` False (`_short_row`):
    the longest reduction index stays in place, and the index with the smallest copies wins
    (conv2d NCHW's dW: c copies x, o copies dy and x, 2.7x slower)."""
    names = [s.names[0] if isinstance(s, Affine) and s.is_bare else None
             for s in eq.lhs.indices]
    if (eq.reducer != "+" or eq.assign not in (":=", "=", "+=", "-=") or None in names
            or len(set(names)) != len(names) or any(
                rng[n].start != 0 or len(rng[n]) != m for n, m in zip(names, out.shape))):
        return None
    red = [n for n in eq.indices if n not in names]
    longest = max(red, key=lambda n: len(rng[n]), default=None)
    best = None
    for d_c, c in enumerate(names[:-1]):
        if len(rng[c]) < SCRATCH_ROW:
            continue
        order: dict = {}
        for a in eq.accesses():
            v = arrays.get(a.array)
            if a.array == eq.output or not isinstance(v, np.ndarray) or a.array in order:
                continue
            on_c = [d for d, x in enumerate(a.indices) if c in x.names]
            on_l = [d for d, x in enumerate(a.indices) if longest in x.names and d not in on_c]
            inner = [x.inner if isinstance(x, Wrapped) else x for x in a.indices]
            if len(on_c) > 1 or (on_c and not (isinstance(inner[on_c[0]], Affine)
                                               and abs(inner[on_c[0]].coef(c)) == 1)):
                order = None
                break
            tail = on_l[:1] * (len(on_l) == 1 and stream) + on_c
            ax = tuple(d for d in range(v.ndim) if d not in tail) + tuple(tail)
            pads = tuple(widths[a.array][d] for d in ax) if a.array in widths else ()
            if ax != tuple(range(v.ndim)) or pads or not v.flags.c_contiguous:
                order[a.array] = Copy(ax, pads, fill)
        if order is None:
            continue
        order[eq.output] = Output(tuple(d for d in range(len(names)) if d != d_c) + (d_c,))
        m = moved(eq, order)
        stand, shape = copies(arrays, order, run=False), target_shape(order, eq.output, out.shape)
        if not in_bounds(m, rng, stand):
            continue
        plan = kernel_for(m).plan_for(stand, rng, out.dtype, shape)[0]
        if plan.jam and plan.loops[-1].index == c:
            waste = schedule.tile_waste(plan, rng)
            size = sum(arrays[n].size for n, x in order.items() if not isinstance(x, Output))
            rank = (waste,) if stream else (waste >= WASTE, size, waste)
            if best is None or rank < best[2]:
                best = (order, waste, rank)
    return best and best[:2]


def may_pad(kernel, arrays: dict, rng: dict, out: np.ndarray) -> bool:
    """Whether a call of `kernel` of this signature reads a padded copy when the values it
    checks are finite (`padded`): a plan kept for the signature runs such a statement on its
    own kernel's call, so that the choice is made there, on the call's values (vjp_plan.py)."""
    got = choose(kernel, kernel.kernel_for, arrays, rng, out, finite=True)
    return got is not None and any(isinstance(c, Output) or Copy.of(c).pads
                                   for c in got[0].values())


def gather(low, arrays: dict) -> tuple:
    """(statement, ranges) of a rewritten shifted left side (rewrite.Lowered) without the masks
    that its pad reads imply, or (None, None) when a mask remains.  conv1d's input gradient
    dx[b,c,i+j] += dy[b,o,i] * w[o,c,j] runs as dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j] *
    (_lo_i <= p - j < _hi_i); over the whole of i, lo = 0 and hi = dy's length: the mask keeps
    exactly the terms the pad read's guard keeps, and the statement is the printed one."""
    eq, bounds = low.equation, low.bound_params
    extents: dict = {}      # pad expression (sorted terms, constant) -> extents it is read on
    for a in top_factors(eq.rhs):
        v = arrays.get(a.array) if isinstance(a, Access) else None
        if isinstance(v, np.ndarray):
            for d, s in enumerate(a.indices):
                if _plain_pad(s):
                    extents.setdefault((tuple(sorted(s.inner.terms)), s.inner.const),
                                       []).append(v.shape[d])
    kept = []
    for f in top_factors(eq.rhs):
        if isinstance(f, Compare) and f.ops == ("<=", "<") and all(
                isinstance(x, Param) and x.name in bounds for x in f.operands[::2]):
            e = linear(f.operands[1])
            lo, hi = bounds[f.operands[0].name], bounds[f.operands[2].name]
            if e is not None and not e[1] and any(
                    lo <= 0 and hi >= n
                    for n in extents.get((tuple(sorted(e[0].terms)), e[0].const + e[2]), ())):
                continue
            return None, None
        kept.append(f)
    rhs = kept[0]
    for f in kept[1:]:
        rhs = Binary("*", rhs, f)
    return replace(eq, rhs=rhs), dict(low.ranges)


def padded(kernel, rng: dict, arrays: dict, finite: bool = False, taken=None) -> dict:
    """pads() for `kernel`'s call where the copy gives the loops' numbers exactly; else {}.

    The pad value must fit the padded arrays' dtypes.  Under a sum with pad value 0, a read
    `pad(e)` that is a factor of the product is a guard: the loops skip the terms where `e`
    leaves the array, while the copy adds 0 * (the other factor) there, which is 0 only for a
    finite other factor.  So there the product must be that read and one other array read, whose
    values are all finite (checked on this call's values: inf or NaN in w keep
    dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j] on its own loops).  `finite`: take them as
    finite, appending the array's name to the list `taken` (choose checks it per call)."""
    eq = kernel.equation
    widths = pads(eq, rng, arrays)
    for n in widths:
        try:
            ok = np.asarray(kernel.pad).astype(arrays[n].dtype) == kernel.pad
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return {}
    factors = top_factors(eq.rhs)
    guard = [f for f in factors if isinstance(f, Access) and any(map(_plain_pad, f.indices))]
    if widths and guard and eq.reducer == "+" and kernel.pad == 0:
        others = [f for f in factors if f not in guard]
        if len(factors) != 2 or len(guard) != 1 or not isinstance(others[0], Access):
            return {}
        v = arrays.get(others[0].array)
        if not isinstance(v, np.ndarray) or (v.dtype.kind in "fc" and not finite
                                             and not np.isfinite(v).all()):
            return {}
        if finite and v.dtype.kind in "fc" and taken is not None:
            taken.append(others[0].array)
    return widths
