"""Index ranges from array shapes, shifts, gathers and `ranges=` (Tullio's rules, 0-based).

Every array position gives a constraint `lo <= affine < hi` on the indices in it:
- an index used only bare (`A[i]`) must have the same extent everywhere;
- an index used shifted or scaled anywhere (`A[i+1]`, `A[2i]`, and `A[i+0]`, which asks for
  exactly this) gets the intersection of all its constraints, so every access is in bounds for
  every combination of the other indices ("valid" semantics);
- `ranges=` adds a constraint; `pad(e, lo, hi)` widens one; `pad(e)`, `clamp(e)`, `mod(e)`
  drop it; a gather `A[J[k]+i]` treats J's values as an index running over [min, max] of
  the elements of J the statement can read (`J[0,k]` reads row 0 only: gather_extrema); a
  gather without an index in its offset (`A[J[k]]`) is checked once the ranges are known,
  over exactly the elements the loops read.
- a top-level mask `(lo <= i < hi)` with integer bounds gives the range of an index that no
  array position constrains (elsewhere a mask only restricts the iteration, as a guard).
This is the only place that proves array accesses are in bounds: numba does not check them.

A position holding several indices (`x[i+j]`) constrains them jointly, and when each of them
already has a range of its own, some index must yield.  Which one never depends on the order
the terms or factors are written in:
1. positions holding one index give each index its own range (equal bare extents, intersected
   shifted ones, `ranges=`);
2. in a position whose indices all have their own ranges, the index of the lowest tier
   yields (is narrowed): a left-hand index before a reduction index; an index given by
   `ranges=` never yields.  Positions whose lowest index is a reduction index are settled
   first, so each narrowing meets final ranges only; narrowings of one index intersect;
3. an index with no range of its own is solved from the positions where it is the only index
   left unknown, in waves (all indices of a wave at once, each over all such positions);
4. every position is then checked; one that two indices of the same tier could both satisfy
   by narrowing is a RangeError asking for `ranges=`, never a guess.

Worked example: `y[i] := x[i+j] * h[j] * z[i]` with x of 10, h of 3, z of 10 elements.
Step 1: i in 0:10 (from z), j in 0:3 (from h).  Step 2: x[i+j] needs 0 <= i+j < 10 for all
pairs; i is a left-hand index, j a reduction index, so i yields: i + 2 < 10 gives i in 0:8, and
each of y's 8 elements is the full three-term sum.  Writing `x[j+i]`, or the factors in any
other order, gives the same.  (Narrowing j to 0:1 instead would silently drop two of the three
terms from every element: the shape of the output, not its values, absorbs the shift.)
`y[i,j] := x[i+j] * a[i] * b[j]` with x too short for a and b is the same-tier case of step 4.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import RangeError
from .ir import (Access, Affine, Binary, Compare, Const, Equation, Gather, IndexValue, Unary,
                 Wrapped, slot_names)


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
                # empty index array: nothing is read; no index in the offset: the values are
                # checked against the elements read once the ranges are known (gather_extrema)
                if jhi >= jlo and slot.offset.terms:
                    out.append(Constraint(slot.offset, -jlo, n - jhi, acc, d))
            elif slot.kind == "pad" and slot.lo is not None:
                inner = slot.inner
                if isinstance(inner, Gather):
                    continue        # checked per element at run time
                out.append(Constraint(inner, -slot.lo, n + slot.hi, acc, d))
    return out


def read_box(g: Gather, rng: dict[str, range] | None = None) -> tuple:
    """A numpy index selecting the elements of g's index array that the loops read (a superset
    where a position mixes indices).  Constant positions select one element; without `rng`,
    other positions select the whole dimension; with it, a position with one index selects
    the strided slice that index runs over, one with several the interval they span."""
    box = []
    for a in g.indices:
        if not a.terms:
            box.append(a.const)
        elif rng is None or any(n not in rng for n in a.names):
            box.append(slice(None))
        else:
            b = affine_bounds(a, {n: (r.start, r.stop) for n, r in rng.items()})
            if b is None:           # an empty range: nothing is read
                box.append(slice(0, 0))
            else:
                step = abs(a.terms[0][1]) if len(a.terms) == 1 else 1
                box.append(slice(b[0], b[1] + 1, step))
    return tuple(box)


def gather_extrema(eq: Equation, arrays: dict, rng: dict[str, range] | None = None) \
        -> dict[str, tuple[int, int]]:
    """(min, max) of each index array over the elements the statement reads from it (see
    read_box; without `rng`, an over-estimate fixed by the statement's text alone).  An array
    read at no element has no entry."""
    out: dict[str, tuple[int, int]] = {}
    for g in eq.gathers():
        J = arrays[g.array]
        if any(not (0 <= c < n) for c, n in zip(read_box(g), J.shape)
               if isinstance(c, int)):
            continue            # a constant position outside J: infer() reports it
        part = J[read_box(g, rng)]
        if part.size:
            lo, hi = int(part.min()), int(part.max())
            a, b = out.get(g.array, (lo, hi))
            out[g.array] = (min(a, lo), max(b, hi))
    return out


def _fail(eq: Equation, rule: str, span, hint: str | None = None):
    raise RangeError(rule, eq.text or str(eq), span if eq.text else None, hint)


def _describe(c: Constraint) -> str:
    return f"{c.source.array} has {c.hi if c.lo == 0 else c.hi - c.lo} along dimension {c.dim}"


def _tiers(eq: Equation, known: dict, given: dict) -> dict[str, int]:
    """Which index yields first when a position with several indices must be narrowed:
    0 a left-hand index, 1 a reduction index, 2 an index given by `ranges=` (never narrowed)."""
    left = set(eq.lhs_indices)
    return {n: 2 if n in given else 0 if n in left else 1 for n in known}


def _narrowed(c: Constraint, target: str, known: dict) -> tuple[int, int] | None:
    """The range of `target` that keeps c true for every value of the other indices."""
    rest = affine_bounds(c.expr, known, skip=target)
    if rest is None:
        return None
    return interval_for(c.expr.coef(target), rest[0], rest[1], c.lo, c.hi)


def _holds(c: Constraint, known: dict) -> bool:
    b = affine_bounds(c.expr, known)
    return b is None or (c.lo <= b[0] and b[1] < c.hi)


def _solve_unknowns(eq: Equation, multi: list[Constraint], known: dict):
    """Indices that only positions with several indices constrain, in waves: an index whose
    other indices in some position are all known gets the intersection over every such
    position, all indices of a wave at once (so the text's order plays no part)."""
    while True:
        wave: dict[str, tuple[int, int]] = {}
        for c in multi:
            unknown = [n for n in c.expr.names if n not in known]
            if len(unknown) != 1:
                continue
            r = _narrowed(c, unknown[0], known)
            if r is None:       # another index of the position has an empty range
                r = (0, 0)
            a, b = wave.get(unknown[0], r)
            wave[unknown[0]] = (max(a, r[0]), min(b, r[1]))
        if not wave:
            return
        known.update(wave)


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
    # 1. Positions holding one index: bare uses must agree, shifted ones intersect.
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
    for name, (lo, hi) in _mask_ranges(eq.rhs).items():
        if name not in known and not any(name in c.expr.names for c in cons):
            known[name] = (lo, hi)
    # 2. Positions holding several indices, all with a range from step 1: the one index of
    # the lowest tier yields, reduction tier first, so each target meets settled ranges only.
    multi = [c for c in cons if len(c.expr.terms) > 1]
    tier = _tiers(eq, known, given)
    for t in (1, 0):
        update: dict[str, tuple[int, int]] = {}
        for c in multi:
            if any(n not in tier for n in c.expr.names):
                continue        # holds an index step 3 solves for: that index yields
            low = min(tier[n] for n in c.expr.names)
            targets = [n for n in c.expr.names if tier[n] == low]
            if low != t or len(targets) != 1:
                continue        # several targets: checked in step 4
            r = _narrowed(c, targets[0], known)
            if r is not None:
                a, b = update.get(targets[0], known[targets[0]])
                update[targets[0]] = (max(a, r[0]), min(b, r[1]))
        known.update(update)
    # 3. Indices only such positions constrain are solved for.
    _solve_unknowns(eq, multi, known)
    for name in eq.indices:
        if name not in known:
            _fail(eq, f"cannot infer the range of index {name}: no array position, or only "
                      "pad()/clamp()/mod() positions, constrain it", _first_use(eq, name),
                  f'pass ranges={{"{name}": ...}}, or use {name} bare in some array')
    # 4. Every access is in bounds, or no rule says which index to narrow: an error.
    for c in multi:
        if not _holds(c, known):
            names = ", ".join(c.expr.names)
            if all(n in given for n in c.expr.names):
                _fail(eq, f"ranges= gives {names} ranges that take {c.expr} outside "
                          f"{c.lo}..{c.hi - 1}: {_describe(c)}", c.expr.span or c.source.span)
            _fail(eq, f"{c.expr} must stay in {c.lo}..{c.hi - 1} ({_describe(c)}), and "
                      f"nothing says which of {names} to narrow: each has a range of its own "
                      "and none ranks below the others (left-hand indices yield before "
                      "reduction indices)", c.expr.span or c.source.span,
                  "give ranges= for all but one of them")
    return {n: range(a, max(a, b)) for n, (a, b) in known.items() if n in eq.indices or n in given}


def _mask_ranges(rhs) -> dict[str, tuple[int, int]]:
    """Top-level factors `(lo <= i < hi)` with integer bounds: the range of an index that no
    array position constrains (printed gradients of clamp()/mod() reads carry the forward's
    range of such an index this way)."""
    def const(x):
        if isinstance(x, Unary) and x.op == "-":
            v = const(x.operand)
            return None if v is None else -v
        return x.value if isinstance(x, Const) and type(x.value) is int else None
    out, stack = {}, [rhs]
    while stack:
        e = stack.pop()
        if isinstance(e, Binary) and e.op == "*":
            stack += [e.left, e.right]
        elif (isinstance(e, Compare) and e.ops == ("<=", "<") and isinstance(e.operands[1], IndexValue)
              and const(e.operands[0]) is not None and const(e.operands[2]) is not None):
            out[e.operands[1].name] = (const(e.operands[0]), const(e.operands[2]))
    return out


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
