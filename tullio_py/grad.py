"""Symbolic gradients: Equation -> {input: gradient Equations}.  The only module that uses sympy.

For `out[L] := (red) RHS`, every read `x[S]` of a differentiable array gets the equation

    dx[S] += dout[L] * dRHS/dx[S]

where the partial is computed by sympy on scalar placeholders (one symbol per distinct read; an
array read at several positions gets one equation per position, all accumulating into dx).  The
equations are ordinary statements: their shifted left-hand sides are turned into gathers by
rewrite.py when they are compiled, exactly like a user's.  Derivation depends only on the
equation and the options, and returns frozen data, so it can be cached anywhere.

Rules beyond plain calculus:
- top-level index masks of the forward (`(i <= j)`) restrict the forward's iteration; they are
  kept as top-level factors of every gradient, so they restrict the gradient's iteration too;
- `where`, `relu`, `max`, `min`: the gradient flows only through the chosen branch, written as
  `where(cond, da, db)` so that an unchosen branch's inf/nan never reaches the result;
- `(max)`/`(min)`: the gradient goes to the first extremal tuple in index order, found by a
  helper statement `(min) out_arg[L] := where(RHS == out[L], <linear index>, <none>)`; NaN
  propagates through the reduction, and a NaN result sends the gradient to the first NaN
  tuple (`where(RHS != RHS, <linear index>, <none>)` in the helper's last branch);
- finalisers: `out = f(acc)`, so `f'(acc)` is written through `out` where f is invertible
  (`exp: out`, `sqrt: 0.5/out`, ...), else through a helper `out_pre[L] := RHS`;
- complex arrays (Wirtinger calculus): dx += conj(dRHS/dx) * dout + dRHS/dconj(x) * conj(dout),
  of which a real input x takes the real part: dx += real(...).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import memo
from .errors import GradientError
from .ir import (Access, Affine, Binary, Call, Compare, Const, Equation, IndexValue, Param, Unary,
                 Wrapped, walk)

# f'(acc) written through out = f(acc), for finalisers that can be inverted.
_FINAL_VIA_OUT = {
    "exp": lambda o: o,
    "log": lambda o: Call("exp", (Unary("-", o),)),
    "log1p": lambda o: Call("exp", (Unary("-", o),)),
    "expm1": lambda o: Binary("+", o, Const(1)),
    "sqrt": lambda o: Binary("/", Const(0.5), o),
    "tan": lambda o: Binary("+", Const(1), Binary("**", o, Const(2))),
    "tanh": lambda o: Binary("-", Const(1), Binary("**", o, Const(2))),
    "sinh": lambda o: Call("sqrt", (Binary("+", Const(1), Binary("**", o, Const(2))),)),
    "arctan": lambda o: Binary("**", Call("cos", (o,)), Const(2)),
    "sigmoid": lambda o: Binary("*", o, Binary("-", Const(1), o)),
    "relu": lambda o: Compare((">",), (o, Const(0))),
}
# f'(acc) through the pre-finaliser value, for the others.
_FINAL_VIA_PRE = {
    "sin": lambda a: Call("cos", (a,)),
    "cos": lambda a: Unary("-", Call("sin", (a,))),
    "cosh": lambda a: Call("sinh", (a,)),
    "abs": lambda a: Binary("-", Compare((">",), (a, Const(0))), Compare(("<",), (a, Const(0)))),
}
NONE_INDEX = "none"     # helper parameter: the "no tuple found" value of an argmax


@dataclass(frozen=True)
class Derivation:
    """Frozen result of `derive`.  `helpers` run first (`:=` statements computing arrays the
    gradients read); `grads` are (input, equations accumulating into `d<input>`), equations in
    shifted (pre-rewrite) form.  `params` are the helper parameters (name -> description) whose
    values come from the forward's ranges; `uses` lists the forward arrays besides the inputs
    that the equations read (the output, when it appears)."""
    forward: Equation
    cotangent: str
    gradient_names: tuple[tuple[str, str], ...]     # input -> name of its gradient array
    helpers: tuple[Equation, ...]
    grads: tuple[tuple[str, tuple[Equation, ...]], ...]
    params: tuple[tuple[str, tuple], ...]
    skipped: tuple[tuple[str, str], ...]            # (array, reason) never differentiated
    error: str | None = None                        # set when no gradient exists at all

    def equations(self, name: str) -> tuple[Equation, ...]:
        return dict(self.grads).get(name, ())


_CACHE = memo.Memo("grad.derivations", 512)


def derive(eq: Equation, nograd: tuple[str, ...] = (), complex_mode: bool = False,
           real_inputs: tuple[str, ...] = ()) -> Derivation:
    """Gradient equations of every differentiable input of `eq` (cached per arguments).
    `real_inputs`: inputs that hold real values although the statement is complex; their
    gradient terms are wrapped in real(...), so that they accumulate into a real array."""
    key = (eq, tuple(nograd), complex_mode, tuple(real_inputs))
    d = _CACHE.get(key)
    if d is None:
        d = _CACHE[key] = _derive(eq, tuple(nograd), complex_mode, tuple(real_inputs))
    return d


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _top_masks(rhs):
    """Split the top-level factors of the right side into index-only masks (which restrict the
    forward's iteration) and the rest."""
    from .schedule import compare_guards, top_factors
    masks, rest = [], []
    for f in top_factors(rhs):
        (masks if isinstance(f, Compare) and compare_guards(f) is not None else rest).append(f)
    body = rest[0] if rest else Const(1)
    for f in rest[1:]:
        body = Binary("*", body, f)
    return masks, body


def _times(*factors):
    out = None
    for f in factors:
        if isinstance(f, Const) and f.value == 1:
            continue
        out = f if out is None else Binary("*", out, f)
    return out if out is not None else Const(1)


def _lhs_slot(slot, eq: Equation):
    """The forward read's position, as the gradient's left-hand position: `pad(e, lo, hi)`
    becomes e (the rewrite clips the new index to the gradient array, which drops exactly the
    padding's contributions)."""
    if isinstance(slot, Wrapped) and slot.kind == "pad":
        if isinstance(slot.inner, Affine) and slot.inner.terms:
            return slot.inner
        raise GradientError(f"no gradient through the padded gather {slot} (a padded gather "
                            "cannot be written to)", eq.text or str(eq), slot.span,
                            "pass nograd=... for this array")
    return slot


def _derive(eq: Equation, nograd: tuple[str, ...], complex_mode: bool,
            real_inputs: tuple[str, ...] = ()) -> Derivation:
    text = eq.text or str(eq)
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
    cot = _fresh("d" + eq.output, taken)
    index_arrays = {g.array for g in eq.gathers()}
    read = [a.array for a in eq.accesses()]
    skipped = [(n, "used only as an index array") for n in index_arrays if n not in read]
    skipped += [(n, "excluded by nograd=") for n in dict.fromkeys(read) if n in nograd]
    if eq.output in read:
        skipped.append((eq.output, "the output itself (a Tape differentiates in-place updates)"))
    inputs = [n for n in dict.fromkeys(read) if n not in nograd and n != eq.output]
    wrapped = [a.array for a in eq.accesses() if a.array in inputs and any(
        isinstance(s, Wrapped) and (s.kind != "pad" or not isinstance(s.inner, Affine))
        for s in a.indices)]
    if wrapped:
        bad = ", ".join(dict.fromkeys(wrapped))
        return Derivation(eq, cot, (), (), (), (), tuple(skipped),
                          f"no gradient for {bad}: it is read through clamp(), mod() or a padded "
                          "gather, whose gradient would be a many-to-one scatter (not supported)"
                          f" -- pass nograd=({', '.join(repr(n) for n in dict.fromkeys(wrapped))},)")
    names = tuple((n, _fresh("d" + n, taken)) for n in inputs)
    base = Derivation(eq, cot, names, (), (), (), tuple(skipped))
    if eq.reducer == "*":
        return _replace(base, error=f"no gradient for a (*) reduction: inputs {', '.join(inputs)} "
                                    "would need a division by each factor, undefined where one is 0")
    inplace = eq.assign in ("+=", "-=")
    if inplace and (eq.finaliser or eq.reducer in ("max", "min")):
        return _replace(base, error=f"no gradient for '{eq.assign}' with "
                                    f"{'a finaliser' if eq.finaliser else f'a ({eq.reducer}) reduction'}"
                                    ": write the reduction to a new array first (':=')")
    masks, body = _top_masks(eq.rhs)
    dout = Access(cot, eq.lhs.indices)
    out_read = Access(eq.output, eq.lhs.indices)
    helpers, params = [], []
    # f'(acc) of the finaliser, and the value the reduction produced (for (max)/(min)).
    fprime, reduced = Const(1), out_read
    needs_pre = eq.finaliser and (eq.finaliser in _FINAL_VIA_PRE or eq.reducer in ("max", "min"))
    if eq.finaliser and complex_mode and eq.finaliser in ("abs", "relu", "real", "imag", "conj"):
        return _replace(base, error=f"no gradient through the finaliser {eq.finaliser} of "
                                    "complex values")
    if needs_pre:
        pre = _fresh(eq.output + "_pre", taken)
        helpers.append(Equation(Access(pre, eq.lhs.indices), ":=", eq.rhs, eq.reduction, None))
        reduced = Access(pre, eq.lhs.indices)
        f = {**_FINAL_VIA_PRE, **{k: _pre_form(k) for k in _FINAL_VIA_OUT}}[eq.finaliser]
        fprime = f(reduced)
    elif eq.finaliser and eq.finaliser in _FINAL_VIA_OUT:
        fprime = _FINAL_VIA_OUT[eq.finaliser](out_read)
    elif eq.finaliser in ("conj", "real"):
        fprime = Const(1)
    elif eq.finaliser == "imag":
        fprime = Const(0)
    chosen = None
    if eq.reducer in ("max", "min"):
        red = eq.reduction_indices
        lin = IndexValue(red[0])
        for n in red[1:]:
            length = _fresh("len_" + n, taken)
            params.append((length, ("len", n)))
            lin = Binary("+", Binary("*", lin, Param(length)), IndexValue(n))
        none = _fresh(NONE_INDEX, taken)
        params.append((none, ("none", red)))
        arg = _fresh(eq.output + "_arg", taken)
        # The first tuple whose value is the result; a NaN result came from the first NaN
        # (NaN propagates through (max)/(min); torch's max(dim) picks that position too).
        found = Call("where", (Compare(("!=",), (body, body)), lin, Param(none)))
        found = Call("where", (Compare(("==",), (body, reduced)), lin, found))
        helpers.append(Equation(Access(arg, eq.lhs.indices), ":=",
                                _times(found, *masks), "min"))
        chosen = Compare(("==",), (lin, Access(arg, eq.lhs.indices)))
    partials = _partials(body, inputs, complex_mode, text)
    grads = []
    sign_op = "-=" if eq.assign == "-=" else "+="
    for name in inputs:
        out_eqs = []
        for acc, (d, dbar) in partials[name]:
            lhs = Access(dict(names)[name], tuple(_lhs_slot(s, eq) for s in acc.indices))
            if complex_mode:
                terms = []
                if d is not None:
                    terms.append(_times(dout, Call("conj", (_times(fprime, d),))))
                if dbar is not None:
                    terms.append(_times(Call("conj", (dout,)), _times(fprime, dbar)))
                if not terms:
                    continue
                value = terms[0] if len(terms) == 1 else Binary("+", terms[0], terms[1])
                if name in real_inputs:     # the real part is the gradient of a real input
                    value = Call("real", (value,))
                if chosen is not None:
                    value = Call("where", (chosen, value, Const(0)))
                rhs = _times(value, *masks)
            else:
                if d is None:
                    continue
                partial = _times(fprime, d)
                if chosen is not None:
                    partial = Call("where", (chosen, partial, Const(0)))
                rhs = _times(dout, partial, *masks)
            out_eqs.append(_count_lost(eq, Equation(lhs, sign_op, rhs), taken, params))
        grads.append((name, tuple(out_eqs)))
    return _replace(base, helpers=tuple(helpers), grads=tuple(grads), params=tuple(params))


def _count_lost(fwd: Equation, g: Equation, taken: set, params: list) -> Equation:
    """A forward index that the gradient term no longer mentions anywhere was still summed
    over: `y[i] := x[i] + w[j]` is J*x[i] + sum(w), so dx[i] += dy[i] * len_j.  Each such index
    multiplies the term by the length of its forward range (a parameter filled in per call)."""
    lost = [n for n in fwd.indices if n not in g.indices]
    factors = []
    for n in lost:
        existing = [p for p, (kind, what) in params if kind == "len" and what == n]
        length = existing[0] if existing else _fresh("len_" + n, taken)
        if not existing:
            params.append((length, ("len", n)))
        factors.append(Param(length))
    return replace(g, rhs=_times(g.rhs, *factors)) if factors else g


def _pre_form(fin: str):
    """f'(acc) from acc itself, for invertible finalisers when the pre value is at hand."""
    def f(a):
        if fin in ("relu",):
            return Compare((">",), (a, Const(0)))
        if fin == "sigmoid":
            s = Call("sigmoid", (a,))
            return Binary("*", s, Binary("-", Const(1), s))
        table = {"exp": lambda: Call("exp", (a,)), "log": lambda: Binary("/", Const(1), a),
                 "log1p": lambda: Binary("/", Const(1), Binary("+", Const(1), a)),
                 "expm1": lambda: Call("exp", (a,)),
                 "sqrt": lambda: Binary("/", Const(0.5), Call("sqrt", (a,))),
                 "tan": lambda: Binary("+", Const(1), Binary("**", Call("tan", (a,)), Const(2))),
                 "tanh": lambda: Binary("-", Const(1), Binary("**", Call("tanh", (a,)), Const(2))),
                 "sinh": lambda: Call("cosh", (a,)),
                 "arctan": lambda: Binary("/", Const(1), Binary("+", Const(1), Binary("**", a, Const(2))))}
        return table[fin]()
    return f


def _replace(d: Derivation, **kw) -> Derivation:
    from dataclasses import replace
    return replace(d, **kw)


# ----------------------------------------------------------------------------- sympy
def _partials(body, inputs, complex_mode: bool, text: str) -> dict:
    """{input: [(read, (d body/d read, d body/d conj(read)) as IR or None)]}."""
    conv = _Converter(complex_mode)
    s = conv.to_sympy(body)
    out = {n: [] for n in inputs}
    for acc, (sym, sym_bar) in conv.reads.items():
        if acc.array not in out:
            continue
        d = _diff(s, sym)
        dbar = _diff(s, sym_bar) if sym_bar is not None else 0
        out[acc.array].append((acc, (conv.to_ir(d) if d != 0 else None,
                                     conv.to_ir(dbar) if dbar != 0 else None)))
    return out


def is_shifted_lhs(eq: Equation) -> bool:
    """True when a left-hand position is not a bare index or a constant."""
    return any(not isinstance(s, Affine) or (s.terms and not s.is_bare) for s in eq.lhs.indices)


def uses_array(eq: Equation, name: str) -> bool:
    return any(isinstance(n, Access) and n.array == name for n in walk(eq.rhs)) or any(
        g.array == name for g in eq.gathers())


_SYM = None


def _sympy():
    """sympy and the function classes the derivatives need, built once on first use."""
    global _SYM
    if _SYM is not None:
        return _SYM
    import sympy as sp

    class Where(sp.Function):
        nargs = 3

        def _eval_derivative(self, s):
            c, a, b = self.args
            da, db = sp.diff(a, s), sp.diff(b, s)
            return sp.S.Zero if da == 0 and db == 0 else Where(c, da, db)

    class Cmp(sp.Function):      # (op code, a, b): 1 or 0; derivative zero
        nargs = 3

        def _eval_derivative(self, s):
            return sp.S.Zero

    def chain(fprime):
        def _eval_derivative(self, s):
            a = self.args[0]
            da = sp.diff(a, s)
            return sp.S.Zero if da == 0 else fprime(self, a, da)
        return _eval_derivative

    class Relu(sp.Function):
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: Where(Cmp(1, a, 0), da, 0))

    class Sign(sp.Function):
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: sp.S.Zero)

    class Abs(sp.Function):      # real arguments: the gradient at 0 is 0 (as torch)
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: Sign(a) * da)

    class Sigmoid(sp.Function):
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: f * (1 - f) * da)

    class Log1p(sp.Function):
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: da / (1 + a))

    class Expm1(sp.Function):
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: sp.exp(a) * da)

    def choose(name: str, cmp: int):
        """max/min of two values: the gradient goes through the chosen argument (ties: the
        first; a NaN argument is the result, the first if both are NaN); `cmp` is the
        comparison code that selects the first argument."""
        def _eval_derivative(self, s):
            a, b = self.args
            da, db = sp.diff(a, s), sp.diff(b, s)
            if da == 0 and db == 0:
                return sp.S.Zero
            return Where(Cmp(cmp, a, b), da, Where(Cmp(5, a, a), da, db))
        return type(name, (sp.Function,), {"nargs": 2, "_eval_derivative": _eval_derivative})

    Max2, Min2 = choose("Max2", 3), choose("Min2", 2)

    class ConjParam(sp.Function):
        nargs = 1
        _eval_derivative = chain(lambda f, a, da: sp.S.Zero)

    ns = dict(sp=sp, Where=Where, Cmp=Cmp, Relu=Relu, Sign=Sign, Abs=Abs, Sigmoid=Sigmoid,
              Log1p=Log1p, Expm1=Expm1, Max2=Max2, Min2=Min2, ConjParam=ConjParam)
    _SYM = type("SympyEnv", (), ns)
    return _SYM


_CMP_OPS = ("<", ">", "<=", ">=", "==", "!=")
_ANALYTIC = {"exp": "exp", "log": "log", "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan",
             "tanh": "tanh", "sinh": "sinh", "cosh": "cosh", "arctan": "atan"}


def _diff(expr, sym):
    return _sympy().sp.diff(expr, sym)


class _Converter:
    """IR <-> sympy.  Every distinct array read becomes a symbol (and, for complex data, a
    second symbol for its conjugate); comparisons and where-conditions of the forward, index
    values and parameters become opaque symbols that convert back to the original IR."""

    def __init__(self, complex_mode: bool):
        self.S = _sympy()
        self.complex = complex_mode
        self.reads: dict = {}      # Access -> (symbol, conj symbol or None)
        self.back: dict = {}       # symbol name -> IR
        self.opaque: dict = {}     # IR -> symbol

    def _symbol(self, ir, prefix: str):
        if ir not in self.opaque:
            name = f"_{prefix}{len(self.back)}"
            self.opaque[ir] = self.S.sp.Symbol(name, real=not self.complex)
            self.back[name] = ir
        return self.opaque[ir]

    def read(self, acc: Access, conj: bool):
        if acc not in self.reads:
            z = self._symbol(acc, "a")
            zb = None
            if self.complex:
                zb = self.S.sp.Symbol(f"_b{len(self.back)}")
                self.back[zb.name] = Call("conj", (acc,))
            self.reads[acc] = (z, zb)
        z, zb = self.reads[acc]
        return zb if conj and zb is not None else z

    def to_sympy(self, e, conj: bool = False):
        S, sp = self.S, self.S.sp
        go = lambda x: self.to_sympy(x, conj)  # noqa: E731
        if isinstance(e, Access):
            return self.read(e, conj)
        if isinstance(e, Const):
            v = e.value
            if isinstance(v, complex):
                v = v.conjugate() if conj else v
                return sp.Float(v.real) + sp.I * sp.Float(v.imag)
            return sp.Integer(v) if isinstance(v, (int, bool)) else sp.Float(v)
        if isinstance(e, Param):
            p = self._symbol(e, "p")
            return S.ConjParam(p) if conj and self.complex else p
        if isinstance(e, (IndexValue, Compare)):
            return self._symbol(e, "c")
        if isinstance(e, Unary):
            return -go(e.operand) if e.op == "-" else go(e.operand)
        if isinstance(e, Binary):
            a, b = go(e.left), go(e.right)
            return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
                    "/": lambda: a / b, "**": lambda: a ** b}[e.op]()
        if isinstance(e, Call):
            f = e.func
            if f == "where":
                return S.Where(self._symbol(e.args[0], "c"), go(e.args[1]), go(e.args[2]))
            if f == "conj":
                return self.to_sympy(e.args[0], not conj) if self.complex else go(e.args[0])
            if f in ("real", "imag"):
                if not self.complex:
                    return go(e.args[0]) if f == "real" else sp.S.Zero
                a, ab = self.to_sympy(e.args[0], conj), self.to_sympy(e.args[0], not conj)
                return (a + ab) / 2 if f == "real" else (a - ab) / (2 * sp.I) * (-1 if conj else 1)
            if f == "abs" and self.complex:
                return sp.sqrt(self.to_sympy(e.args[0], False) * self.to_sympy(e.args[0], True))
            args = [go(a) for a in e.args]
            if f in _ANALYTIC:
                return getattr(sp, _ANALYTIC[f])(args[0])
            cls = {"abs": S.Abs, "relu": S.Relu, "sigmoid": S.Sigmoid, "log1p": S.Log1p,
                   "expm1": S.Expm1, "max": S.Max2, "min": S.Min2}[f]
            return cls(*args)
        raise GradientError(f"cannot differentiate {e}")

    def to_ir(self, e):
        S, sp = self.S, self.S.sp
        if isinstance(e, sp.Symbol):
            return self.back[e.name]
        if e.is_Number or e == sp.I or (e.is_number and e.is_Add):
            return _number(complex(e) if not e.is_real else e)
        if isinstance(e, sp.Add):
            terms = list(e.as_ordered_terms())
            out = self.to_ir(terms[0])
            for t in terms[1:]:
                if t.could_extract_minus_sign():
                    out = Binary("-", out, self.to_ir(-t))
                else:
                    out = Binary("+", out, self.to_ir(t))
            return out
        if isinstance(e, sp.Mul):
            if e.could_extract_minus_sign():
                return Unary("-", self.to_ir(-e))
            num, den = [], []
            for f in e.as_ordered_factors():
                if f.is_Pow and f.exp.is_number and f.exp.is_negative:
                    den.append(f.base ** (-f.exp))
                elif f.is_Rational and not f.is_Integer:
                    num.append(sp.Integer(f.p))
                    den.append(sp.Integer(f.q))
                else:
                    num.append(f)
            num = [f for f in num if f != 1]
            top = _times(*[self.to_ir(f) for f in num]) if num else Const(1)
            if not den:
                return top
            return Binary("/", top, _times(*[self.to_ir(f) for f in den]))
        if isinstance(e, sp.Pow):
            b, x = e.base, e.exp
            if x == sp.Rational(1, 2):
                return Call("sqrt", (self.to_ir(b),))
            if x.is_number and x.is_negative:
                return Binary("/", Const(1), self.to_ir(b ** (-x)))
            if x.is_Rational and not x.is_Integer:
                return Binary("**", self.to_ir(b), Binary("/", Const(int(x.p)), Const(int(x.q))))
            return Binary("**", self.to_ir(b), self.to_ir(x))
        if isinstance(e, sp.exp):
            return Call("exp", (self.to_ir(e.args[0]),))
        inv = {v: k for k, v in _ANALYTIC.items()}
        name = type(e).__name__
        if name in inv and name != "sqrt":
            return Call(inv[name], (self.to_ir(e.args[0]),))
        args = e.args
        if isinstance(e, S.Where):
            return Call("where", (self.to_ir(args[0]), self.to_ir(args[1]), self.to_ir(args[2])))
        if isinstance(e, S.Cmp):
            return Compare((_CMP_OPS[int(args[0])],), (self.to_ir(args[1]), self.to_ir(args[2])))
        if isinstance(e, S.Sign):
            a = self.to_ir(args[0])
            return Binary("-", Compare((">",), (a, Const(0))), Compare(("<",), (a, Const(0))))
        if isinstance(e, S.ConjParam):
            return Call("conj", (self.to_ir(args[0]),))
        simple = {S.Abs: "abs", S.Relu: "relu", S.Sigmoid: "sigmoid", S.Log1p: "log1p",
                  S.Expm1: "expm1", S.Max2: "max", S.Min2: "min"}
        for cls, f in simple.items():
            if isinstance(e, cls):
                return Call(f, tuple(self.to_ir(a) for a in args))
        raise GradientError(f"cannot convert the derivative {e} back to tullio_py notation")


def _number(v):
    if isinstance(v, complex):
        return Const(complex(float(v.real), float(v.imag)))
    if v.is_Integer:
        return Const(int(v))
    if v.is_Rational:
        return Binary("/", Const(int(v.p)), Const(int(v.q)))
    return Const(float(v))
