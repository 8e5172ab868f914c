"""Several accumulating statements over the same index tuples, rendered as one loop nest.

The gradients of one forward with respect to each of its inputs usually iterate the same
tuples: the local convolution's `dx[p,q,c1,b] += dout[p-i,q-j,c2,b] * W[p,q,i,j,c1,c2]` and
`dW[p,q,i,j,c1,c2] += dout[p-i,q-j,c2,b] * x[p,q,c1,b]` both run over (p,q,i,j,c1,c2,b) with
the same clipped bounds.  Run one after the other, each streams dout and its other operand
through memory; in one loop nest the shared reads are loaded once and both sums use them.

Rules (checked by `fusable`):
- every statement accumulates (`+=` / `-=`) a sum, without a finaliser, into its own array at
  bare left-hand indices (no scatter), or assigns (`=`) one element per tuple (every index on
  its left: a gradient array its statement overwrites, vjp_plan.overwrites), and no
  statement reads another's output;
- all have the same indices, ranges, guards, result dtype and pad value;
- the loop split across threads is bare on every left-hand side (each thread writes its own
  elements of every output), so the fused kernel is as race-free as each statement alone; or,
  for a statement whose left-hand side lacks it (the column sum `dg[j] += dy[i,j] * ...` in a
  nest split over rows i), that loop runs in CHUNKS blocks under the prange and such a
  statement sums each block into its own zeroed partial array (`_p<k>[_c, j]`), added to its
  output in block order after the loops (a fixed order: results do not depend on the number
  of threads).  Allowed while the partials are small next to the work (PARTIAL_SHARE).

The loop order and the reads loaded into locals are decided by schedule.fuse (a Fused).  In
the innermost loop, a statement whose left-hand side does not depend on it sums into a
register, added after the loop; the others update their output in place.  The sums then run in another order than the statements' own kernels: results
agree to rounding, not bit for bit (`fuse=False` runs the statements one by one).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..schedule import CHUNKS, Fused, Plan, fuse_base, safe_indices
from .emit import Emitter
from .expr import Expr, hoist_table
from .nest import Nest, nonneg_indices, nonunit_indices
from .source import SUM_FASTMATH, Source
from .text import pad_line, rename_access, rename_plan, user_arg


PARTIAL_SHARE = 8   # partial arrays (CHUNKS copies of an output) at most 1/8 of the tuples


def fusable(plans: list[Plan], ranges: list[dict]) -> bool:
    """Whether `plans` (with the index ranges each runs over) can run as one loop nest."""
    if len(plans) < 2:
        return False
    base = base_plan(plans)
    outputs = [p.equation.output for p in plans]
    if len(set(outputs)) != len(outputs) or base.chunked or base.collapse or base.block:
        return False
    par = [l.index for l in base.loops if l.parallel]
    tuples = 1
    for r in ranges[0].values():
        tuples *= len(r)
    for p, r in zip(plans, ranges):
        eq = p.equation
        if (p.scatter or eq.reducer != "+" or eq.finaliser or eq.assign not in ("+=", "-=", "=")
                or (eq.assign == "=" and set(eq.lhs_indices) != set(eq.indices))
                or set(eq.indices) != set(base.equation.indices) or r != ranges[0]
                or set(p.guards) != set(base.guards) or p.out_dtype != base.out_dtype
                or p.pad_value != base.pad_value or p.fastmath != base.fastmath
                or any(n in outputs for n in eq.arrays)):
            return False
        if not set(par) <= safe_indices(eq):
            size = CHUNKS
            for n in eq.lhs_indices:
                size *= len(r[n])
            if size * PARTIAL_SHARE > tuples:
                return False
    return True


def partial_members(fz: Fused) -> list[int]:
    """The statements of `fz` whose left-hand side lacks the loop split across threads: they
    sum into per-block partial arrays (`fusable`)."""
    par = [l.index for l in fz.plans[fz.base].loops if l.parallel]
    return [k for k, p in enumerate(fz.plans) if not set(par) <= safe_indices(p.equation)]


def base_plan(plans: list[Plan]) -> Plan:
    """The plan whose loop order the fused kernel takes (schedule.fuse)."""
    return plans[fuse_base(plans)]


def render(fz: Fused) -> Source:
    """One kernel running every statement of `fz` (schedule.fuse of `fusable` plans); user
    names appear renamed (text.rename_plan), `args` are the caller's names."""
    renamed = replace(fz, plans=tuple(rename_plan(p) for p in fz.plans),
                      reads=tuple((k, rename_access(a), level) for k, a, level in fz.reads))
    src = _render(renamed, fz.plans)
    return replace(src, args=tuple(user_arg(a) for a in src.args))


def _render(fz: Fused, shown: tuple) -> Source:
    plans = fz.plans
    base = plans[fz.base]
    loops = base.loops
    n = len(loops)
    inner = loops[-1].index
    out = Emitter()
    partial = partial_members(fz)
    if partial:     # the parallel loop runs in blocks, each with its own partial sums
        base = replace(base, chunked=next(l.index for l in loops if l.parallel))
    eqs = [p.equation for p in plans]
    nest = Nest(base, out, Expr(base), nonneg_indices(base, eqs), nonunit_indices(eqs))
    # One table of hoisted reads: a read shared by two statements is one load.
    hoists = hoist_table((a, level) for _, a, level in fz.reads)
    renders = [Expr(p, hoists=hoists) for p in plans]
    for x in renders:       # positions along the innermost index unsigned (Expr.lane_indices)
        x.lane_indices = frozenset({inner})
    # The innermost loop keeps its bounds as arguments: with constant bounds the compiler
    # unrolls it into straight-line code that it cannot vectorise past the stores (local
    # convolution, fused dx and dW: 4.9 ms unrolled, 2.9 ms as a loop).
    reads = [(f"_h{j}", level, a, renders[k])     # (local, loop level, read, its renderer)
             for j, (k, a, level) in enumerate(fz.reads)]
    arrays = [p.equation.output for p in plans]
    arrays += list(dict.fromkeys(a for p in plans for a in p.equation.arrays if a not in arrays))
    params = list(dict.fromkeys(q for p in plans for q in p.equation.params))
    bounds = [f"_{w}_{l.index}" for l in loops for w in ("start", "stop")]
    dtype = np.dtype(base.out_dtype)
    lines = ["# fused: " + "; ".join(str(p.equation) for p in shown),
             "# loops (outer to inner): " + ", ".join(
                 f"{l.index}{' [threads]' if l.parallel else ''}" for l in shown[fz.base].loops),
             f"_T = _np.{dtype.name}", *filter(None, [pad_line(base)]),
             f"def _tullio_fused({', '.join(arrays + params + bounds)}):"]
    if partial:
        nest.open_chunks("\n".join(f"_p{k} = _np.zeros((_nc,) + {plans[k].equation.output}"
                                   ".shape, _T)" for k in partial))
    for k in range(n - 1):
        nest.open(k, hoist=False)
    for name, level, a, r in reads:
        if level == n - 2:
            out.add(f"{name} = {r.plain_access(a)}")
    stores = []
    for k, (p, r) in enumerate(zip(plans, renders)):
        eq = p.equation
        op = eq.assign
        lhs = r.lhs()
        term = r.rhs_without_guards()
        if k in partial:    # its block's partial sum: `out[j]` -> `_p<k>[_c, j]`
            lhs, op = f"_p{k}[_c, {lhs.split('[', 1)[1]}", "+="
        if inner in eq.lhs_indices:
            stores.append((None, f"{lhs} {op} {term}"))
        else:
            out.add(f"_acc{k} = _T(0)")
            stores.append((f"{lhs} {op} _acc{k}", f"_acc{k} += {term}"))
    level = out.depth
    nest.open(n - 1, hoist=False)
    for name, lev, a, r in reads:
        if lev == n - 1:
            out.add(f"{name} = {r.plain_access(a)}")
    for _, step in stores:
        out.add(step)
    out.depth = level
    for after, _ in stores:
        if after:
            out.add(after)
    out.depth = 1
    for k in partial:       # the blocks' partial sums, in block order
        p = plans[k].equation
        out.add(f"for _c in range(_nc):\n    {p.output} {p.assign} _p{k}[_c]")
    lines += out.lines()
    fastmath = base.fastmath or (SUM_FASTMATH if dtype.kind in "fc" else False)
    return Source("\n".join(lines) + "\n", "_tullio_fused", tuple(arrays + params + bounds),
                  any(l.parallel for l in loops), fastmath)

