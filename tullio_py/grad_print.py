"""Edits that make a gradient statement printable with the bounds of a call (pure Equation
functions; gradient_kernel.py prints with them).

A gradient statement runs with the forward's ranges; printed, it must iterate exactly those
tuples when run alone with `tullio()`.  So the numbers of the call replace its parameters
(`subst_params`), masks the statement implies by itself are dropped (`drop_redundant`), and
an index whose own inferred range would be wider than the forward's gets an explicit mask
(`add_range_masks`).  Example: the gradient of `y[i] := x[i+j] * h[j]` with x of 10 and h
of 3 elements (i in 0:8) is rewritten to `dx[p] += dy[pad(p-j)] * h[j]` with the mask
`0 <= p-j < 8`; reading dy (8 elements) through pad(...) implies that mask, so it is dropped
and the statement prints as written here.
"""
from __future__ import annotations

from dataclasses import replace

from . import ranges as ranges_mod, schedule
from .errors import RangeError
from .ir import (Access, Affine, Binary, Compare, Const, Equation, Param, Wrapped, map_expr)


def subst_params(eq: Equation, values: dict) -> Equation:
    def f(e):
        return values.get(e.name, e) if isinstance(e, Param) else e
    return replace(eq, rhs=map_expr(eq.rhs, f))


def rebuild(factors):
    out = factors[0]
    for f in factors[1:]:
        out = Binary("*", out, f)
    return out


def drop_redundant(eq: Equation, shapes: dict, call_ranges: dict) -> Equation:
    """Remove top-level masks that the iteration satisfies anyway: by the ranges alone, or
    because a top-level pad read that the loops are clipped by (schedule.find_guards) guards
    the same expression at least as tightly."""
    factors = schedule.top_factors(eq.rhs)
    keep = []
    pad_guards = {}
    guarding = schedule.find_guards(eq, 0)[1]
    for f in factors:
        if isinstance(f, Access) and str(f) in guarding:
            for d, s in enumerate(f.indices):
                if isinstance(s, Wrapped):
                    pad_guards[Affine(s.inner.terms)] = (-s.inner.const,
                                                         shapes[f.array][d] - s.inner.const)
    dropped = []
    for f in factors:
        m = mask_bounds(f)
        if m is not None and _implied(*m, call_ranges, pad_guards):
            dropped.append(f)
            continue
        keep.append(f)
    if not keep:
        return replace(eq, rhs=Const(1))
    return replace(eq, rhs=_without(eq.rhs, {id(f) for f in dropped}))


def _without(e, drop: set):
    """Product `e` without the factors whose ids are in `drop`, the others multiplied in the
    order and grouping they had: `a * (b * c)` rounds otherwise than `a * b * c`, and the
    printed statement must round as the derived one (None when every factor is dropped)."""
    if isinstance(e, Binary) and e.op == "*":
        left, right = _without(e.left, drop), _without(e.right, drop)
        if left is None or right is None:
            return right if left is None else left
        return e if (left is e.left and right is e.right) else Binary("*", left, right)
    return None if id(e) in drop else e


def mask_bounds(f):
    """(affine, lo, hi) of a mask `lo <= affine < hi` with integer bounds (either may be None)."""
    if not isinstance(f, Compare) or len(f.ops) > 2:
        return None
    ops, xs = f.ops, f.operands
    if len(ops) == 2 and ops != ("<=", "<"):
        return None
    mid = schedule.linear(xs[1] if len(ops) == 2 else xs[0])
    if mid is None or mid[1]:
        return None
    a = Affine(mid[0].terms, mid[2])
    ints = [schedule.linear(x) for x in xs]
    if any(i is None or i[0].terms or i[1] for k, i in enumerate(ints) if k != (1 if len(ops) == 2 else 0)):
        return None
    if len(ops) == 2:
        return a, ints[0][2], ints[2][2]
    c = ints[1][2]
    return {"<": (a, None, c), "<=": (a, None, c + 1), ">=": (a, c, None), ">": (a, c + 1, None)}.get(ops[0])


def _implied(a: Affine, lo, hi, call_ranges, pad_guards) -> bool:
    b = ranges_mod.affine_bounds(a, {n: (r.start, r.stop) for n, r in call_ranges.items()})
    if b is None or ((lo is None or b[0] >= lo) and (hi is None or b[1] < hi)):
        return True
    for sign in (1, -1):
        pg = pad_guards.get(Affine(a.scale(sign).terms))
        if pg is not None and sign == 1:
            plo, phi = pg[0] + a.const, pg[1] + a.const
            return (lo is None or plo >= lo) and (hi is None or phi <= hi)
    return False


def add_range_masks(eq: Equation, shapes: dict, call_ranges: dict) -> Equation:
    """Masks `(a <= i < b)` for indices that tullio() alone would iterate over more values
    than vjp does (taking into account what the other masks and pad guards already imply)."""
    try:
        own = ranges_mod.infer(eq, {n: shapes[n] for n in [eq.output, *eq.arrays]})
    except RangeError:
        own = {}
    limits = _guard_limits(eq, shapes)
    masks = []
    for n in eq.indices:
        r, o = call_ranges[n], own.get(n)
        lo, hi = (o.start, o.stop) if o is not None else (None, None)
        for a, glo, ghi in limits:
            c = a.coef(n)
            if abs(c) != 1 or any(m not in call_ranges for m in a.names):
                continue
            rest = Affine.of(tuple(t for t in a.terms if t[0] != n), a.const)
            rb = ranges_mod.affine_bounds(rest, {m: (x.start, x.stop) for m, x in call_ranges.items()})
            if rb is None:
                continue
            if c == 1:    # glo <= n + rest < ghi
                new_lo = None if glo is None else glo - rb[1]
                new_hi = None if ghi is None else ghi - rb[0]
            else:         # glo <= -n + rest < ghi  =>  rest - ghi < n <= rest - glo
                new_lo = None if ghi is None else rb[0] - ghi + 1
                new_hi = None if glo is None else rb[1] - glo + 1
            if new_lo is not None:
                lo = new_lo if lo is None else max(lo, new_lo)
            if new_hi is not None:
                hi = new_hi if hi is None else min(hi, new_hi)
        need_lo = lo is None or lo < r.start
        need_hi = hi is None or hi > r.stop
        if need_lo and need_hi:
            masks.append(Compare(("<=", "<"), (Const(r.start), _iv(n), Const(r.stop))))
        elif need_lo:
            masks.append(Compare(("<=",), (Const(r.start), _iv(n))))
        elif need_hi:
            masks.append(Compare(("<",), (_iv(n), Const(r.stop))))
    if not masks:
        return eq
    return replace(eq, rhs=rebuild(schedule.top_factors(eq.rhs) + masks))


def _guard_limits(eq: Equation, shapes: dict) -> list:
    """(affine, lo, hi) of every top-level mask and every pad read that acts as a guard."""
    out, red = [], set(eq.reduction_indices)
    for f in schedule.top_factors(eq.rhs):
        m = mask_bounds(f)
        if m is not None:
            out.append(m)
        elif isinstance(f, Access) and eq.reducer == "+":
            pads = [(d, s) for d, s in enumerate(f.indices) if isinstance(s, Wrapped)]
            if pads and all(s.kind == "pad" and isinstance(s.inner, Affine) and red & set(s.names)
                            for _, s in pads):
                for d, s in pads:
                    out.append((s.inner, 0, shapes[f.array][d]))
    return out


def _iv(n):
    from .ir import IndexValue
    return IndexValue(n)
