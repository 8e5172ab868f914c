"""The calculus of grad.py and tangent.py: IR <-> sympy, and partial derivatives of a right-hand
side with respect to its array reads and scalar parameters.  The only module that imports sympy.

Every distinct array read becomes a symbol (for complex data a second symbol stands for its
conjugate, Wirtinger calculus); comparisons, where-conditions, index values and parameters
become opaque symbols that convert back to the original IR.  `where`, `relu`, `max`, `min`
differentiate into `where(cond, da, db)`, so an unchosen branch's inf/nan never reaches a result.
"""
from __future__ import annotations

from .errors import GradientError
from .ir import Access, Binary, Call, Compare, Const, IndexValue, Param, Unary


def times(*factors):
    """The product of the factors, leaving out constant ones."""
    out = None
    for f in factors:
        if isinstance(f, Const) and f.value == 1:
            continue
        out = f if out is None else Binary("*", out, f)
    return out if out is not None else Const(1)


def partials(body, inputs, complex_mode: bool, params=()) -> dict:
    """{input: [(read, (d body/d read, d body/d conj(read)) as IR or None)]}, and for each name
    in `params` {param: [(Param, (d body/d param, d body/d conj(param)))]}."""
    conv = _Converter(complex_mode)
    s = conv.to_sympy(body)
    out = {n: [] for n in (*inputs, *params)}
    pairs = [(acc, acc.array, sym, bar) for acc, (sym, bar) in conv.reads.items()]
    for name in params:
        p = Param(name)
        sym, bar = conv.opaque.get(p), conv.opaque.get(Call("conj", (p,)))
        if sym is not None or bar is not None:
            pairs.append((p, name, sym, bar))
    for read, name, sym, bar in pairs:
        if name not in out:
            continue
        d = _diff(s, sym) if sym is not None else 0
        dbar = _diff(s, bar) if bar is not None else 0
        out[name].append((read, (conv.to_ir(d) if d != 0 else None,
                                 conv.to_ir(dbar) if dbar != 0 else None)))
    return out


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

    ns = dict(sp=sp, Where=Where, Cmp=Cmp, Relu=Relu, Sign=Sign, Abs=Abs, Sigmoid=Sigmoid,
              Log1p=Log1p, Expm1=Expm1, Max2=Max2, Min2=Min2)
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
        if isinstance(e, Param):      # conj(p) is a symbol of its own (Wirtinger)
            return self._symbol(Call("conj", (e,)) if conj and self.complex else e, "p")
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
            top = times(*[self.to_ir(f) for f in num]) if num else Const(1)
            if not den:
                return top
            return Binary("/", top, times(*[self.to_ir(f) for f in den]))
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
