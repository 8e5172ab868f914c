"""Solving shifted left-hand positions for one index: scatter -> gather.

`y[i+j] += x[i] * h[j]` writes y[p] once for every (i, j) with i+j == p.  Solving p = i+j for
the unit-coefficient index i gives the equivalent gather `y[p] += x[p-j] * h[j]`, restricted to
the tuples the original statement iterates: `lo_i <= p-j < hi_i`.  That restriction is a mask
factor whose bounds are runtime parameters (no recompile per shape); code generation turns it
into clipped loop bounds.  Each left-hand position is then a bare index, so distinct values of
p write distinct elements and the loop over p is thread-safe.

Used by the forward pass (shifted left-hand sides) and by gradients (which always move the
forward's shifted reads to the left).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .ir import (Access, Affine, Binary, Compare, Const, Equation, Gather, IndexValue, Param,
                 Unary, Wrapped, map_expr, rename_reads)


@dataclass(frozen=True)
class Solved:
    """The rewritten equation, the new indices (index -> (left position, affine it replaced)),
    and the runtime bound parameters of the masks (param name -> (index, 'lo' | 'hi'))."""
    equation: Equation
    new_indices: dict
    bound_params: dict


def fresh_names(taken: set[str], count: int) -> list[str]:
    """Readable new index names a user's expression does not use."""
    out = []
    for cand in ["p", "q", "r", "u", "v", "w", "m", "n"] + [f"p{k}" for k in range(1, 100)]:
        if cand not in taken and len(out) < count:
            out.append(cand)
    return out


def needs_rewrite(eq: Equation) -> bool:
    return any(isinstance(s, Affine) and s.terms and not s.is_bare for s in eq.lhs.indices)


def is_scatter(eq: Equation) -> bool:
    """Left-hand side with a gather or a position that no rewrite can make bare."""
    return any(not isinstance(s, Affine) or (s.terms and not s.is_bare) for s in eq.lhs.indices)


def choose_eliminations(eq: Equation) -> list[tuple[int, str]] | None:
    """For every shifted left position, an index with coefficient +-1 to solve for, used in no
    other left position.  None when some position has none (a scatter stays a scatter)."""
    return eliminations(eq.lhs.indices)


def eliminations(lhs: tuple) -> list[tuple[int, str]] | None:
    """choose_eliminations for the left-hand positions `lhs`."""
    chosen: list[tuple[int, str]] = []
    used: set[str] = set()
    for d, slot in enumerate(lhs):
        if not isinstance(slot, Affine) or not slot.terms or slot.is_bare:
            continue
        others = {n for e, s in enumerate(lhs) if e != d for n in s.names}
        options = [n for n, c in slot.terms if abs(c) == 1 and n not in others and n not in used]
        if not options:
            return None
        # Prefer eliminating an index that is a left index of a bare read (the cotangent, in a
        # gradient): its mask then coincides with that array's extent.
        pick = options[0]
        chosen.append((d, pick))
        used.add(pick)
    return chosen


def solve(eq: Equation) -> Solved | None:
    """Rewrite a shifted left-hand side into a gather, or None if it must stay a scatter."""
    if not needs_rewrite(eq) or any(isinstance(s, (Gather, Wrapped)) for s in eq.lhs.indices):
        return None
    plan = choose_eliminations(eq)
    if plan is None:
        return None
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
    names = fresh_names(taken, len(plan))
    subst: dict[str, Affine] = {}
    new_indices, bound_params, masks = {}, {}, []
    lhs = list(eq.lhs.indices)
    for (d, v), p in zip(plan, names):
        slot = lhs[d]
        c = slot.coef(v)
        rest = Affine.of(tuple(t for t in slot.terms if t[0] != v), slot.const)
        # p = c*v + rest  =>  v = c*(p - rest)   (c is +-1)
        value = (Affine.of(((p, 1),)) + rest.scale(-1)).scale(c)
        subst[v] = value
        lhs[d] = Affine(((p, 1),), 0, slot.span)
        new_indices[p] = (d, slot)
        lo, hi = f"_lo_{v}", f"_hi_{v}"
        bound_params[lo], bound_params[hi] = (v, "lo"), (v, "hi")
        masks.append(Compare(("<=", "<"), (Param(lo), affine_expr(value), Param(hi))))
    # Substituting may reintroduce an eliminated index through another; apply to a fixpoint.
    rhs = substitute_expr(eq.rhs, subst)
    for m in masks:
        rhs = Binary("*", rhs, substitute_expr(m, subst))
    new = replace(eq, lhs=Access(eq.lhs.array, tuple(lhs), eq.lhs.span), rhs=rhs)
    return Solved(new, new_indices, bound_params)


# ----------------------------------------------------------------------------- substitution
def affine_expr(a: Affine):
    """An Affine as a value expression of IndexValues (for masks and naked indices)."""
    out = None
    for name, coef in a.terms:
        term = IndexValue(name) if abs(coef) == 1 else Binary("*", Const(abs(coef)), IndexValue(name))
        if out is None:
            out = term if coef > 0 else Unary("-", term)
        else:
            out = Binary("+" if coef > 0 else "-", out, term)
    if out is None:
        return Const(a.const)
    if a.const:
        out = Binary("+" if a.const > 0 else "-", out, Const(abs(a.const)))
    return out


def substitute_slot(slot, subst: dict[str, Affine]):
    """Substitute indices in one bracket position.  A position that stops being a plain index
    becomes `pad(...)` without amounts: it no longer constrains ranges (the masks do)."""
    if isinstance(slot, Affine):
        new = slot
        for v, val in subst.items():
            new = new.substitute(v, val)
        if new == slot:
            return slot
        new = Affine(new.terms, new.const, slot.span)
        return new if new.is_bare or not new.terms else Wrapped("pad", new, None, None, slot.span)
    if isinstance(slot, Gather):
        idx = tuple(substitute_slot_plain(a, subst) for a in slot.indices)
        return Gather(slot.array, idx, substitute_slot_plain(slot.offset, subst), slot.span)
    inner = slot.inner
    new_inner = (substitute_slot_plain(inner, subst) if isinstance(inner, Affine)
                 else substitute_slot(inner, subst))
    if new_inner == inner:
        return slot
    lo, hi = (slot.lo, slot.hi) if slot.kind != "pad" else (None, None)
    return Wrapped(slot.kind, new_inner, lo, hi, slot.span)


def substitute_slot_plain(a: Affine, subst: dict[str, Affine]) -> Affine:
    new = a
    for v, val in subst.items():
        new = new.substitute(v, val)
    return Affine(new.terms, new.const, a.span)


def substitute_expr(e, subst: dict[str, Affine]):
    def one(n):
        if isinstance(n, Access):
            return Access(n.array, tuple(substitute_slot(s, subst) for s in n.indices), n.span)
        if isinstance(n, IndexValue) and n.name in subst:
            return affine_expr(subst[n.name])
        return n
    return map_expr(e, one)


def solved_ranges(solved: Solved, ranges: dict[str, range], out_shape: tuple[int, ...]):
    """Ranges of the rewritten equation and values of its bound parameters, from the forward's
    ranges: p covers the left position's values (within the output), the eliminated index's
    forward range becomes the mask bounds."""
    new_ranges = {n: r for n, r in ranges.items()}
    params = {}
    for p, (d, slot) in solved.new_indices.items():
        lo = hi = slot.const
        empty = False
        for name, coef in slot.terms:
            r = ranges[name]
            if len(r) == 0:
                empty = True
                break
            lo += min(coef * r.start, coef * (r.stop - 1))
            hi += max(coef * r.start, coef * (r.stop - 1))
        lo, hi = max(lo, 0), min(hi + 1, out_shape[d])
        new_ranges[p] = range(lo, max(lo, hi)) if not empty else range(0, 0)
    for name, (v, side) in solved.bound_params.items():
        params[name] = ranges[v].start if side == "lo" else ranges[v].stop
    for v in {v for v, _ in solved.bound_params.values()}:
        new_ranges.pop(v, None)
    return new_ranges, params


@dataclass(frozen=True)
class Lowered:
    """What the loops actually run: the statement after the shifted-LHS rewrite and with reads
    of the output at other positions renamed to a snapshot `_old_<out>`."""
    equation: Equation
    ranges: dict
    bound_params: dict
    solved: Solved | None
    snapshot: bool


def reads_output_elsewhere(eq: Equation) -> bool:
    """The right side reads the output other than at exactly the written element (or the left
    side is a scatter): it must read a copy taken before the statement."""
    if eq.assign == ":=":
        return False
    scatter = is_scatter(eq)
    return any(acc.array == eq.output and (scatter or acc.indices != eq.lhs.indices)
               for acc in eq.accesses())


def injective(eq: Equation, ranges: dict) -> bool:
    """Whether a `+=` / `-=` statement without reduction indices whose shifted left-hand
    positions `solve` rewrites writes each element at most once over `ranges`: every shifted
    position is c*h + e (+ a constant) with e the index solved for, of at most |c| values
    (pooling's gradient: stride >= window), and some position is a bare index (threads split
    over it).  Its loops then run over the written elements only, as the scatter it is written
    as (Kernel.plan_for), not over every element of the output with one-iteration loops for h
    (max-pool's dx, 16x32x64x64: 4.4 -> 1.5 ms)."""
    if eq.assign not in ("+=", "-=") or set(eq.indices) != set(eq.lhs_indices):
        return False
    chosen = choose_eliminations(eq)
    if not chosen or not any(isinstance(s, Affine) and s.is_bare and len(ranges[s.names[0]]) > 1
                             for s in eq.lhs.indices):
        return False
    for d, e in chosen:
        other = [c for n, c in eq.lhs.indices[d].terms if n != e]
        if len(other) != 1 or abs(other[0]) < len(ranges[e]):
            return False
    return True


def unsolved(eq: Equation, ranges: dict) -> Lowered:
    """`lower` without the rewrite: the statement's loops run as the scatter it is written as."""
    return replace(_renamed(eq, None), ranges=ranges)


def _renamed(eq: Equation, solved: Solved | None) -> Lowered:
    """`lower`'s static part: `eq` as `solved` rewrote it (None: as written), its reads of the
    output at other positions renamed to the snapshot."""
    work = solved.equation if solved is not None else eq
    snapshot = reads_output_elsewhere(work)
    if snapshot:
        work = replace(work, rhs=rename_reads(work.rhs, eq.output, "_old_" + eq.output))
    return Lowered(work, None, {}, solved, snapshot)


def lower(eq: Equation, ranges: dict | None = None, out_shape=None,
          static: Lowered | None = None) -> Lowered:
    """Rewrite and snapshot renaming; with the forward's ranges and the output's shape, also
    the ranges and mask bounds of the rewritten statement.  `static`, the result of
    `lower(eq)`, skips the symbolic part (it depends on the statement alone)."""
    if static is None:
        static = _renamed(eq, solve(eq))
    if ranges is None or static.solved is None:
        return replace(static, ranges=ranges)
    rng, bounds = solved_ranges(static.solved, ranges, out_shape)
    return replace(static, ranges=rng, bound_params=bounds)
