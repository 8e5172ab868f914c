"""Which loop of a statement runs on threads: among the indices that are safe to split (bare in
a left-hand position, schedule.safe_indices), the one whose blocks keep the memory order and
give every thread work (split_choice), avoiding the indices of a one-sided mask, whose values
do unequal work (triangular).  The choice depends on the ranges only, never on the thread
count, so every thread count computes each element the same way.
"""
from __future__ import annotations

from .guards import mask_guards, top_factors
from .ir import Equation

SHORT = 16       # a parallel loop shorter than this is fused with the next safe loop


def split_choice(order: list, cands: list, ranges: dict, tri: set, guarded: set,
                 fuse: bool = True) -> tuple:
    """(index split across threads, index fused with it into one parallel loop or None), among
    the safe candidates `cands` (in loop order, which follows memory order).

    The outermost candidate with at least SHORT values is split, so each thread works through
    a contiguous block of the output in the order the loops already had; when the outermost is
    shorter (a batch of 8 leaves chunks of 4 on 2 threads, but idle threads on more), it is
    fused with the next candidate in loop order (b and h of attention's p[b,h,i,j]: 64
    iterations, 0.34 -> 0.22 ms on 2 threads, instead of splitting i and moving it outermost).
    The innermost loop is split only when nothing else is: it is the contiguous, vectorised one.
    Indices of a triangular mask (`tri`) do unequal work per value and are split only when
    nothing else can be; indices in a guard are not fused.  When the outer candidates cannot
    give SHORT iterations this way, the longest candidate is split, moved outermost (fused with
    the next longest when short).  The choice depends on the ranges only, never on the thread
    count, so every thread count computes each element the same way.  `fuse=False`: no
    fused pair (a register-blocked nest, schedule.jam_choice, takes one parallel loop)."""
    plain = [n for n in cands if n not in tri] or cands
    outer = [n for n in plain if n != order[-1]] or plain
    first = outer[0]
    if len(ranges[first]) >= SHORT:
        return first, None
    if (fuse and len(outer) > 1 and first not in guarded and outer[1] not in guarded
            and len(ranges[first]) * len(ranges[outer[1]]) >= SHORT):
        return first, outer[1]
    parallel = max(plain, key=lambda n: len(ranges[n]))
    others = [n for n in plain if n != parallel]
    # A short parallel loop leaves threads idle: fuse it with the next longest safe loop.
    if fuse and len(ranges[parallel]) < SHORT and others and parallel not in guarded:
        second = max(others, key=lambda n: len(ranges[n]))
        if second not in guarded:
            return parallel, second
    return parallel, None


def triangular(eq: Equation) -> set[str]:
    """The indices of a mask that bounds a combination of loop indices on one side only
    (`(j <= i)`: j's clipped loop grows with i, so the values of i, or of j, do unequal
    work); a band bounded on both sides (`lo <= p - i < hi`, as the shifted left-hand side
    rewrite writes) does about the same work for every value."""
    gs = [g for f in top_factors(eq.rhs) for g in mask_guards(f) or ()
          if len(g.expr.names) > 1 and g.cond is None]
    bounded = {}
    for g in gs:
        key = frozenset(g.expr.terms)
        bounded.setdefault(key, set()).add("hi" if g.hi is not None else "lo")
        if g.lo is not None and g.hi is not None:
            bounded[key].add("lo")
    out = set()
    for g in gs:
        key, neg = frozenset(g.expr.terms), frozenset((n, -c) for n, c in g.expr.terms)
        sides = bounded[key] | {"lo" if s == "hi" else "hi" for s in bounded.get(neg, ())}
        if len(sides) < 2:
            out |= set(g.expr.names)
    return out
