"""Consecutive steps of a vjp plan that share a row index, as one "rows" step.

After vjp_plan.py chose the steps, consecutive "loops" and "fused" steps that satisfy
codegen/rows.py's rule run as one loop over blocks of rows, each step's own function running
over the block in turn (the argmax helper `(min) m_arg[i] := ...` of `(max) m[i] := x[i,j]`
and `dx[i,j] += dm[i] * where(j == m_arg[i], 1, 0)`: x's rows are read by the second while
the first left them in the cache).  Each member runs the code it runs alone, so the values are
those of the steps run one by one, on any number of threads (bit for bit unless a member
reorders sums: codegen/rows.py).  A column sum (`dg[j] += dy[i,j] * xhat[i,j]` in a group of
rows i) adds into a partial array per block, `partial_buffers`, summed in block order after
the blocks: the same bits on any number of threads, not those of the statement run alone.
A fused nest with per-block partial sums (codegen/fused.py) joins a group only where those
are the group's column sums.  Only with `fuse=True` (the default): `fuse=False` keeps one
kernel per statement.

Layer norm's gradient (4096x512 float32; dx, dmu, dvar by rows, dg and dbb by columns): the
fused nest and a row group of the rest, 2.40-2.53 ms on one thread and 1.54-1.88 ms on two;
one row group with the column sums, 2.07-2.16 and 1.42-1.45 ms.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import codegen, jit, memory, schedule
from .ir import Affine
from .codegen import fused, range_argument, rows as rows_mod
from .vjp_plan import Rows, Step, VjpPlan, arrays_of, as_ranges, standin


# Off: the grouped steps ran slower than the steps one by one where measured (a 2x2
# max-pool's gradient, 16x32x64x64 float32, one thread: 13.2 ms grouped, 6.4 ms alone, the
# members' code unchanged).  The rule and the code stay, tested, for when a group beats its
# members; `ENABLED = True` groups every vjp plan it applies to.
ENABLED = False
# Arrays that live only inside one row group are kept in blocks of rows (`block_local`);
# False allocates them whole (tests compare both).
LOCAL = True
# The most bytes of column sums' per-block partial arrays a group may take (codegen/rows.py);
# a group that would take more is not formed.
PARTIAL_BYTES = 4 << 20


def group(p: VjpPlan, kernel_for, values: dict, params: dict) -> VjpPlan:
    """`p` with its row groups as "rows" steps; `values`: the arrays and scalars the vjp
    reads, by name (its zeroed arrays are added as stand-ins).  `p` itself unless ENABLED."""
    if not ENABLED:
        return p
    values = {**values, **{a.name: standin(a.shape, a.dtype) for a in p.arrays}}
    kernels = [kernel_for(s.equation) for s in p.statements]
    steps = row_groups(list(p.steps), p.statements, kernels, values, params, True)
    return p if steps == p.steps else replace(p, steps=steps)


def row_groups(steps: list, statements, kernels: list, values: dict, params: dict,
               fuse: bool, block_bytes: int | None = None,
               sums_block_bytes: int | None = None) -> tuple[Step, ...]:
    """Consecutive "loops" and "fused" steps that share a row index by codegen/rows.py's rule
    (the argmax helper `(min) m_arg[i] := ...` and `dx[i,j] += dm[i] * where(j == m_arg[i],
    1, 0)`) as one "rows" step (with `fuse`; each runs its own function, so the values are
    those of the steps run one by one, bit for bit); `block_bytes`: the bytes of a block's
    rows (codegen/rows.py's BLOCK_BYTES by default), `sums_block_bytes` (default: the
    same) those of a group with column sums, whose every block adds a partial array of its
    own: small blocks that keep a block's rows in the L1 cache would make more partials
    than rows (layer norm's gradient, 4096x512 float32, one thread: 1.1 ms in blocks of
    170 rows, 2.5 ms in blocks of 16)."""
    info = [_row_member(st, statements, kernels, values, params) if fuse else None
            for st in steps]
    out, k = [], 0
    while k < len(steps):
        end, row, sums = k + 1, None, set()
        while info[k] is not None and end < len(steps) and info[end] is not None:
            group = info[k:end + 1]
            r = rows_mod.row_index([(m[0], m[1]) for m in group])
            cols = _columns(group, r) if r is not None else set()
            # a fused nest's per-block partial sums must be the group's column sums
            if r is None or not set(p for m in group for p in m[6]) <= cols:
                break
            row, end, sums = r, end + 1, cols       # (the column sums of the group so far)
        group = info[k:end]
        if row is not None:
            rng = info[k][1][row]
            columns = [n for n in dict.fromkeys(e.output for m in group for e in m[0])
                       if n in sums]
            per_row = sum(values[n].nbytes // max(len(rng), 1) for n in dict.fromkeys(
                a.array for m in group for e in m[0] for a in (e.lhs, *e.accesses())
                if any(row in x.names for x in a.indices)) if isinstance(values.get(n), np.ndarray))
            rows = rows_mod.block_rows(len(rng), per_row, (sums_block_bytes or block_bytes)
                                       if columns else block_bytes)
            if rows_mod.blocks(len(rng), rows) * sum(
                    max(values[n].nbytes, values[n].itemsize) for n in columns) > PARTIAL_BYTES:
                row = None
        if row is None:
            out.append(steps[k])
            k += 1
            continue
        source, pairs = rows_mod.render([m[2] for m in group], row, columns)
        consts = {f"_start_{row}": rng.start, f"_stop_{row}": rng.stop}
        for m, member in zip(group, pairs):
            consts.update((d, m[4][a]) for d, a in member if a in m[4])
        consts["_rows"] = rows
        members = tuple(j for st in steps[k:end] for j in st.members)
        out.append(Step("rows", members, rows=Rows(
            source, tuple(c for m in group for c in m[3]),
            tuple(o for m in group for o in m[5]), tuple(consts.items()),
            partial=tuple(columns))))
        k = end
    return tuple(out)


def _columns(group, row: str) -> set[str]:
    return rows_mod.column_sums([e for m in group for e in m[0]], row)


def _row_member(step: Step, statements, kernels, values: dict, params: dict):
    """(equations, ranges, source, compile keys, generated arguments' values, output
    arguments, outputs summed in per-block partials) of a step that may join a "rows" step,
    else None: a statement's own loops that run plainly (no BLAS, relaid copy, snapshot,
    scatter, chunks, blocks or register tiles), or a fused nest (whose outputs with per-block
    partial sums the caller accepts only as column sums).  An index whose bounds the code
    fixes (Plan.fixed) is left out of the ranges, so it cannot be the row index."""
    plans, lows, keys = [], [], []
    for k in step.members:
        s, gk = statements[k], kernels[k]
        if step.kind not in ("loops", "fused") or s.relayout or gk.target not in ("auto", "cpu"):
            return None
        arrays, out = arrays_of(s, values, params), values[s.output]
        plan, key, low = gk.plan_for(arrays, as_ranges(s.ranges), out.dtype, out.shape)
        # (a fused nest runs its own code: its members' chunks and partials are not used)
        if low.snapshot or plan.scatter or plan.block or plan.jam or step.kind == "loops" \
                and (plan.chunked or plan.partial):
            return None         # (two loops collapsed into one read their bounds like others)
        plans.append(plan), lows.append(low), keys.append(key)
    fixed = {v for p in plans for v, _, _ in p.fixed}
    partial = ()
    if step.kind == "fused":
        f = step.fused
        # its per-block partial sums join a group only as the group's column sums
        partial = tuple(plans[j].equation.output
                        for j in fused.partial_members(schedule.fuse(plans)))
        rng, source, outputs = as_ranges(f.ranges), f.source, f.outputs
        given = {**dict(f.bound), **dict(f.bounds)}
    else:
        rng, source, outputs = lows[0].ranges, codegen.render(plans[0]), (plans[0].equation.output,)
        given = {a: range_argument(a, rng) for a in source.args
                 if a.startswith(("_start_", "_stop_"))}
        given.update(lows[0].bound_params)
    consts = {a: given[a] for a in source.args if a in given}
    if any(a.startswith("_") and a not in consts for a in source.args):
        return None         # a generated argument whose value is not known here
    rng = {n: r for n, r in rng.items() if n not in fixed}
    return [p.equation for p in plans], rng, source, tuple(keys), consts, outputs, partial


def block_local(step: Step, statements, names) -> tuple[str, ...]:
    """The arrays among `names` that may live in blocks of "rows" step `step`
    (codegen/rows.py's localize): no statement outside the step touches them, the first
    member touching one writes it (`:=` or `=`, not reading it), and the row index is the
    first of its dimensions.  The callers check the rest: nothing reads the array after
    the step (a result, an array a caller or a backward keeps), and its statement writes
    every element (no padding, no zeroed boxes)."""
    if not LOCAL:
        return ()
    row = row_of(step.rows)
    members = set(step.members)
    out = []
    for n in names:
        touch = [k for k, s in enumerate(statements) if n in _touched(s)]
        if not touch or any(k not in members for k in touch):
            continue
        first = statements[min(touch, key=step.members.index)]
        eq = first.equation
        lhs = eq.lhs.indices
        if (first.output != n or eq.assign not in (":=", "=") or n in eq.arrays
                or n in eq.params or not lhs or not isinstance(lhs[0], Affine)
                or not lhs[0].is_bare or lhs[0].names != (row,)):
            continue
        out.append(n)
    return tuple(out)


def _touched(s) -> set:
    eq = s.equation
    return {s.output, eq.output, *eq.arrays, *eq.params}


def localized(step: Step, local) -> Step:
    """`step` (a "rows" step) with the arrays `local` block-local (`block_local`)."""
    if not local:
        return step
    f = step.rows
    return replace(step, rows=replace(f, source=rows_mod.localize(f.source, local),
                                      local=tuple(local)))


def row_of(f: Rows) -> str:
    """The row index of a row group."""
    (row,) = [k[len("_start_"):] for k, _ in f.consts if k.startswith("_start_")]
    return row


def partial_buffers(f: Rows, like: dict, zeros) -> dict:
    """{argument: zeroed buffer} for the column sums of row group `f` (codegen/rows.py): one
    partial array per block of rows, (blocks, the array's shape; (1,) for a 0-d array)."""
    if not f.partial:
        return {}
    c = dict(f.consts)
    row = row_of(f)
    n = rows_mod.blocks(c[f"_stop_{row}"] - c[f"_start_{row}"], c["_rows"])
    return {rows_mod.partial_arg(a): zeros((n, *(like[a].shape or (1,))), like[a].dtype)
            for a in f.partial}


def local_buffers(f: Rows, like: dict, empty) -> dict:
    """{argument: buffer} for the block-local arrays of row group `f`: (threads, rows of a
    block and a few more (`slot_rows`), the array's other dimensions) from `empty(shape,
    dtype)`; `like`: name -> an array (or stand-in) of the array's shape and dtype."""
    rows = dict(f.consts)["_rows"]
    slots = jit.max_threads()
    return {rows_mod.local_arg(n): empty((slots, slot_rows(rows, like[n]), *like[n].shape[1:]),
                                         like[n].dtype)
            for n in f.local}


def slot_rows(rows: int, like) -> int:
    """Rows of one thread's slot of a block-local buffer: a block's `rows`, and where a row is
    shorter than a cache line (memory.ALIGN bytes), as many unused rows after them as fill a
    line, so that the rows two threads write are a line apart wherever the buffer starts.
    Blocks of 3 rows of layer norm's mu and var (4 bytes a row) otherwise put both threads'
    rows in one line: its forward's kernel (4096x512 float32, 2 threads; six runs of 60
    interleaved calls) took 0.28-0.65 ms so, 0.23-0.38 ms with lines of their own, and
    0.24-0.41 ms in blocks of 255 rows.  (Longer rows share at most the one line where two
    slots meet.)"""
    row = max(like.dtype.itemsize, 1)
    for d in like.shape[1:]:
        row *= d
    rows = max(rows, 1)
    return rows if row == 0 or row >= memory.ALIGN else rows - (-memory.ALIGN // row)
