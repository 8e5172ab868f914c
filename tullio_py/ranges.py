"""Index ranges from array shapes, shifts, gathers and `ranges=` (Tullio's rules, 0-based).

Every array position gives a constraint `lo <= affine < hi` on the indices in it:
- an index used only bare (`A[i]`) must have the same extent everywhere;
- an index used shifted or scaled anywhere gets the intersection of all its constraints, so
  every access is in bounds for every combination of the other indices ("valid" semantics);
- `ranges=` adds a constraint; `pad(e, lo, hi)` widens one; `pad(e)`, `clamp(e)`, `mod(e)`
  drop it; a gather `A[J[k]+i]` treats J's values as an index running over [min J, max J].
This is the only place that proves array accesses are in bounds: numba does not check them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import RangeError
from .ir import Access, Affine, Equation, Gather, Wrapped, slot_names


@dataclass(frozen=True)
class Constraint:
    expr: Affine        # lo <= expr < hi must hold for every iterated index tuple
    lo: int
    hi: int
    source: Access      # for error messages
    dim: int


def _floordiv(a: int, b: int) -> int:
    return a // b


def _ceildiv(a: int, b: int) -> int:
    return -((-a) // b)


def interval_for(coef: int, rest_lo: int, rest_hi: int, lo: int, hi: int) -> tuple[int, int]:
    """The values of v (as a half-open interval) with lo <= coef*v + r < hi for every r in
    [rest_lo, rest_hi] (inclusive)."""
    # coef*v >= lo - rest_lo  and  coef*v <= hi - 1 - rest_hi
    a, b = lo - rest_lo, hi - 1 - rest_hi
    if coef > 0:
        return _ceildiv(a, coef), _floordiv(b, coef) + 1
    return _ceildiv(b, coef), _floordiv(a, coef) + 1


def affine_bounds(expr: Affine, ranges: dict[str, tuple[int, int]], skip: str | None = None):
    """Inclusive [min, max] of expr (without index `skip`) over the given half-open ranges."""
    lo = hi = expr.const
    for name, coef in expr.terms:
        if name == skip:
            continue
        a, b = ranges[name]
        if b <= a:          # empty range: no tuple is iterated, nothing to constrain
            return None
        lo += min(coef * a, coef * (b - 1))
        hi += max(coef * a, coef * (b - 1))
    return lo, hi


def _strict_indices(eq: Equation) -> set[str]:
    """Indices used only bare, in every position of every access (left side included)."""
    uses: dict[str, bool] = {}
    for acc in [eq.lhs] + eq.accesses():
        for slot in acc.indices:
            inners = [slot]
            if isinstance(slot, Gather):
                inners = list(slot.indices) + [slot.offset]
            for part in inners:
                bare = isinstance(part, Affine) and part.is_bare
                for n in part.names:
                    uses[n] = uses.get(n, True) and bare
            if isinstance(slot, Wrapped):
                for n in slot.names:
                    uses[n] = False
    for g in eq.gathers():
        for part in g.indices:
            for n in part.names:
                uses[n] = uses.get(n, True) and part.is_bare
    return {n for n, bare in uses.items() if bare}


def constraints(eq: Equation, shapes: dict[str, tuple[int, ...]],
                extrema: dict[str, tuple[int, int]]) -> list[Constraint]:
    """One constraint per array position.  The left side constrains only in-place forms."""
    accesses = eq.accesses() if eq.assign == ":=" else [eq.lhs] + eq.accesses()
    gathers = [g for acc in accesses for s in acc.indices
               for g in ([s.inner] if isinstance(s, Wrapped) else [s]) if isinstance(g, Gather)]
    if eq.assign == ":=":
        gathers += [s for s in eq.lhs.indices if isinstance(s, Gather)]
    out = []
    for g in gathers:   # the index array's own positions
        gacc = Access(g.array, g.indices, g.span)
        for d, part in enumerate(g.indices):
            out.append(Constraint(part, 0, shapes[g.array][d], gacc, d))
    for acc in accesses:
        for d, slot in enumerate(acc.indices):
            n = shapes[acc.array][d]
            if isinstance(slot, Affine):
                out.append(Constraint(slot, 0, n, acc, d))
            elif isinstance(slot, Gather):
                jlo, jhi = extrema.get(slot.array, (0, -1))
                if jhi >= jlo:      # empty index array: nothing is read
                    out.append(Constraint(slot.offset, -jlo, n - jhi, acc, d))
            elif slot.kind == "pad" and slot.lo is not None:
                inner = slot.inner
                if isinstance(inner, Gather):
                    continue        # checked per element at run time
                out.append(Constraint(inner, -slot.lo, n + slot.hi, acc, d))
    return out


def _fail(eq: Equation, rule: str, span, hint: str | None = None):
    raise RangeError(rule, eq.text or str(eq), span if eq.text else None, hint)


def _describe(c: Constraint) -> str:
    return f"{c.source.array} has {c.hi if c.lo == 0 else c.hi - c.lo} along dimension {c.dim}"


def infer(eq: Equation, shapes: dict[str, tuple[int, ...]],
          extrema: dict[str, tuple[int, int]] | None = None,
          given: dict[str, range] | None = None) -> dict[str, range]:
    """The range of every index of `eq`, as a dict of unit-step `range`s."""
    extrema = extrema or {}
    given = given or {}
    cons = constraints(eq, shapes, extrema)
    strict = _strict_indices(eq)
    known: dict[str, tuple[int, int]] = {}
    first_bare: dict[str, Constraint] = {}
    for name, r in given.items():
        known[name] = (r.start, r.stop)
    for c in cons:
        if c.expr.terms and len(c.expr.terms) == 1:
            (name, coef), = c.expr.terms
            lo, hi = interval_for(coef, c.expr.const, c.expr.const, c.lo, c.hi)
            if name in strict and name not in given:
                if name in first_bare and (lo, hi) != known[name]:
                    prev = first_bare[name]
                    _fail(eq, f"index {name} must have the same extent everywhere it is used bare: "
                              f"{_describe(prev)}, but {_describe(c)}", c.source.span,
                          f'use arrays of the same length, or restrict it with ranges={{"{name}": ...}}')
                first_bare.setdefault(name, c)
                known[name] = (lo, hi)
            elif name in known:
                a, b = known[name]
                known[name] = (max(a, lo), min(b, hi))
            else:
                known[name] = (lo, hi)
        elif not c.expr.terms and not (c.lo <= c.expr.const < c.hi):
            _fail(eq, f"constant index {c.expr.const} is out of bounds: {_describe(c)}",
                  c.expr.span or c.source.span)
    for name, r in given.items():
        for c in cons:
            if c.expr.is_bare and c.expr.names == (name,) and not (0 <= r.start and r.stop <= c.hi
                                                                  or r.stop <= r.start):
                _fail(eq, f"ranges= gives {name} the range {r.start}:{r.stop}, but "
                          f"{_describe(c)}", c.source.span)
    # Positions with several indices: solve for the unknown one, or narrow a known shifted one.
    multi = [c for c in cons if len(c.expr.terms) > 1]
    changed = True
    while changed:
        changed = False
        for c in multi:
            unknown = [n for n in c.expr.names if n not in known]
            if len(unknown) > 1:
                continue
            if unknown:
                target = unknown[0]
            else:
                movable = [n for n in c.expr.names if n not in strict and n not in given]
                if not movable:
                    movable = [n for n in c.expr.names if n not in strict]
                if not movable:
                    continue
                target = movable[0]
            rest = affine_bounds(c.expr, known, skip=target)
            if rest is None:
                continue
            lo, hi = interval_for(c.expr.coef(target), rest[0], rest[1], c.lo, c.hi)
            if target in known:
                a, b = known[target]
                lo, hi = max(a, lo), min(b, hi)
                if (lo, hi) == (a, b) or (b <= a):
                    continue
            known[target] = (lo, hi)
            changed = True
    for name in eq.indices:
        if name not in known:
            _fail(eq, f"cannot infer the range of index {name}: no array position, or only "
                      "pad()/clamp()/mod() positions, constrain it", _first_use(eq, name),
                  f'pass ranges={{"{name}": ...}}, or use {name} bare in some array')
    return {n: range(a, max(a, b)) for n, (a, b) in known.items() if n in eq.indices or n in given}


def _first_use(eq: Equation, name: str):
    for acc in [eq.lhs] + eq.accesses():
        for slot in acc.indices:
            if name in slot.names:
                return slot.span or acc.span
    import re
    m = re.search(rf"\b{re.escape(name)}\b", eq.text)
    return (m.start(), m.end()) if m else None


def output_shape(eq: Equation, ranges: dict[str, range],
                 extrema: dict[str, tuple[int, int]] | None = None) -> tuple[int, ...]:
    """Shape of a new (`:=`) output: each position's largest value + 1; must start at 0."""
    extrema = extrema or {}
    iv = {n: (r.start, r.stop) for n, r in ranges.items()}
    shape = []
    for slot in eq.lhs.indices:
        # a position whose own indices have an empty range has no elements (an empty range
        # elsewhere, e.g. a reduction over nothing, leaves the other extents as they are)
        empty = any(len(ranges[n]) == 0 for n in slot_names(slot) if n in ranges)
        if isinstance(slot, Gather):
            jlo, jhi = extrema.get(slot.array, (0, -1))
            off = affine_bounds(slot.offset, iv)
            if jhi < jlo or off is None or empty:
                shape.append(0)
                continue
            lo, hi = jlo + off[0], jhi + off[1]
            if lo < 0:
                _fail(eq, f"a new array cannot have negative positions: {slot} reaches {lo}",
                      slot.span, "add an offset to the index array")
            shape.append(hi + 1)
            continue
        b = affine_bounds(slot, iv)
        if b is None or empty:
            shape.append(0)
            continue
        if b[0] != 0:
            _fail(eq, f"a new array (':=') must start at position 0, but {slot} runs from "
                      f"{b[0]} to {b[1]}", slot.span,
                  f"rebase it: shift the index so it starts at 0 (e.g. write "
                  f"{slot}{-b[0]:+d} on the left and adjust the right), or give ranges=")
        shape.append(b[1] + 1)
    return tuple(shape)
