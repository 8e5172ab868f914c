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
from . import dtypes
from .codetext import number_code, pad_line, rename_plan, user_arg
from .errors import ArgumentError
from .schedule import CHUNKS, Guard, Linear, Plan

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
    fastmath: object     # True, False, or a tuple of LLVM fast-math flags


# LLVM fast-math flags of float sums: reassociation (so reductions vectorise), contraction
# into FMA, no signed zeros -- no NaN/inf assumptions.
SUM_FASTMATH = ("contract", "nsz", "reassoc")


def range_argument(name: str, ranges: dict):
    """The value of a generated `_start_<v>` / `_stop_<v>` argument; None for other names."""
    if name.startswith("_start_"):
        return ranges[name[7:]].start
    if name.startswith("_stop_"):
        return ranges[name[6:]].stop
    return None


def better(red: str, v: str, acc: str, dtype: np.dtype) -> str:
    """The condition under which `v` replaces `acc` in a (max)/(min) reduction.  For floats a
    NaN value wins and then stays (nothing compares greater than NaN), so NaN propagates as
    in numpy and torch; `|` of the two comparisons (not `or`) keeps it one condition without
    a branch between them."""
    cmp = f"{v} {'>' if red == 'max' else '<'} {acc}"
    return f"({cmp}) | ({v} != {v})" if dtype.kind in "fc" else cmp


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
    def __init__(self, plan: Plan, shown: Plan | None = None):
        self.plan = plan
        self.shown = shown or plan      # the plan with the user's names, for the comments
        self.eq = plan.equation
        self.dtype = np.dtype(plan.out_dtype)
        self.env = dict(getattr(plan, "dtypes", ()))     # dtypes of the arrays and parameters

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

    def plain_access(self, a: Access) -> str:
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
        return self.typed(e)[0]

    def dtype_of(self, e):
        return dtypes.dtype_of(e, self.env, self.dtype)

    def cast(self, e, text: str, have, want) -> str:
        """`text` (the code of node e, of dtype `have`) as a value of dtype `want`."""
        if have == want or dtypes.is_weak(want):
            return text
        if isinstance(e, Const) and not isinstance(e.value, bool) and want.kind in "iu":
            info = np.iinfo(want)
            if isinstance(e.value, int) and not info.min <= e.value <= info.max:
                raise ArgumentError(f"the constant {e.value} is out of bounds for {want}, the "
                                    "type numpy computes this operation in", self.eq.text,
                                    None, f"write {float(e.value)!r}, or pass wider arrays")
        return f"_np.{want.name}({text})"

    def operands(self, es, want) -> list[str]:
        return [self.cast(x, t, d, want) for x, (t, d) in zip(es, map(self.typed, es))]

    def typed(self, e) -> tuple[str, object]:
        """(code, dtype) of node e: operands are cast to the dtype numpy computes the operation
        in, and results of narrow dtypes cast back (the compiler widens small integers)."""
        if isinstance(e, Access):
            return self.access(e), self.dtype_of(e)
        if isinstance(e, Const):
            return number_code(e.value), self.dtype_of(e)
        if isinstance(e, (Param, IndexValue)):
            return e.name, self.dtype_of(e)
        want = self.dtype_of(e)
        if isinstance(e, Unary):
            text = f"(-{self.operands([e.operand], want)[0]})"
        elif isinstance(e, Binary):
            op = e.op
            work = want if op != "/" else dtypes.promote(*map(self.dtype_of, (e.left, e.right)))
            if op == "/" and dtypes.kind(work) in "biu":
                work = want
            left, right = self.operands([e.left, e.right], work)
            if op == "**" and isinstance(e.right, Const) and type(e.right.value) is int:
                right = repr(e.right.value)     # an integer power stays one (x * x for ** 2)
            text = f"({left} {op} {right})"
        elif isinstance(e, Compare):
            work = dtypes.promote(*map(self.dtype_of, e.operands))
            parts = [self.expr(x) if isinstance(x, Const) else self.cast(x, *self.typed(x), work)
                     for x in e.operands]       # numpy compares with out-of-range constants
            return ("(" + " ".join(p for pair in zip(parts, e.ops) for p in pair) + " "
                    + parts[-1] + ")"), want
        elif isinstance(e, Call):
            f = e.func
            if f == "where":
                cond = self.condition(e.args[0])
                a, b = self.operands(list(e.args[1:]), want)
                return f"({a} if {cond} else {b})", want
            if f in ("max", "min", "relu"):
                args = self.operands(list(e.args), want) + (["0"] if f == "relu" else [])
            elif f in ("abs", "real", "imag", "conj"):
                args = [self.expr(e.args[0])]
            else:                               # float functions: of float64 for integers
                args = self.operands(list(e.args), want)
            of = self.dtype_of(e.args[0]) if f in ("abs", "real", "imag", "conj") else want
            text = self.call_text(f, args, of)
        else:
            raise TypeError(f"cannot render {e!r}")
        return (f"_np.{want.name}({text})" if dtypes.narrow(want) else text), want

    def call_text(self, f: str, args: list[str], arg_dtype=None) -> str:
        """Code of function f of argument codes `args` (of dtype `arg_dtype`)."""
        if f in ("max", "min", "relu"):      # NaN propagates, as in np.maximum / np.minimum
            return f"_np.{'min' if f == 'min' else 'max'}imum({args[0]}, {args[1]})"
        if f == "sigmoid":
            return f"(1.0 / (1.0 + _np.exp(-{args[0]})))"
        if f == "real":
            return f"({args[0]}).real"
        if f == "imag":
            return f"({args[0]}).imag"
        return f"{_FUNCS[f]}({args[0]})"

    def condition(self, e) -> str:
        if isinstance(e, Compare):
            return self.expr(e)
        return f"{self.expr(e)} != 0"

    def rhs_without_guards(self) -> str:
        from .schedule import mask_guards, top_factors
        factors = [f for f in top_factors(self.eq.rhs) if mask_guards(f) is None]
        if not factors:
            return "_T(1)"
        e = factors[0]
        for f in factors[1:]:
            e = Binary("*", e, f)
        return self.expr(e)

    # ------------------------------------------------------------ loops
    def loop_header(self, loop, outer: set[str], guards: list[Guard],
                    base: tuple[str, str] | None = None) -> tuple[str, list[str]]:
        """`for` line with bounds clipped by the guards whose innermost index is this loop's,
        plus `if ...: continue` lines for guards that cannot be clipped."""
        start, stop, checks = self.loop_bounds(loop, outer, guards, base)
        par = loop.parallel and getattr(self.plan, "chunked", None) != loop.index
        return f"for {loop.index} in {'_prange' if par else 'range'}({start}, {stop}):", checks

    def loop_bounds(self, loop, outer: set[str], guards: list[Guard],
                    base: tuple[str, str] | None = None) -> tuple[str, str, list[str]]:
        """Start and stop of a loop (from `base`, default its range arguments) clipped by the
        guards whose innermost index is this loop's, and the checks that cannot be clipped."""
        v = loop.index
        lo, hi = [base[0] if base else f"_start_{v}"], [base[1] if base else f"_stop_{v}"]
        checks = []
        for g in guards:
            names = g.expr.names
            if v not in names or any(n not in outer and n != v for n in names):
                continue
            if g.cond is not None:
                checks.append(f"if not ({g.cond}):\n    continue")
                continue
            c = g.expr.coef(v)
            rest = Linear.of_affine(Affine.of(tuple(t for t in g.expr.terms if t[0] != v)))
            if c == 1:              # lo <= v + rest < hi
                if g.lo is not None:
                    lo.append(str(g.lo - rest))
                if g.hi is not None:
                    hi.append(str(g.hi - rest))
            elif c == -1:           # lo <= -v + rest < hi
                if g.hi is not None:
                    lo.append(str(rest - g.hi + 1))
                if g.lo is not None:
                    hi.append(str(rest - g.lo + 1))
            else:
                # lo <= c*v + rest < hi with |c| > 1 (strided gradients): clip by floor
                # division instead of testing every v (which made them quadratic).
                m = abs(c)
                if c > 0:
                    if g.lo is not None:
                        lo.append(f"-(({rest - g.lo}) // {m})")
                    if g.hi is not None:
                        hi.append(f"({g.hi - rest - 1}) // {m} + 1")
                else:
                    if g.hi is not None:
                        lo.append(f"-(({g.hi - rest - 1}) // {m})")
                    if g.lo is not None:
                        hi.append(f"({rest - g.lo}) // {m} + 1")
        start = lo[0] if len(lo) == 1 else f"max({', '.join(lo)})"
        stop = hi[0] if len(hi) == 1 else f"min({', '.join(hi)})"
        return start, stop, checks

    def render(self) -> Source:
        eq, plan = self.eq, self.plan
        arrays = [eq.output] + [a for a in eq.arrays if a != eq.output]
        params = list(eq.params)
        bounds = [f"_{w}_{n}" for n in (l.index for l in plan.loops) for w in ("start", "stop")]
        args = tuple(arrays + params + bounds)
        name = "_tullio_kernel"
        shown = self.shown
        lines = [f"# {shown.equation}",
                 f"# loops (outer to inner): "
                 + ", ".join(f"{l.index}{' [threads]' if l.parallel else ''}"
                             f"{' [reduction]' if l.reduction else ''}" for l in shown.loops)]
        if plan.form == "row":
            lines.append(f"# the contiguous index {shown.loops[-1].index} runs innermost: each "
                         "reduction step updates a row")
        if plan.chunked:
            lines.append(f"# {shown.chunked} is split into blocks across threads"
                         + (f"; each block keeps a partial result ({plan.partial}), combined at "
                            "the end" if plan.partial else ""))
        if plan.scatter:
            lines.append("# scatter: the left-hand side keeps a gather or a non-unit shift, so "
                         "every index tuple is combined into its element in turn")
        lines.append(f"_T = _np.{self.dtype.name}")
        if pad_line(plan):
            lines.append(pad_line(plan))
        lines.append(f"def {name}({', '.join(args)}):")
        self.body, self.depth, self.opened = [], 1, []
        for v, start, stop in plan.fixed:       # constants the compiler can unroll with
            self.emit(f"_start_{v} = {start}\n_stop_{v} = {stop}")
        # Indices used bare in some array position start at >= 0 (range inference): saying so
        # lets the compiler drop negative-index wraparound in the loops over them.
        bare = {s.names[0] for a in [eq.lhs] + eq.accesses() for s in a.indices
                if isinstance(s, Affine) and s.is_bare}
        self.nonneg = {l.index for l in plan.loops if l.index in bare}
        self.pos = {l.index: k for k, l in enumerate(plan.loops)}
        self.hoists = self.choose_hoists()
        if plan.scatter:
            self.render_scatter()
        elif plan.form == "row":
            self.render_row()
        else:
            self.render_scalar()
        lines += ["    " * d + s for d, s in self.body]
        if not self.body:
            lines.append("    pass")
        # A float sum may be reassociated and contracted (LLVM's reassoc, nsz and contract
        # flags; no NaN/inf assumptions), so the compiler can vectorise the reduction.  The order
        # is still fixed by the compiled code, the same for every thread count.  dW of the
        # local convolution: 2.7 -> 2.1 ms.  `fastmath=True` turns on every flag.
        fastmath = plan.fastmath or (SUM_FASTMATH if eq.reducer == "+" and
                                     self.dtype.kind in "fc" else False)
        return Source("\n".join(lines) + "\n", name, args,
                      any(l.parallel for l in plan.loops) or plan.chunked is not None,
                      fastmath)

    # ------------------------------------------------------------ emission helpers
    def emit(self, code: str):
        """Emit lines; a line starting with 4 spaces goes one level deeper."""
        for ln in code.split("\n"):
            if ln.startswith("    "):
                self.body.append((self.depth + 1, ln.strip()))
            else:
                self.body.append((self.depth, ln))

    def combine(self, target: str, v: str, red: str | None = None) -> str:
        red = red or self.eq.reducer
        if red == "+":
            return f"{target} += {v}"
        if red == "*":
            return f"{target} *= {v}"
        return f"_v = {v}\n{target} = _v if {better(red, '_v', target, self.dtype)} else {target}"

    def choose_hoists(self) -> dict:
        """Reads that do not depend on the innermost loop are read once, just inside the
        innermost loop they depend on (numba cannot hoist them: the output may alias them)."""
        from .schedule import mask_guards, top_factors
        from .ir import walk
        last = len(self.plan.loops) - 1
        out = {}
        for f in top_factors(self.eq.rhs):
            if mask_guards(f) is not None:
                continue
            for n in walk(f):
                if not isinstance(n, Access) or not n.indices or str(n) in out:
                    continue
                names = {x for s in n.indices for x in s.names}
                level = max((self.pos[x] for x in names), default=-1)
                if level < last:
                    out[str(n)] = (f"_h{len(out)}", level, n)
        return out

    def access(self, a: Access) -> str:
        h = getattr(self, "hoists", {}).get(str(a))
        if h is not None and not getattr(self, "_hoisting", False):
            return h[0]
        return self.plain_access(a)

    def emit_hoists(self, level: int):
        self._hoisting = True
        try:
            for name, lev, acc in self.hoists.values():
                if lev == level:
                    self.emit(f"{name} = {self.plain_access(acc)}")
        finally:
            self._hoisting = False

    def open(self, k: int, outer_only: bool = False, hoist: bool = True):
        """Open loop number k of the plan (bounds clipped by its guards)."""
        plan = self.plan
        loop = plan.loops[k]
        if plan.collapse and k == 0:
            a, b = plan.collapse
            self.emit(f"_na = max(_stop_{a} - _start_{a}, 0)\n_nb = max(_stop_{b} - _start_{b}, 0)")
            self.emit(f"for _ab in _prange(_na * _nb):")
            self.depth += 1
            self.emit(f"{a} = _start_{a} + _ab // _nb\n{b} = _start_{b} + _ab % _nb")
            self.opened += [a, b]
            if hoist:
                self.emit_hoists(0)
                self.emit_hoists(1)
            return
        base = ("_clo", "_chi") if plan.chunked == loop.index else None
        if plan.block and plan.block[0] == loop.index:
            base = ("_jb", f"min(_jb + {plan.block[1]}, _stop_{loop.index})")
        if k == len(plan.loops) - 1 and not loop.parallel:
            # Innermost loop counted from 0: with a start known to be >= 0 the compiler drops
            # negative-index wraparound and vectorises the loop.
            start, stop, checks = self.loop_bounds(loop, set(self.opened), list(plan.guards), base)
            v = loop.index
            if v in self.nonneg:
                start = f"max({start}, 0)"
            self.emit(f"_first = {start}\nfor _k in range({stop} - _first):\n    {v} = _first + _k")
        else:
            head, checks = self.loop_header(loop, set(self.opened), list(plan.guards), base)
            self.emit(head)
        self.depth += 1
        self.opened.append(loop.index)
        for c in checks:
            self.emit(c)
        if hoist:
            self.emit_hoists(k)

    def close_to(self, depth: int, count: int):
        self.depth = depth
        del self.opened[count:]

    def open_range(self, ks, hoist=True):
        i = 0
        ks = list(ks)
        while i < len(ks):
            self.open(ks[i], hoist=hoist)
            i += 2 if (self.plan.collapse and ks[i] == 0) else 1

    def open_chunks(self, prepare: str = ""):
        """The outer prange over blocks of the chunked index (block bounds _clo, _chi)."""
        v = self.plan.chunked
        self.emit(f"_n_c = max(_stop_{v} - _start_{v}, 0)\n_nc = min({CHUNKS}, max(_n_c, 1))")
        if prepare:
            self.emit(prepare)
        self.emit("for _c in _prange(_nc):")
        self.depth += 1
        self.emit(f"_clo = _start_{v} + (_n_c * _c) // _nc\n"
                  f"_chi = _start_{v} + (_n_c * (_c + 1)) // _nc")

    def result(self, acc: str) -> str:
        if self.eq.finaliser:
            return self.expr(Call(self.eq.finaliser, (Param(acc),)))
        return acc

    def store(self, lhs: str, value: str):
        op = {":=": "=", "=": "=", "+=": "+=", "-=": "-=", "*=": "*="}[self.eq.assign]
        self.emit(f"{lhs} {op} {value}")

    # ------------------------------------------------------------ forms
    def render_scalar(self):
        """Left loops outside, reduction loops inside, a scalar accumulator (a register)."""
        eq, plan = self.eq, self.plan
        n = len(plan.loops)
        nleft = sum(1 for l in plan.loops if not l.reduction)
        ident = identity_code(eq.reducer, self.dtype)
        lhs = self.access(eq.lhs) if eq.lhs.indices else f"{eq.output}[0]"
        self.emit_hoists(-1)
        if plan.chunked:
            self.open_chunks(f"_part = _np.empty(_nc, _T)" if plan.partial == "scalar" else "")
        self.open_range(range(nleft))
        if nleft == n:
            self.store(lhs, self.rhs_without_guards())
            return
        level, count = self.depth, len(self.opened)
        self.emit(f"_acc = {ident}")
        if plan.lanes and not self.lane_loop_has_checks():
            self.open_range(range(nleft, n - 1))
            self.emit_lanes(n - 1)
        else:
            self.open_range(range(nleft, n))
            self.emit(self.combine("_acc", self.rhs_without_guards()))
        self.close_to(level, count)
        if plan.partial == "scalar":
            self.emit("_part[_c] = _acc")
            self.close_to(1, 0)
            self.emit(f"_acc = {ident}\nfor _c in range(_nc):")
            self.depth += 1
            self.emit(self.combine("_acc", "_part[_c]"))
            self.depth -= 1
        self.store(lhs, self.result("_acc"))

    def lane_loop_has_checks(self) -> bool:
        loop = self.plan.loops[-1]
        opened = {l.index for l in self.plan.loops[:-1]}
        return bool(self.loop_bounds(loop, opened, list(self.plan.guards))[2])

    def emit_lanes(self, k: int):
        """A reduction over a contiguous loop with LANES independent accumulators, which the
        compiler can turn into vector instructions (a single chain cannot be vectorised, and a
        float sum chain waits on every add).  The lanes are combined in a fixed order, so the
        result does not depend on the number of threads."""
        loop = self.plan.loops[k]
        v, L = loop.index, self.plan.lanes
        base = ("_clo", "_chi") if self.plan.chunked == v else None
        start, stop, _ = self.loop_bounds(loop, set(self.opened), list(self.plan.guards), base)
        red = self.eq.reducer
        value = self.rhs_without_guards()
        if v in self.nonneg:
            start = f"max({start}, 0)"
        self.emit(f"_lo = {start}\n_hi = {stop}\n_e = _lo + max(_hi - _lo, 0) // {L} * {L}")
        self.emit("\n".join(f"_a{l} = {'_T(0)' if red == '+' else '_acc'}" for l in range(L)))
        # (max)/(min) of floats: the lanes compare plainly (one max instruction each) and one
        # flag records whether a NaN was seen, which then is the result (2000x2000 row max on a
        # loaded machine: 0.59 ms, 0.55 ms without any check, 1.09 ms with a NaN-aware select
        # per lane).
        nan_flag = red != "+" and self.dtype.kind == "f"
        if nan_flag:
            self.emit("_nan = False")
        self.emit(f"for _j in range(max(_hi - _lo, 0) // {L}):")
        self.depth += 1
        for l in range(L):
            step = (f"_a{l} += _x" if red == "+" else
                    f"_a{l} = _x if _x {'>' if red == 'max' else '<'} _a{l} else _a{l}")
            if nan_flag:
                step += "\n_nan = _nan | (_x != _x)"
            self.emit(f"{v} = _lo + _j * {L} + {l}\n_x = {value}\n{step}")
        self.depth -= 1
        self.emit(f"for _k in range(_hi - _e):\n    {v} = _e + _k")
        self.depth += 1
        self.emit(self.combine("_acc", value))
        self.depth -= 1
        if red == "+":
            pairs = [f"_a{l}" for l in range(L)]
            while len(pairs) > 1:
                pairs = [f"({a} + {b})" for a, b in zip(pairs[::2], pairs[1::2])]
            self.emit(f"_acc += {pairs[0]}")
            return
        for l in range(L):
            self.emit(f"if {better(red, f'_a{l}', '_acc', self.dtype)}:\n    _acc = _a{l}")
        if nan_flag:
            self.emit("if _nan:\n    _acc = _T(_np.nan)")

    def render_row(self):
        """Left loops outside, then the reductions, then the contiguous left index innermost:
        each reduction step updates a whole row of the output (or of an accumulator row)."""
        eq, plan = self.eq, self.plan
        n = len(plan.loops)
        r = plan.loops[-1].index
        nleft = sum(1 for l in plan.loops[:-1] if not l.reduction)
        red, assign = eq.reducer, eq.assign
        ident = identity_code(red, self.dtype)
        reads_out = any(a.array == eq.output for a in eq.accesses())
        direct = not eq.finaliser and not reads_out and (
            assign in (":=", "=") or (red == "+" and assign in ("+=", "-="))
            or (red == "*" and assign == "*="))
        lhs = self.access(eq.lhs)
        acc = f"_accv[{r} - _start_{r}]"
        alloc = f"_accv = _np.empty(max(_stop_{r} - _start_{r}, 0), _T)"
        self.emit_hoists(-1)
        if plan.chunked:
            self.open_chunks()
        if not direct and (plan.chunked or nleft == 0):
            self.emit(alloc)
        if plan.block and direct:
            # Cache blocking: fill the output once, then for each block of the first reduction
            # loop run every output row over that block (a parallel loop per block).
            if assign in (":=", "="):
                self.open_range(range(nleft), hoist=False)
                self.open(n - 1, hoist=False)
                self.emit(f"{lhs} = {ident}")
                self.close_to(1, 0)
            v, size = plan.block
            self.emit(f"for _jb in range(_start_{v}, _stop_{v}, {size}):")
            self.depth += 1
            self.open_range(range(nleft))
            self.open_range(range(nleft, n))
            value = self.rhs_without_guards()
            self.emit(f"{lhs} -= {value}" if assign == "-=" else self.combine(lhs, value))
            return
        for i, k in enumerate(range(nleft)):
            if self.plan.collapse and k == 1:
                continue
            self.open(k)
            if i == 0 and not direct and not plan.chunked:
                self.emit(alloc)
        level, count = self.depth, len(self.opened)
        if not direct or assign in (":=", "="):
            self.open(n - 1, hoist=False)
            self.emit(f"{lhs if direct else acc} = {ident}")
            self.close_to(level, count)
        self.open_range(range(nleft, n))
        value = self.rhs_without_guards()
        if direct and assign == "-=":
            self.emit(f"{lhs} -= {value}")
        else:
            self.emit(self.combine(lhs if direct else acc, value))
        self.close_to(level, count)
        if not direct:
            self.open(n - 1, hoist=False)
            self.store(lhs, self.result(acc))
            self.close_to(level, count)

    def render_scatter(self):
        """Every index tuple combines its value into its element.  Threads only over a safe
        index, or over blocks each with its own copy of the output (partial = "array")."""
        eq, plan = self.eq, self.plan
        n = len(plan.loops)
        red, assign = eq.reducer, eq.assign
        ident = identity_code(red, self.dtype)
        lhs = self.access(eq.lhs)
        # A left-hand pad(...) position (the gradient of a padded gather) drops the writes that
        # fall outside the output.
        idx = [self.slot(s, eq.output, d) for d, s in enumerate(eq.lhs.indices)]
        inside = " and ".join(f"0 <= {i} < {eq.output}.shape[{d}]" for d, (s, i) in
                              enumerate(zip(eq.lhs.indices, idx))
                              if isinstance(s, Wrapped) and s.kind == "pad")
        if inside:
            lhs = f"{eq.output}[{', '.join(idx)}]"
        write = (lambda stmt: self.emit(f"if {inside}:\n    {stmt}")) if inside else self.emit
        if assign in (":=", "="):
            chunked = plan.chunked
            if chunked:          # the initialisation runs serially over plain loops
                self.plan = replace_plan(plan, chunked=None)
            self.open_range(range(n), hoist=False)
            self.emit(f"{lhs} = {ident}")
            self.close_to(1, 0)
            self.plan = plan
        self.emit_hoists(-1)
        value = self.rhs_without_guards()
        if plan.partial == "array":
            part = f"_part[_c, {', '.join(idx)}]"
            self.open_chunks(f"_part = _np.full((_nc,) + {eq.output}.shape, {ident}, _T)")
            self.open_range(range(n))
            write(self.combine(part, value, "*" if assign == "*=" else
                               "+" if assign == "-=" else red))
            self.close_to(1, 0)
            nd = len(eq.lhs.indices)
            for d in range(nd):
                self.emit(f"for _d{d} in {'_prange' if d == 0 else 'range'}({eq.output}.shape[{d}]):")
                self.depth += 1
            self.emit("for _c in range(_nc):")
            self.depth += 1
            el = ", ".join(f"_d{d}" for d in range(nd))
            src = f"_part[_c, {el}]"
            if assign == "-=":
                self.emit(f"{eq.output}[{el}] -= {src}")
            elif assign == "*=":
                self.emit(f"{eq.output}[{el}] *= {src}")
            else:
                self.emit(self.combine(f"{eq.output}[{el}]", src))
            return
        self.open_range(range(n))
        if assign == "-=":
            write(f"{lhs} -= {value}")
        elif assign == "*=":
            write(f"{lhs} *= {value}")
        else:
            write(self.combine(lhs, value))


def replace_plan(plan: Plan, **changes) -> Plan:
    from dataclasses import replace
    return replace(plan, **changes)


def render(plan: Plan) -> Source:
    """The loop nest of `plan`; user names appear renamed (codetext.rename_plan), `args` are
    the names the caller binds."""
    src = _Render(rename_plan(plan), shown=plan).render()
    return replace_plan(src, args=tuple(user_arg(a) for a in src.args))   # (any dataclass)
