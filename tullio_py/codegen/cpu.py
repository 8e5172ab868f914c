"""Plan -> Python source of one loop-nest function (targets "cpu" and "python").

The source is plain Python over numpy arrays.  Target "cpu" compiles it with numba (`_prange`
is numba.prange), target "python" runs it as is (`_prange` is range).  User names appear with a
trailing '_' (text.rename_plan) and every name the generator introduces starts with '_', so
the two cannot clash and the code reads like the equation.

Three forms: "scalar" (left loops outside, reductions inside, a register accumulator, maybe
in lanes), "row" (the contiguous left index innermost: each reduction step updates a row) and
scatter (every index tuple combines into its element).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..schedule import SCATTER_BLOCK, Plan
from .blocked import render_jam
from .bounds import loop_bounds
from .emit import Emitter, under
from .expr import STORE, Expr, better, combine, hoist_table, identity_code, pad_condition
from .nest import Nest, nonneg_indices, nonunit_indices
from .source import SUM_FASTMATH, Source
from .text import pad_line, rename_plan, user_arg


def render(plan: Plan) -> Source:
    """The loop nest of `plan`; user names appear renamed (text.rename_plan), `args` are the
    names the caller binds."""
    src = render_renamed(rename_plan(plan), plan)
    return replace(src, args=tuple(user_arg(a) for a in src.args))


def render_renamed(plan: Plan, shown: Plan, target: str = "cpu") -> Source:
    """The loop nest of `plan` (names already renamed) with `target`'s math library; comments
    name the loops as in `shown` (the plan with the user's names)."""
    eq = plan.equation
    x = Expr(plan, target, hoist_table(plan.hoists))
    if plan.loops and target == "cpu":  # the innermost index in the lanes (Expr.lane_indices)
        x.lane_indices = frozenset({plan.loops[-1].index})
    arrays = [eq.output] + [a for a in eq.arrays if a != eq.output]
    bounds = [f"_{w}_{n}" for n in (l.index for l in plan.loops) for w in ("start", "stop")]
    args = tuple(arrays + list(eq.params) + bounds)
    name = "_tullio_kernel"
    lines = [f"# {shown.equation}",
             f"# loops (outer to inner): "
             + ", ".join(f"{l.index}{' [threads]' if l.parallel else ''}"
                         f"{' [reduction]' if l.reduction else ''}" for l in shown.loops)]
    if plan.form == "row":
        lines.append(f"# the contiguous index {shown.loops[-1].index} runs innermost: each "
                     "reduction step updates a row")
    if plan.jam:
        lines.append(f"# register-blocked: {plan.jam[1]} values of {shown.jam[0]} at once, the "
                     f"row in tiles of {plan.jam[2]} summed in local accumulators")
    if plan.chunked:
        lines.append(f"# {shown.chunked} is split into blocks across threads"
                     + (f"; each block keeps a partial result ({plan.partial}), combined at "
                        "the end" if plan.partial else ""))
    if plan.scatter:
        lines.append("# scatter: the left-hand side keeps a gather or a non-unit shift, so "
                     "every index tuple is combined into its element in turn")
    lines.append(f"_T = _np.{x.dtype.name}")
    if pad_line(plan):
        lines.append(pad_line(plan))
    lines.append(f"def {name}({', '.join(args)}):")
    out = Emitter()
    for v, start, stop in plan.fixed:       # constants the compiler can unroll with
        out.add(f"_start_{v} = {start}\n_stop_{v} = {stop}")
    nest = Nest(plan, out, x, nonneg_indices(plan, [eq]), nonunit_indices([eq]))
    if plan.scatter:
        _scatter(nest)
    elif plan.form == "row":
        (render_jam if plan.jam else _row)(nest)
    else:
        _scalar(nest)
    lines += out.lines() or ["    pass"]
    # A float sum may be reassociated and contracted (LLVM's reassoc, nsz and contract
    # flags; no NaN/inf assumptions), so the compiler can vectorise the reduction.  The order
    # is still fixed by the compiled code, the same for every thread count.  dW of the
    # local convolution: 2.7 -> 2.1 ms.  `fastmath=True` turns on every flag.
    fastmath = plan.fastmath or (SUM_FASTMATH if eq.reducer == "+" and
                                 x.dtype.kind in "fc" else False)
    return Source("\n".join(lines) + "\n", name, args,
                  any(l.parallel for l in plan.loops) or plan.chunked is not None, fastmath)


def _scalar(nest: Nest):
    """Left loops outside, reduction loops inside, a scalar accumulator (a register)."""
    plan, out, x = nest.plan, nest.out, nest.x
    eq, dtype = plan.equation, x.dtype
    n = len(plan.loops)
    nleft = sum(1 for l in plan.loops if not l.reduction)
    ident = identity_code(eq.reducer, dtype)
    lhs = x.lhs()
    nest.emit_hoists(-1)
    if plan.chunked:
        if plan.partial == "scalar":
            nest.open_chunks("_part = _np.empty(_nc, _T)")
        else:
            nest.open_chunks(per_thread=True)
    nest.open_range(range(nleft))
    if nleft == n:
        out.add(f"{lhs} {STORE[eq.assign]} {x.rhs_without_guards()}")
        return
    level, count = nest.mark()
    out.add(f"_acc = {ident}")
    if plan.lanes and not _lane_loop_has_checks(plan):
        nest.open_range(range(nleft, n - 1))
        _lanes(nest, n - 1)
    else:
        nest.open_range(range(nleft, n))
        out.add(combine(eq.reducer, "_acc", x.rhs_without_guards(), dtype))
    nest.close_to(level, count)
    if plan.partial == "scalar":
        out.add("_part[_c] = _acc")
        nest.close_to(1, 0)
        out.add(f"_acc = {ident}\nfor _c in range(_nc):")
        out.depth += 1
        out.add(combine(eq.reducer, "_acc", "_part[_c]", dtype))
        out.depth -= 1
    out.add(f"{lhs} {STORE[eq.assign]} {x.result('_acc')}")


def _lane_loop_has_checks(plan: Plan) -> bool:
    opened = {l.index for l in plan.loops[:-1]}
    return bool(loop_bounds(plan.loops[-1].index, opened, list(plan.guards))[2])


def _lanes(nest: Nest, k: int):
    """A reduction over a contiguous loop with LANES independent accumulators, which the
    compiler can turn into vector instructions (a single chain cannot be vectorised).  The
    lanes are combined in a fixed order, so the result does not depend on the number of
    threads.  schedule.py asks for lanes for (max)/(min); a float sum is reassociated by the
    compiler instead (SUM_FASTMATH), but a plan may still ask for lanes for a sum."""
    plan, out, x = nest.plan, nest.out, nest.x
    dtype = x.dtype
    v, L = plan.loops[k].index, plan.lanes
    base = ("_clo", "_chi") if plan.chunked == v else None
    start, stop, _ = nest.inner_bounds(v, base)
    red = plan.equation.reducer
    value = x.rhs_without_guards()
    if red != "+" and x.target != "cuda" and dtype in EXTREMUM and x.rhs_dtype() == dtype:
        _extremum(nest, v, start, stop, value)
        return
    out.add(f"_lo = {start}\n_hi = {stop}\n_e = _lo + max(_hi - _lo, 0) // {L} * {L}")
    out.add("\n".join(f"_a{l} = {'_T(0)' if red == '+' else '_acc'}" for l in range(L)))
    # (max)/(min) of floats: the lanes compare plainly (one max instruction each) and one
    # flag records whether a NaN was seen, which then is the result (2000x2000 row max on a
    # loaded machine: 0.59 ms, 0.55 ms without any check, 1.09 ms with a NaN-aware select
    # per lane).
    nan_flag = red != "+" and dtype.kind == "f"
    if nan_flag:
        out.add("_nan = False")
    out.add(f"for _j in range(max(_hi - _lo, 0) // {L}):")
    out.depth += 1
    for l in range(L):
        step = (f"_a{l} += _x" if red == "+" else
                f"_a{l} = _x if _x {'>' if red == 'max' else '<'} _a{l} else _a{l}")
        if nan_flag:
            step += "\n_nan = _nan | (_x != _x)"
        out.add(f"{v} = _lo + _j * {L} + {l}\n_x = {value}\n{step}")
    out.depth -= 1
    out.add(f"for _k in range(_hi - _e):\n    {v} = _e + _k")
    out.depth += 1
    out.add(combine(red, "_acc", value, dtype))
    out.depth -= 1
    if red == "+":
        pairs = [f"_a{l}" for l in range(L)]
        while len(pairs) > 1:
            pairs = [f"({a} + {b})" for a, b in zip(pairs[::2], pairs[1::2])]
        out.add(f"_acc += {pairs[0]}")
        return
    for l in range(L):
        out.add(f"if {better(red, f'_a{l}', '_acc', dtype)}:\n    _acc = _a{l}")
    if nan_flag:
        out.add("if _nan:\n    _acc = _T(_np.nan)")


EXTREMUM = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _extremum(nest: Nest, v: str, start: str, stop: str, value: str):
    """A float (max)/(min) over the contiguous loop v as one chain of IEEE maximum/minimum
    (vecmath.maximum: NaN wins, -0.0 < +0.0), a reduction the compiler vectorises (its order
    never changes the value: 2000x2000 float32 row max 0.44 -> 0.31 ms, torch.amax 0.33 ms,
    2 threads).  The plain loop keeps the first extremal element in index order; only the
    sign of a zero can tell them apart, so a zero result takes the first zero's sign (a
    second pass up to that zero).  Then combined into _acc as the plain loop would."""
    out, x = nest.out, nest.x
    red = nest.plan.equation.reducer
    f = f"_vm_{'maximum' if red == 'max' else 'minimum'}_{EXTREMUM[x.dtype]}"
    out.add(f"_lo = {start}\n_n = max({stop} - _lo, 0)\n_m = {identity_code(red, x.dtype)}")
    out.add(f"for _j in range(_n):\n    {v} = _lo + _j\n    _m = {f}(_m, {value})")
    out.add(f"if _m == 0:\n    for _j in range(_n):\n        {v} = _lo + _j\n"
            f"        _v = {value}\n        if _v == 0:\n            _m = _v\n            break")
    out.add(combine(red, "_acc", "_m", x.dtype))


def _row(nest: Nest):
    """Left loops outside, then the reductions, then the contiguous left index innermost:
    each reduction step updates a whole row of the output (or of an accumulator row)."""
    plan, out, x = nest.plan, nest.out, nest.x
    eq, dtype = plan.equation, x.dtype
    n = len(plan.loops)
    r = plan.loops[-1].index
    nleft = sum(1 for l in plan.loops[:-1] if not l.reduction)
    red, assign = eq.reducer, eq.assign
    ident = identity_code(red, dtype)
    reads_out = any(a.array == eq.output for a in eq.accesses())
    direct = not eq.finaliser and not reads_out and (
        assign in (":=", "=") or (red == "+" and assign in ("+=", "-="))
        or (red == "*" and assign == "*="))
    lhs = x.plain_access(eq.lhs)
    acc = f"_accv[{r} - _start_{r}]"
    alloc = f"_accv = _np.empty(max(_stop_{r} - _start_{r}, 0), _T)"
    nest.emit_hoists(-1)
    if plan.chunked:
        nest.open_chunks(per_thread=True)
    if not direct and (plan.chunked or nleft == 0):
        out.add(alloc)
    if plan.block and direct:
        # Cache blocking: fill the output once, then for each block of the first reduction
        # loop run every output row over that block (a parallel loop per block).
        if assign in (":=", "="):
            nest.open_range(range(nleft), hoist=False)
            nest.open(n - 1, hoist=False)
            out.add(f"{lhs} = {ident}")
            nest.close_to(1, 0)
        v, size = plan.block
        out.add(f"for _jb in range(_start_{v}, _stop_{v}, {size}):")
        out.depth += 1
        nest.open_range(range(nleft))
        nest.open_range(range(nleft, n))
        value = x.rhs_without_guards()
        out.add(f"{lhs} -= {value}" if assign == "-=" else combine(red, lhs, value, dtype))
        return
    for i, k in enumerate(range(nleft)):
        if plan.collapse and k == 1:
            continue
        nest.open(k)
        if i == 0 and not direct and not plan.chunked:
            out.add(alloc)
    level, count = nest.mark()
    if not direct or assign in (":=", "="):
        nest.open(n - 1, hoist=False)
        out.add(f"{lhs if direct else acc} = {ident}")
        nest.close_to(level, count)
    nest.open_range(range(nleft, n))
    value = x.rhs_without_guards()
    if direct and assign == "-=":
        out.add(f"{lhs} -= {value}")
    else:
        out.add(combine(red, lhs if direct else acc, value, dtype))
    nest.close_to(level, count)
    if not direct:
        nest.open(n - 1, hoist=False)
        out.add(f"{lhs} {STORE[assign]} {x.result(acc)}")
        nest.close_to(level, count)


def _scatter(nest: Nest):
    """Every index tuple combines its value into its element.  Threads only over a safe
    index, or over blocks each with its own copy of the output (partial = "array")."""
    plan, out, x = nest.plan, nest.out, nest.x
    eq, dtype = plan.equation, x.dtype
    n = len(plan.loops)
    red, assign = eq.reducer, eq.assign
    ident = identity_code(red, dtype)
    lhs = x.plain_access(eq.lhs)
    # A left-hand pad(...) position (the gradient of a padded gather) drops the writes that
    # fall outside the output.
    idx = [x.slot(s, eq.output, d) for d, s in enumerate(eq.lhs.indices)]
    inside = pad_condition(eq.lhs, idx)
    if inside:
        lhs = f"{eq.output}[{', '.join(idx)}]"
    write = (lambda stmt: out.add(under(inside, stmt))) if inside else out.add
    if assign in (":=", "="):       # the initialisation runs serially over plain loops
        nest.open_range(range(n), hoist=False, chunks=False)
        out.add(f"{lhs} = {ident}")
        nest.close_to(1, 0)
    nest.emit_hoists(-1)
    value = x.rhs_without_guards()
    if plan.partial == "array":
        part = f"_part[_c, {', '.join(idx)}]"
        nest.open_chunks(f"_part = _np.full((_nc,) + {eq.output}.shape, {ident}, _T)")
        nest.open_range(range(n))
        write(combine("*" if assign == "*=" else "+" if assign == "-=" else red, part, value,
                      dtype))
        nest.close_to(1, 0)
        nd = len(eq.lhs.indices)
        for d in range(nd):
            out.add(f"for _d{d} in {'_prange' if d == 0 else 'range'}({eq.output}.shape[{d}]):")
            out.depth += 1
        out.add("for _c in range(_nc):")
        out.depth += 1
        el = ", ".join(f"_d{d}" for d in range(nd))
        src = f"_part[_c, {el}]"
        if assign in ("-=", "*="):
            out.add(f"{eq.output}[{el}] {assign} {src}")
        else:
            out.add(combine(red, f"{eq.output}[{el}]", src, dtype))
        return
    if plan.chunked:                # a safe innermost index, in blocks (schedule.plan)
        nest.open_chunks(least=SCATTER_BLOCK)
    nest.open_range(range(n))
    if assign in ("-=", "*="):
        write(f"{lhs} {assign} {value}")
    else:
        write(combine(red, lhs, value, dtype))
