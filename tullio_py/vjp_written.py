"""Which gradient arrays a vjp allocates without zeroing them (vjp_plan.Array.written).

A gradient array is zero-filled and its statements accumulate into it (`+=`).  When the one
statement of an array writes each element at most once, `=` into an unfilled array gives the
same values without writing zeros and reading them back; the elements it never writes (no
index tuple of the forward reaches them: their gradient is 0) are zeroed alone, as a few
boxes (Array.zero).

A statement shifted on its left (`gather_form`): the local convolution's
dW[s+i, t+j, i, j, c1, c2] += dout[s,t,b,c2] * x[s+i,t+j,c1,b] writes each element of W that
the forward reads once (each is read at one (s, t, i, j)); W[p, q, i, j] with p - i or q - j
outside the output is never read, 12% of it, in 8 boxes.  The kernel's own rewrite
(rewrite.py) turns the statement into the gather dW[p,q,i,j,c1,c2] = dout[pad(p-i),pad(q-j),
b,c2] * x[p,q,c1,b] * (masks), whose pad() reads keep a check per element under `=` (an
element must be written even where its read is outside the array), 1.5x slower than `+=`.
Here the reads are known to be inside their arrays wherever the masks hold (they are the
original statement's reads, in bounds over the forward's ranges), so the gather is run without
pad(): 4.7 MB neither zero-filled nor read back, its loops as fast as `+=`'s.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import blas, rewrite, schedule
from .ir import Access, Affine, Compare, Equation, Gather, Param, Wrapped, map_expr

MAX_TUPLES = 1 << 20    # index tuples enumerated to find the elements a statement writes
MAX_BOXES = 64          # boxes zeroed at most; more: the array is zero-filled instead


def unzeroed(arrays: list, statements: list, kernel_for, values: dict, params: dict,
             arrays_of) -> tuple[list, list]:
    """Gradient arrays whose one statement writes every element at most once run it as `=`
    into an unzeroed array (Array.written), zeroing the elements it never writes
    (Array.zero): the statement writes each element once (`overwrites`; a relaid statement
    runs alone, so it may also sum over reduction indices: each element's whole sum is formed
    before it is stored, as a local layer's dW[c1,i,j,c2,s,t], 4 MB neither zeroed nor
    read back; one shifted on its left runs as its gather, `gather_form`), or its kernel hands
    it whole to BLAS (`whole_blas`).  `arrays_of`: vjp_plan's (what a statement reads)."""
    arrays, statements = list(arrays), list(statements)
    for k, s in enumerate(statements):
        j = next((j for j, a in enumerate(arrays) if a.name == s.output), None)
        if j is None or arrays[j].input is None or \
                sum(x.output == s.output for x in statements) != 1:
            continue
        g, rng, shape = s.equation, {n: range(*r) for n, *r in s.ranges}, arrays[j].shape
        zero, new = overwrites(g, rng, shape, reductions=bool(s.relayout)), s
        if zero is not None and not all(x.is_bare for x in g.lhs.indices):
            gathered = gather_form(g, rng, shape, params) if s.relayout else None
            if gathered is None:
                zero = None
            else:
                eq, grng, consts = gathered
                new = replace(s, equation=eq, consts=consts, ranges=tuple(
                    (n, r.start, r.stop, r.step) for n, r in grng.items()))
        if zero is None and not s.relayout and whole_blas(g, rng, kernel_for,
                                                          arrays_of(s, values, params), values):
            zero = ()
        if zero is not None:
            arrays[j] = replace(arrays[j], written=True, zero=zero)
            statements[k] = replace(new, equation=replace(new.equation, assign="="))
    return arrays, statements


def overwrites(g: Equation, rng: dict, shape, reductions: bool = False):
    """The boxes of elements gradient statement `g`, alone on its array, never writes, when it
    writes every other element exactly once: `()` when it writes all of them (`dx[i,j] +=
    dy[i,j] * g[j] / s[i]` over the whole array: the layer norm's and softmax's dx at
    4096x512 float32, 8 MB less written and read each); None when an element may be written
    twice, or the statement has a mask, pad, clamp, mod or gather.  Each left-hand slot is a
    sum of indices (coefficients 1), and no two index tuples reach one element (the slots'
    coefficient matrix has full column rank): dW[s+i, t+j, i, j, c1, c2] qualifies,
    dx[s+i, t+j, c1, b] (which sums over i and j) does not.  `reductions`: a reduction index
    is allowed too, for a statement that runs alone (in a fused nest, '=' would store each
    partial sum)."""
    lhs = g.lhs.indices
    if (g.assign != "+=" or g.reducer != "+" or g.finaliser or len(lhs) != len(shape)
            or not all(isinstance(x, Affine) and x.terms and not x.const and not x.shifted
                       and all(c == 1 for _, c in x.terms) for x in lhs)):
        return None
    names = list(g.lhs_indices)
    if set(names) != set(g.indices) and not reductions:
        return None
    if any(isinstance(x, (Wrapped, Gather)) for a in g.accesses() for x in a.indices) \
            or any(isinstance(f, Compare) for f in schedule.top_factors(g.rhs)):
        return None
    if np.linalg.matrix_rank(np.array([[x.coef(n) for n in names] for x in lhs])) < len(names):
        return None
    return unwritten(lhs, rng, shape)


def unwritten(lhs, rng: dict, shape):
    """The elements of an array of `shape` that no index tuple of the ranges `rng` writes at
    left-hand slots `lhs` (sums of indices, one element per tuple), as boxes ((start, stop)
    per dimension).  Slots that share an index form a group, whose written positions are
    enumerated (at most MAX_TUPLES tuples; a group of one bare index over its whole dimension
    writes all of it); each group's unwritten positions, in runs along its last dimension, are
    boxes whole in every other dimension.  None when a position falls outside the array, or
    there would be more than MAX_BOXES boxes."""
    groups: list[list[int]] = []
    for d, x in enumerate(lhs):
        joined = [grp for grp in groups if set(x.names) & {n for e in grp for n in lhs[e].names}]
        groups = [grp for grp in groups if grp not in joined] + [
            sorted([e for grp in joined for e in grp] + [d])]
    boxes = []
    for grp in groups:
        names = sorted({n for d in grp for n in lhs[d].names})
        if len(grp) == 1 and lhs[grp[0]].is_bare and rng[names[0]] == range(shape[grp[0]]):
            continue
        if np.prod([len(rng[n]) for n in names], dtype=float) > MAX_TUPLES:
            return None
        grid = np.meshgrid(*[np.arange(rng[n].start, rng[n].stop, rng[n].step) for n in names],
                           indexing="ij")
        pos = [sum(grid[names.index(n)] for n in lhs[d].names) for d in grp]
        ext = [shape[d] for d in grp]
        if any(p.size and (p.min() < 0 or p.max() >= e) for p, e in zip(pos, ext)):
            return None
        hit = np.zeros(ext, bool)
        hit[tuple(p.ravel() for p in pos)] = True
        for row, col in np.argwhere(~hit.reshape(-1, ext[-1])):
            lead = dict(zip(grp[:-1], (int(v) for v in np.unravel_index(row, ext[:-1]))))
            if boxes and boxes[-1][:2] == (grp, lead) and boxes[-1][2][1] == col:
                boxes[-1] = (grp, lead, (boxes[-1][2][0], int(col) + 1))
            else:
                boxes.append((grp, lead, (int(col), int(col) + 1)))
        if len(boxes) > MAX_BOXES:
            return None
    return tuple(tuple((lead[d], lead[d] + 1) if d in lead else run if d == grp[-1] else (0, n)
                       for d, n in enumerate(shape)) for grp, lead, run in boxes)


def gather_form(g: Equation, rng: dict, shape, params: dict):
    """Statement `g`, shifted on its left and with no pad, clamp, mod or gather, as the gather
    the kernel's rewrite makes of it (rewrite.solve: bare left-hand indices, masks for the
    eliminated indices' ranges), with the reads the rewrite wraps in pad() left plain: inside
    the masks each is one of `g`'s own reads at a tuple of `rng`, inside its array.  (equation,
    its ranges, its masks' bound parameters as ((name, value), ...)), or None when the
    rewrite keeps a scatter."""
    solved = rewrite.solve(g)
    if solved is None:
        return None
    grng, bounds = rewrite.solved_ranges(solved, rng, tuple(shape))
    taken = set(g.arrays) | set(g.params) | set(params) | {g.output}
    names = {b: next(f"{b}{k or ''}" for k in range(len(taken) + 1)
                     if f"{b}{k or ''}" not in taken) for b in bounds}

    def plain(n):
        if isinstance(n, Access):
            return Access(n.array, tuple(x.inner if isinstance(x, Wrapped) else x
                                         for x in n.indices), n.span)
        if isinstance(n, Param) and n.name in names:
            return Param(names[n.name])
        return n
    eq = replace(solved.equation, rhs=map_expr(solved.equation.rhs, plain))
    return eq, grng, tuple((names[b], v) for b, v in bounds.items())


def whole_blas(g: Equation, rng: dict, kernel_for, arrays: dict, values: dict) -> bool:
    """Whether gradient statement `g`, alone on its array, is a contraction its kernel hands
    to BLAS over whole arrays (blas.py): BLAS writes every element, so `=` into an unzeroed
    array gives the same values (attention's dq, dk, dp, dv: gemms with beta 0 instead of
    zero-filling 2-4 MB each and adding to it).  `arrays`: what `g` reads."""
    c = kernel_for(g).blas_plan
    if g.assign != "+=" or c is None:
        return False
    return blas.worth(c, rng, arrays) and blas.covers(g, rng, arrays, values[g.output].shape)
