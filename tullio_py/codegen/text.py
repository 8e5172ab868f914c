"""What generated source may contain besides the generator's own text: user names, renamed so
they cannot clash with anything, and numbers, formatted here from validated values.

Names.  Every user name (array, parameter, index) appears in generated code with a trailing
'_' (`A[i, j]` is `A_[i_, j_]`), PEP 8's way around a clash: an array named `range`, `max`,
`np` or `math` or an index named `prange` then shadows nothing the code uses (builtins, the
modules of the header, the generator's own names, which start with '_' as user names cannot).
The renaming is one pass over a Plan (`for_code`), before any renderer sees it, so the CPU,
python, CUDA and fused renderers all print renamed names; `user_arg` maps the generated
function's argument names back to the names the caller binds.

Numbers.  `number_code` writes an int, float or complex of exactly those types (no subclass,
whose `__repr__` could be anything), with inf and nan through numpy's constants.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np

from ..ir import Access, Affine, Equation, Gather, IndexValue, Param, Wrapped, map_expr
from ..errors import ArgumentError
from ..schedule import Guard, Linear, Plan

SUFFIX = "_"
_WORD = re.compile(r"(?<![\w.])([A-Za-z]\w*)")


def code_name(name: str) -> str:
    """The identifier generated code uses for a user's name (generated names, which start
    with '_', stay as they are)."""
    return name if name.startswith("_") else name + SUFFIX


def user_arg(arg: str) -> str:
    """The caller's name of a generated function argument (inverse of code_name, also under
    the generated `_start_` / `_stop_` prefixes of loop bounds)."""
    for prefix in ("_start_", "_stop_"):
        if arg.startswith(prefix):
            return prefix + user_arg(arg[len(prefix):])
    if arg.startswith("_"):
        return arg
    assert arg.endswith(SUFFIX), arg
    return arg[:-len(SUFFIX)]


def number_code(v) -> str:
    """Source text of a number: bool, int, float or complex of exactly those types."""
    t = type(v)
    if t is bool or t is int:
        return repr(v)
    if t is float:
        if math.isnan(v):
            return "_np.nan"
        if math.isinf(v):
            return "_np.inf" if v > 0 else "(-_np.inf)"
        return repr(v)
    if t is complex:
        if math.isfinite(v.real) and math.isfinite(v.imag):
            return repr(v)
        return f"complex({number_code(v.real)}, {number_code(v.imag)})"
    raise TypeError(f"generated code takes numbers of type int, float or complex, not {t.__name__}")


def pad_line(plan: Plan) -> str | None:
    """`_pad = _T(value)` when the statement reads through pad(...), else None (no line)."""
    eq = plan.equation
    if not any(isinstance(s, Wrapped) and s.kind == "pad"
               for a in [eq.lhs, *eq.accesses()] for s in a.indices):
        return None
    v, dtype = plan.pad_value, np.dtype(plan.out_dtype)
    if dtype.kind in "biu" and not (type(v) is int or (type(v) is float and v.is_integer())):
        raise ArgumentError(f"option pad={float(v)!r} is not a value of the result type {dtype}",
                            eq.text or str(eq), None, "pass an integer pad, or float arrays")
    return f"_pad = _T({number_code(v)})"


# ----------------------------------------------------------------------------- renaming
def _slot(s, f):
    if isinstance(s, Affine):
        return Affine(tuple((f(n), c) for n, c in s.terms), s.const, s.span)
    if isinstance(s, Gather):
        return Gather(f(s.array), tuple(_slot(a, f) for a in s.indices), _slot(s.offset, f),
                      s.span)
    if isinstance(s, Wrapped):
        return replace(s, inner=_slot(s.inner, f))
    raise TypeError(f"unknown index slot {s!r}")


def _access(a: Access, f) -> Access:
    return Access(f(a.array), tuple(_slot(s, f) for s in a.indices), a.span)


def _node(n, f):
    if isinstance(n, Access):
        return _access(n, f)
    if isinstance(n, Param):
        return Param(f(n.name), n.span)
    if isinstance(n, IndexValue):
        return IndexValue(f(n.name), n.span)
    return n


def rename_equation(eq: Equation, f) -> Equation:
    return replace(eq, lhs=_access(eq.lhs, f), rhs=map_expr(eq.rhs, lambda n: _node(n, f)))


def _code(text: str, f) -> str:
    """A code fragment of a Plan (a Linear term such as `x.shape[0]`, a guard's condition)
    with its user names renamed (identifiers not after '.', so `.shape` stays)."""
    return _WORD.sub(lambda m: f(m.group(1)), text)


def rename_access(a: Access) -> Access:
    """A read with every user name replaced by its code_name."""
    return _access(a, code_name)


def _linear(lin: Linear | None, f) -> Linear | None:
    if lin is None:
        return None
    return Linear(tuple((_code(n, f), c) for n, c in lin.terms), lin.const)


def rename_plan(plan: Plan) -> Plan:
    """The plan with every user name replaced by its code_name."""
    eq = plan.equation
    users = (set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
             | {n for l in plan.loops for n in [l.index]})

    def f(n: str) -> str:
        return code_name(n) if n in users else n

    guarded = {str(a): str(_access(a, f)) for a in eq.accesses()}
    return replace(
        plan,
        equation=rename_equation(eq, f),
        loops=tuple(replace(l, index=f(l.index)) for l in plan.loops),
        guards=tuple(Guard(_slot(g.expr, f), _linear(g.lo, f), _linear(g.hi, f),
                           None if g.cond is None else _code(g.cond, f)) for g in plan.guards),
        guarded_reads=frozenset(guarded.get(r, r) for r in plan.guarded_reads),
        chunked=None if plan.chunked is None else f(plan.chunked),
        collapse=tuple(f(n) for n in plan.collapse),
        block=(f(plan.block[0]),) + tuple(plan.block[1:]) if plan.block else plan.block,
        fixed=tuple((f(v),) + tuple(rest) for v, *rest in plan.fixed),
        jam=(f(plan.jam[0]),) + tuple(plan.jam[1:]) if plan.jam else plan.jam,
        hoists=tuple((_access(a, f), level) for a, level in plan.hoists),
        **({"dtypes": tuple((f(n), d) for n, d in plan.dtypes)} if hasattr(plan, "dtypes") else {}))

