"""Expressions of a statement -> code, for one target's math library.

`Expr(plan, target)` renders index slots, array reads (with pad checks and hoisted reads) and
right-hand sides, casting operands to the dtype numpy computes each operation in.  The only
difference between targets is how functions are written: numpy's ufuncs on the CPU and in
plain python, the `math` / `cmath` modules in CUDA kernels (numpy ufuncs do not compile
there).  `MATH` holds those spellings: `{a}` and `{b}` are the argument codes, `{m}` the
module of the argument's kind (`math`, or `cmath` for complex arguments).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import ArgumentError
from ..ir import (Access, Affine, Binary, Call, Compare, Const, Gather, IndexValue, Param, Unary,
                  Wrapped)
from ..schedule import Plan, mask_guards, top_factors
from .text import number_code

_UNARY = ("exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tan", "tanh", "sinh", "cosh")
# As np.maximum / np.minimum, a NaN argument is the result.  CUDA's is written out (a device
# function would need a GPU to compile to PTX), so `a` appears twice.
_CUDA_MAX = "({a} if ({a} > {b}) | ({a} != {a}) else {b})"
MATH = {
    "cpu": {**{f: f"_np.{f}({{a}})" for f in _UNARY}, "arctan": "_np.arctan({a})",
            "abs": "abs({a})", "conj": "_np.conj({a})",
            "max": "_np.maximum({a}, {b})", "relu": "_np.maximum({a}, {b})",
            "min": "_np.minimum({a}, {b})", "sigmoid": "(1.0 / (1.0 + _np.exp(-{a})))",
            "real": "({a}).real", "imag": "({a}).imag"},
    "cuda": {**{f: f"{{m}}.{f}({{a}})" for f in _UNARY}, "arctan": "{m}.atan({a})",
             "abs": "abs({a})", "conj": "({a}).conjugate()",
             "max": _CUDA_MAX, "relu": _CUDA_MAX, "min": _CUDA_MAX.replace(">", "<"),
             "sigmoid": "(1.0 / (1.0 + {m}.exp(-{a})))",
             "real": "({a}).real", "imag": "({a}).imag"},
}
MATH["python"] = dict(MATH["cpu"])
# Compiled CPU kernels call vecmath.py's straight-line versions of these for float32 and
# float64 (numba's np.exp is a scalar libm call, which keeps a loop from vectorising); in
# plain Python (the same text) jit.module_text binds those names to numpy's ufuncs, and CUDA
# keeps its math library.
VECTOR = ("exp", "log", "tanh", "sigmoid")
MATH["cpu"].update({"exp": "_vm_exp_{t}({a})", "log": "_vm_log_{t}({a})",
                    "tanh": "_vm_tanh_{t}({a})",
                    "sigmoid": "(1.0 / (1.0 + _vm_exp_{t}(-{a})))"})
_VECTOR_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# cmath has no log1p / expm1.
COMPLEX_MATH = {"cuda": {"log1p": "cmath.log(1 + {a})", "expm1": "(cmath.exp({a}) - 1)"}}


def call_text(target: str, f: str, args: list[str], arg_dtype=None) -> str:
    """Code of function f of the argument codes `args` (of dtype `arg_dtype`) on `target`."""
    cplx = arg_dtype is not None and dtypes.kind(arg_dtype) == "c"
    template = (COMPLEX_MATH.get(target, {}).get(f) if cplx else None) or MATH[target][f]
    t = _VECTOR_DTYPES.get(arg_dtype) if target == "cpu" and f in VECTOR else None
    if f in VECTOR and target == "cpu" and t is None:
        template = MATH["python"][f]         # complex or float16: numpy's
    return template.format(a=args[0], b=args[1] if len(args) > 1 else "",
                           m="cmath" if cplx else "math", t=t)


def better(red: str, v: str, acc: str, dtype: np.dtype) -> str:
    """The condition under which `v` replaces `acc` in a (max)/(min) reduction.  For floats a
    NaN value wins and then stays (nothing compares greater than NaN), so NaN propagates as
    in numpy and torch; `|` of the two comparisons (not `or`) keeps it one condition without
    a branch between them."""
    cmp = f"{v} {'>' if red == 'max' else '<'} {acc}"
    return f"({cmp}) | ({v} != {v})" if dtype.kind in "fc" else cmp


def combine(red: str, target: str, v: str, dtype: np.dtype, branch: bool = False) -> str:
    """Code combining value `v` into `target` under reducer `red`.  (max)/(min) is a select
    (`target = _v if ... else target`), or with `branch` an `if` that stores only a better
    value (CUDA, where `target` may be shared memory)."""
    if red == "+":
        return f"{target} += {v}"
    if red == "*":
        return f"{target} *= {v}"
    if branch:
        return f"_v = {v}\nif {better(red, '_v', target, dtype)}:\n    {target} = _v"
    return f"_v = {v}\n{target} = _v if {better(red, '_v', target, dtype)} else {target}"


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


def pad_condition(a: Access, idx: list[str]) -> str:
    """The condition that every pad(...) position of `a` (whose slots render as `idx`) falls
    inside the array; "" when `a` has none."""
    return " and ".join(f"0 <= {i} < {a.array}.shape[{d}]" for d, (s, i) in
                        enumerate(zip(a.indices, idx))
                        if isinstance(s, Wrapped) and s.kind == "pad")


STORE = {":=": "=", "=": "=", "+=": "+=", "-=": "-=", "*=": "*="}


def hoist_table(hoists) -> dict:
    """{read text: (local name, loop level, read)} of (read, loop level) pairs as a Plan's
    `hoists` lists them: the k-th is loaded into the local `_h<k>`."""
    return {str(a): (f"_h{k}", level, a) for k, (a, level) in enumerate(hoists)}


class Expr:
    """Renders the expressions of `plan` (user names already renamed) for `target`.  A read
    listed in `hoists` ({read text: (local name, loop level, read)}, hoist_table) is written
    as its local."""

    def __init__(self, plan: Plan, target: str = "cpu", hoists: dict | None = None):
        self.plan = plan
        self.eq = plan.equation
        self.target = target
        self.dtype = np.dtype(plan.out_dtype)
        self.env = dict(plan.dtypes)     # dtypes of the arrays and parameters
        self.hoists = {} if hoists is None else hoists
        # Indices in the vector lanes (codegen/blocked.py's row index, the innermost loop's
        # index of a plain CPU nest): a position that sums one with other indices
        # (`x[s+i, c1, b, t+j]`, t in the lanes) is passed as an unsigned integer.  It is in
        # the array (>= 0: range inference; a pad() read is a Wrapped slot, checked first);
        # said so, numba does not wrap a negative index around in each lane, which the
        # compiler could only vectorise as a gather (a local layer's dW[c1,i,j,c2,s,t], one
        # thread: 1.42 -> 1.01 ms, load 5; a depthwise convolution's dw[c,j] += dy[b,c,i] *
        # x[b,c,i+j], i innermost, 32x64x256 float32, 2 threads: 1.10 -> 0.18 ms; its dx[b,c,p]
        # += dy[b,c,pad(p-j)] * w[c,j]: 1.28 -> 0.14 ms).
        self.lane_indices: frozenset = frozenset()

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

    def _unsigned(self, s) -> bool:
        """Whether slot `s` renders as an unsigned position (lane_indices): an affine sum with
        a lane index, or such a sum inside pad() (read only where it is inside the array)."""
        inner = s.inner if isinstance(s, Wrapped) and s.kind == "pad" else s
        return (isinstance(inner, Affine) and not inner.is_bare
                and bool(self.lane_indices & set(inner.names)))

    def plain_access(self, a: Access) -> str:
        if not a.indices:
            return f"{a.array}[0]"
        idx = [self.slot(s, a.array, d) for d, s in enumerate(a.indices)]
        shown = [f"_np.uint64({i})" if self._unsigned(s) else i for s, i in zip(a.indices, idx)]
        code = f"{a.array}[{', '.join(shown)}]"
        cond = pad_condition(a, idx)
        if cond and str(a) not in self.plan.guarded_reads:
            code = f"({code} if {cond} else _pad)"
        return code

    def access(self, a: Access) -> str:
        h = self.hoists.get(str(a))
        return h[0] if h is not None else self.plain_access(a)

    def lhs(self) -> str:
        """The left-hand side element: `out[0]` for a scalar result (plain_access)."""
        return self.plain_access(self.eq.lhs)

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
            text = call_text(self.target, f, args, of)
        else:
            raise TypeError(f"cannot render {e!r}")
        return (f"_np.{want.name}({text})" if dtypes.narrow(want) else text), want

    def condition(self, e) -> str:
        if isinstance(e, Compare):
            return self.expr(e)
        return f"{self.expr(e)} != 0"

    def rhs_dtype(self):
        """The dtype of the right-hand side's value (rhs_without_guards)."""
        return self.dtype_of(self.eq.rhs)

    def rhs_without_guards(self) -> str:
        """The right-hand side without its mask factors (the loops' guards apply them)."""
        factors = [f for f in top_factors(self.eq.rhs) if mask_guards(f) is None]
        if not factors:
            return "_T(1)"
        e = factors[0]
        for f in factors[1:]:
            e = Binary("*", e, f)
        return self.expr(e)

    def result(self, acc: str) -> str:
        """The stored value of accumulator `acc`: through the finaliser, if any."""
        if self.eq.finaliser:
            return self.expr(Call(self.eq.finaliser, (Param(acc),)))
        return acc
