"""Plan -> Python source of one loop-nest function.

The source is plain Python over numpy arrays.  Target "cpu" compiles it with numba (`_prange`
is numba.prange), target "python" runs it as is (`_prange` is range).  Every name the generator
introduces starts with '_' (users' names cannot), so user names are used as they are and the
code reads like the equation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import (Access, Affine, Binary, Call, Compare, Const, Gather, IndexValue, Param, Unary,
                 Wrapped)
from .schedule import Guard, Plan

_FUNCS = {"exp": "_np.exp", "log": "_np.log", "log1p": "_np.log1p", "expm1": "_np.expm1",
          "sqrt": "_np.sqrt", "abs": "abs", "sin": "_np.sin", "cos": "_np.cos", "tan": "_np.tan",
          "tanh": "_np.tanh", "sinh": "_np.sinh", "cosh": "_np.cosh", "arctan": "_np.arctan",
          "conj": "_np.conj"}


@dataclass(frozen=True)
class Source:
    text: str            # the function definition
    name: str            # its name
    args: tuple[str, ...]  # positional arguments, in order
    parallel: bool
    fastmath: bool


def identity_code(reducer: str, dtype: np.dtype) -> str:
    if reducer == "+":
        return "_T(0)"
    if reducer == "*":
        return "_T(1)"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return f"_T({info.min if reducer == 'max' else info.max})"
    if dtype.kind == "b":
        return "False" if reducer == "max" else "True"
    return "_T(-_np.inf)" if reducer == "max" else "_T(_np.inf)"


class _Render:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.eq = plan.equation
        self.dtype = np.dtype(plan.out_dtype)
        self.float_t = self.dtype.kind in "fc"

    # ------------------------------------------------------------ expressions
    def slot(self, s, array: str, d: int) -> str:
        if isinstance(s, Affine):
            return str(s) if s.terms else str(s.const)
        if isinstance(s, Gather):
            g = f"{s.array}[{', '.join(self.slot(a, s.array, k) for k, a in enumerate(s.indices))}]"
            off = str(s.offset) if (s.offset.terms or s.offset.const) else ""
            return g + ("" if not off else off if off.startswith("-") else "+" + off)
        inner = self.slot(s.inner, array, d)
        if s.kind == "clamp":
            return f"min(max({inner}, 0), {array}.shape[{d}] - 1)"
        if s.kind == "mod":
            return f"({inner}) % {array}.shape[{d}]"
        return inner          # pad: checked by the caller

    def access(self, a: Access) -> str:
        if not a.indices:
            return f"{a.array}[0]"
        idx = [self.slot(s, a.array, d) for d, s in enumerate(a.indices)]
        code = f"{a.array}[{', '.join(idx)}]"
        pads = [(d, i) for d, (s, i) in enumerate(zip(a.indices, idx))
                if isinstance(s, Wrapped) and s.kind == "pad"]
        if pads and str(a) not in self.plan.guarded_reads:
            cond = " and ".join(f"0 <= {i} < {a.array}.shape[{d}]" for d, i in pads)
            code = f"({code} if {cond} else _pad)"
        return code

    def expr(self, e) -> str:
        if isinstance(e, Access):
            return self.access(e)
        if isinstance(e, Const):
            v = e.value
            if isinstance(v, float) and self.float_t:
                return f"_T({v!r})"
            return repr(v)
        if isinstance(e, (Param, IndexValue)):
            return e.name
        if isinstance(e, Unary):
            return f"(-{self.expr(e.operand)})"
        if isinstance(e, Binary):
            return f"({self.expr(e.left)} {e.op} {self.expr(e.right)})"
        if isinstance(e, Compare):
            return f"(_T(1) if {self.condition(e)} else _T(0))"
        if isinstance(e, Call):
            args = [self.expr(a) for a in e.args]
            f = e.func
            if f == "where":
                cond = self.condition(e.args[0])
                return f"({args[1]} if {cond} else {args[2]})"
            if f in ("max", "min"):
                return f"{f}({args[0]}, {args[1]})"
            if f == "sigmoid":
                return f"(1.0 / (1.0 + _np.exp(-{args[0]})))"
            if f == "relu":
                return f"max({args[0]}, 0)"
            if f == "real":
                return f"({args[0]}).real"
            if f == "imag":
                return f"({args[0]}).imag"
            return f"{_FUNCS[f]}({args[0]})"
        raise TypeError(f"cannot render {e!r}")

    def condition(self, e) -> str:
        if isinstance(e, Compare):
            parts = [self.expr(x) for x in e.operands]
            return " ".join(p for pair in zip(parts, e.ops) for p in pair) + " " + parts[-1]
        return f"{self.expr(e)} != 0"

    def rhs_without_guards(self) -> str:
        from .schedule import mask_guards, top_factors
        factors = [f for f in top_factors(self.eq.rhs) if mask_guards(f) is None]
        if not factors:
            return "_T(1)"
        return " * ".join(self.expr(f) for f in factors)

    # ------------------------------------------------------------ loops
    def loop_header(self, loop, outer: set[str], guards: list[Guard]) -> tuple[str, list[str]]:
        """`for` line with bounds clipped by the guards whose innermost index is this loop's,
        plus `if ...: continue` lines for guards that cannot be clipped."""
        v = loop.index
        lo, hi = [f"_start_{v}"], [f"_stop_{v}"]
        checks = []
        for g in guards:
            names = g.expr.names
            if v not in names or any(n not in outer and n != v for n in names):
                continue
            if g.cond is not None:
                checks.append(f"if not ({g.cond}):\n    continue")
                continue
            c = g.expr.coef(v)
            rest = Affine.of(tuple(t for t in g.expr.terms if t[0] != v))
            rest_code = str(rest) if rest.terms else "0"
            if c == 1:
                if g.lo is not None:
                    lo.append(f"{g.lo} - ({rest_code})")
                if g.hi is not None:
                    hi.append(f"{g.hi} - ({rest_code})")
            elif c == -1:
                if g.hi is not None:
                    lo.append(f"({rest_code}) - ({g.hi}) + 1")
                if g.lo is not None:
                    hi.append(f"({rest_code}) - ({g.lo}) + 1")
            else:
                cond = []
                if g.lo is not None:
                    cond.append(f"{g.lo} <= {g.expr}")
                if g.hi is not None:
                    cond.append(f"{g.expr} < {g.hi}")
                checks.append(f"if not ({' and '.join(cond)}):\n    continue")
        start = lo[0] if len(lo) == 1 else f"max({', '.join(lo)})"
        stop = hi[0] if len(hi) == 1 else f"min({', '.join(hi)})"
        rng = "_prange" if loop.parallel else "range"
        return f"for {v} in {rng}({start}, {stop}):", checks

    def render(self) -> Source:
        eq, plan = self.eq, self.plan
        arrays = [eq.output] + [a for a in eq.arrays if a != eq.output]
        params = list(eq.params)
        bounds = [f"_{w}_{n}" for n in (l.index for l in plan.loops) for w in ("start", "stop")]
        args = tuple(arrays + params + bounds)
        name = "_tullio_kernel"
        lines = [f"# {eq}",
                 f"# loops (outer to inner): "
                 + ", ".join(f"{l.index}{' [threads]' if l.parallel else ''}"
                             f"{' [reduction]' if l.reduction else ''}" for l in plan.loops)]
        if plan.scatter:
            lines.append("# scatter: the left-hand side keeps a gather or a non-unit shift, so "
                         "every index tuple is combined into its element in turn")
        lines.append(f"_T = _np.{self.dtype.name}")
        lines.append(f"_pad = _T({plan.pad_value!r})")
        lines.append(f"def {name}({', '.join(args)}):")
        lhs = self.access(eq.lhs) if eq.lhs.indices else f"{eq.output}[0]"
        guards = list(plan.guards)
        red = eq.reducer
        ident = identity_code(red, self.dtype)
        value = self.rhs_without_guards()
        fin = (lambda x: self.expr(Call(eq.finaliser, (Param(x),)))) if eq.finaliser else (lambda x: x)
        body: list[tuple[int, str]] = []
        depth = 1
        outer: set[str] = set()

        def emit_loops(loops):
            nonlocal depth
            for loop in loops:
                head, checks = self.loop_header(loop, outer, guards)
                body.append((depth, head))
                depth += 1
                outer.add(loop.index)
                for c in checks:
                    for ln in c.split("\n"):
                        body.append((depth + (1 if ln.startswith("    ") else 0), ln.strip()))

        def combine(target: str, v: str) -> str:
            if red == "+":
                return f"{target} += {v}"
            if red == "*":
                return f"{target} *= {v}"
            op = ">" if red == "max" else "<"
            return f"_v = {v}\n__IF__ _v {op} {target}:\n    {target} = _v"

        def emit(code: str):
            for ln in code.split("\n"):
                if ln.startswith("__IF__"):
                    body.append((depth, "if" + ln[len("__IF__"):]))
                elif ln.startswith("    "):
                    body.append((depth + 1, ln.strip()))
                else:
                    body.append((depth, ln))

        if plan.scatter:
            if eq.assign in (":=", "="):
                emit_loops(plan.loops)
                emit(f"{lhs} = {ident}")
                depth = 1
                outer.clear()
            emit_loops(plan.loops)
            if eq.assign == "-=":
                emit(f"{lhs} -= {value}")
            elif eq.assign == "*=":
                emit(f"{lhs} *= {value}")
            else:
                emit(combine(lhs, value))
        else:
            left = [l for l in plan.loops if not l.reduction]
            redl = [l for l in plan.loops if l.reduction]
            emit_loops(left)
            level = depth
            if redl:
                emit(f"_acc = {ident}")
                emit_loops(redl)
                emit(combine("_acc", value))
                depth = level
                result = fin("_acc")
            else:
                result = value
            store = {":=": "=", "=": "=", "+=": "+=", "-=": "-=", "*=": "*="}[eq.assign]
            emit(f"{lhs} {store} {result}")
        lines += ["    " * d + s for d, s in body]
        if not body:
            lines.append("    pass")
        return Source("\n".join(lines) + "\n", name, args,
                      any(l.parallel for l in plan.loops), plan.fastmath)


def render(plan: Plan) -> Source:
    return _Render(plan).render()
