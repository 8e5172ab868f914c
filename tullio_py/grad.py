"""Symbolic gradients: Equation -> {input: gradient Equations} (the calculus: grad_sympy.py).

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
- `(*)` and `*=`: dout/dRHS at one tuple is the product of the OTHER factors, exact with zeros
  and without dividing by a factor that may be 0: helpers count the zero factors
  (`out_zeros[L] := RHS == 0`) and multiply the nonzero ones (`(*) out_nonzero[L] := where(RHS
  == 0, 1, RHS)`); the product of the others is `out_nonzero / RHS` when nothing is zero, the
  nonzero product at the single zero factor, else 0.  `*=` multiplies by the old value too;
- reads through `clamp()`, `mod()` or a padded gather are many-to-one: their gradient keeps the
  wrapped position on the left (`dx[clamp(i+k-1)] += ...`), a scatter that accumulates every
  tuple into the element it hits (threads: per-block partial copies, schedule.py);
- 0-d parameters (`scalars`) get `ds += dout[L] * dRHS/ds`, summed over every index;
- complex arrays (Wirtinger calculus): dx += conj(dRHS/dx) * dout + dRHS/dconj(x) * conj(dout),
  of which a real input x takes the real part: dx += real(...).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import cache, memo
from .rewrite import eliminations
from .grad_sympy import partials as _partials, times as _times
from .ir import (Access, Affine, Binary, Call, Compare, Const, Equation, Gather, IndexValue, Param,
                 Unary, Wrapped, map_expr, slot_names, walk)

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
    scalars: tuple[str, ...] = ()                   # parameters among the inputs (0-d arrays)

    def equations(self, name: str) -> tuple[Equation, ...]:
        return dict(self.grads).get(name, ())


_CACHE = memo.Memo("grad.derivations", 512)


def derive(eq: Equation, nograd: tuple[str, ...] = (), complex_mode: bool = False,
           real_inputs: tuple[str, ...] = (), scalars: tuple[str, ...] = ()) -> Derivation:
    """Gradient equations of every differentiable input of `eq` (cached per arguments).
    `real_inputs`: inputs that hold real values although the statement is complex; their
    gradient terms are wrapped in real(...), so that they accumulate into a real array.
    `scalars` names the parameters that get a gradient too (passed as 0-d arrays)."""
    key = (eq, tuple(nograd), complex_mode, tuple(real_inputs), tuple(scalars))
    d = _CACHE.get(key)
    if d is None:
        d = _stored(key)            # on disk: a new process's vjp imports no sympy
        if d is None:
            d = _derive(eq, tuple(nograd), complex_mode, tuple(real_inputs), tuple(scalars))
            _store(key, d)
        _CACHE[key] = d
    return d


def _stored(key):
    """The derivation pickled on disk under `key` (cache.py: keyed by the value of every
    argument and the package's source), or None."""
    try:
        d = cache.load_pickle(("derivation", key))
    except TypeError:               # a key without a stable text: not stored on disk
        return None
    return d if isinstance(d, Derivation) and d.forward == key[0] else None


def _store(key, d):
    try:
        cache.store_pickle(("derivation", key), d)
    except TypeError:
        pass


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


def _lhs_slot(slot):
    """The forward read's position, as the gradient's left-hand position: `pad(e, lo, hi)`
    becomes e (the rewrite clips the new index to the gradient array, which drops exactly the
    padding's contributions); a padded gather becomes `pad(J[k]+c)` (a write outside the array
    is dropped); `clamp(e)` and `mod(e)` stay (many-to-one: a scatter)."""
    if isinstance(slot, Wrapped) and slot.kind == "pad":
        if isinstance(slot.inner, Affine):
            return slot.inner
        return Wrapped("pad", slot.inner, None, None, slot.span)
    if isinstance(slot, Wrapped):
        return Wrapped(slot.kind, slot.inner, None, None, slot.span)
    return slot


def _lhs_slots(slots) -> tuple:
    """_lhs_slot of each position, unless the rewrite cannot make the shifted positions bare
    (no index of coefficient +-1 of their own: dx[2*p+2*j-3] from a read at pad(2*p+2*j-3)):
    nothing then clips them to the gradient array, so pad() positions stay pad() (a write
    outside the array is dropped, where it would wrap around)."""
    out = tuple(_lhs_slot(s) for s in slots)
    shifted = [isinstance(s, Wrapped) and s.kind == "pad" and isinstance(s.inner, Affine)
               and not s.inner.is_bare for s in slots]
    if any(shifted) and eliminations(out) is None:
        out = tuple(Wrapped("pad", s.inner, None, None, s.span) if k else x
                    for s, x, k in zip(slots, out, shifted))
    return out


@dataclass
class _Chain:
    """What every derivative of one statement shares: the top-level masks (restricting the
    iteration), the body they multiply, helper statements and parameters, `factor` = d out[L] /
    d body at one tuple (finaliser's f'(acc), the other factors of a product, *='s old value),
    and for (max)/(min) the condition that selects the chosen tuple."""
    masks: list
    body: object
    helpers: list
    params: list
    factor: object
    chosen: object = None
    found: object = None        # (max)/(min): the reduction found a tuple (`out_arg < none`)


def chain(eq: Equation, taken: set, complex_mode: bool) -> _Chain | str:
    """The shared part of the derivatives of `eq` (gradients here, tangents in tangent.py), or
    the reason none exists.  New names (helpers, parameters) are added to `taken`."""
    if eq.assign in ("+=", "-=", "*=") and (eq.finaliser or eq.reducer in ("max", "min")):
        return (f"no gradient for '{eq.assign}' with "
                f"{'a finaliser' if eq.finaliser else f'a ({eq.reducer}) reduction'}"
                ": write the reduction to a new array first (':=')")
    if eq.finaliser and complex_mode and eq.finaliser in ("abs", "relu", "real", "imag", "conj"):
        return f"no gradient through the finaliser {eq.finaliser} of complex values"
    masks, body = _top_masks(eq.rhs)
    lhs = eq.lhs.indices
    out_read = Access(eq.output, lhs)
    c = _Chain(masks, body, [], [], Const(1))
    # f'(acc) of the finaliser, and the value the reduction produced (for (max)/(min)).
    fprime, reduced = Const(1), out_read
    if eq.finaliser and (eq.finaliser in _FINAL_VIA_PRE or eq.reducer in ("max", "min")):
        pre = _fresh(eq.output + "_pre", taken)
        c.helpers.append(Equation(Access(pre, lhs), ":=", eq.rhs, eq.reduction, None))
        reduced = Access(pre, lhs)
        f = {**_FINAL_VIA_PRE, **{k: _pre_form(k) for k in _FINAL_VIA_OUT}}[eq.finaliser]
        fprime = f(reduced)
    elif eq.finaliser and eq.finaliser in _FINAL_VIA_OUT:
        fprime = _FINAL_VIA_OUT[eq.finaliser](out_read)
    elif eq.finaliser == "imag":
        fprime = Const(0)
    others = Const(1)
    if eq.reducer in ("max", "min"):
        red = eq.reduction_indices
        lin = IndexValue(red[0])
        for n in red[1:]:
            length = _fresh("len_" + n, taken)
            c.params.append((length, ("len", n)))
            lin = Binary("+", Binary("*", lin, Param(length)), IndexValue(n))
        none = _fresh(NONE_INDEX, taken)
        c.params.append((none, ("none", red)))
        arg = _fresh(eq.output + "_arg", taken)
        # The first tuple whose value is the result; a NaN result came from the first NaN
        # (NaN propagates through (max)/(min); torch's max(dim) picks that position too).
        first = Call("where", (Compare(("!=",), (body, body)), lin, Param(none)))
        first = Call("where", (Compare(("==",), (body, reduced)), lin, first))
        c.helpers.append(Equation(Access(arg, lhs), ":=", _times(first, *masks), "min"))
        c.chosen = Compare(("==",), (lin, Access(arg, lhs)))
        c.found = Compare(("<",), (Access(arg, lhs), Param(none)))
    elif eq.reducer == "*":
        zeros, nonzero = _fresh(eq.output + "_zeros", taken), _fresh(eq.output + "_nonzero", taken)
        is0 = Compare(("==",), (body, Const(0)))
        c.helpers.append(Equation(Access(zeros, lhs), ":=", _times(is0, *masks)))
        c.helpers.append(Equation(Access(nonzero, lhs), ":=",
                                  _times(Call("where", (is0, Const(1), body)), *masks), "*"))
        z, p = Access(zeros, lhs), Access(nonzero, lhs)
        count = lambda k: Compare(("==",), (z, Const(k)))  # noqa: E731
        others = Call("where", (is0, Call("where", (count(1), p, Const(0))),
                                Call("where", (count(0), Binary("/", p, body), Const(0)))))
    c.factor = _times(fprime, others, out_read if eq.assign == "*=" else Const(1))
    return c


def _derive(eq: Equation, nograd: tuple[str, ...], complex_mode: bool,
            real_inputs: tuple[str, ...] = (), scalars: tuple[str, ...] = ()) -> Derivation:
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
    cot = _fresh("d" + eq.output, taken)
    index_arrays = {g.array for g in eq.gathers()}
    read = [a.array for a in eq.accesses()]
    skipped = [(n, "used only as an index array") for n in index_arrays if n not in read]
    skipped += [(n, "excluded by nograd=") for n in dict.fromkeys(read) if n in nograd]
    if eq.output in read:
        skipped.append((eq.output, "the output itself (a Tape differentiates in-place updates)"))
    inputs = [n for n in dict.fromkeys(read) if n not in nograd and n != eq.output]
    scalars = tuple(n for n in scalars if n in eq.params and n not in nograd)
    names = tuple((n, _fresh("d" + n, taken)) for n in (*inputs, *scalars))
    base = Derivation(eq, cot, names, (), (), (), tuple(skipped), scalars=scalars)
    c = chain(eq, taken, complex_mode)
    if isinstance(c, str):
        return _replace(base, error=c)
    dout = Access(cot, eq.lhs.indices)
    partials = _partials(c.body, inputs, complex_mode, scalars)
    same = _output_is_body(eq, complex_mode)
    body = str(c.body)          # the text each node of a partial is compared with
    grads, params = [], list(c.params)
    sign_op = "-=" if eq.assign == "-=" else "+="
    for name in (*inputs, *scalars):
        out_eqs = []
        for acc, (d, dbar) in partials[name]:
            slots = acc.indices if isinstance(acc, Access) else ()
            lhs = Access(dict(names)[name], _lhs_slots(slots))
            if complex_mode:
                terms = []
                if d is not None:
                    terms.append(_times(dout, Call("conj", (_times(c.factor, d),))))
                if dbar is not None:
                    terms.append(_times(Call("conj", (dout,)), _times(c.factor, dbar)))
                if not terms:
                    continue
                value = terms[0] if len(terms) == 1 else Binary("+", terms[0], terms[1])
                if name in real_inputs:     # the real part is the gradient of a real input
                    value = Call("real", (value,))
                if c.chosen is not None:
                    value = Call("where", (c.chosen, value, Const(0)))
                rhs = _times(value, *c.masks)
            else:
                if d is None:
                    continue
                if same is not None:
                    d = map_expr(d, lambda n: same if str(n) == body else n)
                partial = _times(c.factor, d)
                if c.chosen is not None:
                    partial = Call("where", (c.chosen, partial, Const(0)))
                rhs = _times(dout, partial, *c.masks)
            out_eqs.append(finish(eq, c, Equation(lhs, sign_op, rhs), taken, params))
        grads.append((name, tuple(out_eqs)))
    return _replace(base, helpers=tuple(c.helpers), grads=tuple(grads), params=tuple(params))


def _output_is_body(eq: Equation, complex_mode: bool):
    """The read `out[L]` when each element of the output is the body at exactly one tuple
    (`:=`, every index bare and distinct on the left, no reduction or finaliser): a partial
    that contains the whole body reads the output instead of computing it again (`e[i,j] :=
    exp(x[i,j] - m[i])` gives `dx[i,j] += de[i,j] * e[i,j]`, as torch's exp saves its
    result).  Top-level masks restrict the gradients' iteration to tuples where out equals the
    body.  None when the rule does not apply."""
    lhs = eq.lhs.indices
    if (complex_mode or eq.assign != ":=" or eq.reduction_indices or eq.finaliser
            or not all(isinstance(s, Affine) and s.is_bare for s in lhs)
            or len({s.names[0] for s in lhs}) != len(lhs)):
        return None
    return Access(eq.output, lhs)


def finish(fwd: Equation, c: _Chain, g: Equation, taken: set, params: list) -> Equation:
    """A derivative statement made complete: forward indices it lost are summed (`_count_lost`),
    except under (max)/(min) when it reads no reduction index (the derivative of a shift `+ t`):
    the sum over the reduction of `where(chosen, v, 0)` is v once, where a tuple was found."""
    once = ()
    if c.chosen is not None and not set(fwd.reduction_indices) & _bracketed(g):
        g = replace(g, rhs=map_expr(g.rhs, lambda n: c.found if n == c.chosen else n))
        once = fwd.reduction_indices
    return _count_lost(fwd, g, taken, params, once)


def _bracketed(eq: Equation) -> set:
    return {n for acc in [eq.lhs, *eq.accesses()] for s in acc.indices for n in slot_names(s)}


def _count_lost(fwd: Equation, g: Equation, taken: set, params: list, once=()) -> Equation:
    """A forward index that the gradient term no longer mentions anywhere was still summed
    over: `y[i] := x[i] + w[j]` is J*x[i] + sum(w), so dx[i] += dy[i] * len_j.  Each such index
    multiplies the term by the length of its forward range (a parameter filled in per call)."""
    lost = [n for n in fwd.indices if n not in g.indices and n not in once]
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


def exact_product(eq: Equation) -> tuple[Equation, Equation] | None:
    """The gradient of `(*) out[L] := RHS` (`:=`, bare L, no finaliser) in a form whose own
    derivative is exact at zeros too: (P, Y) with

        (*) P[L, R] := where(R' == R, 1, RHS')      the product of the OTHER factors at each
                                                     reduction tuple R (RHS' reads the tuple R')
        Y[L] := P[L, R] * RHS                        whose gradient with P held fixed is
                                                     dx[S] += dout[L] * P[L,R] * dRHS/dx[S]

    With P a differentiable input (computed from the same arrays) the gradients are products
    and sums of differentiable statements: the zero-count helpers of `chain` are exact in value
    but piecewise, so their derivative loses the product of the others at a zero factor.  P
    costs one product over R per tuple (L, R): meant for second derivatives, not for vjp.
    Top-level masks restrict both reductions.  None when the form does not apply."""
    red = eq.reduction_indices
    if (eq.reducer != "*" or eq.assign != ":=" or eq.finaliser or not red
            or not all(isinstance(s, Affine) and s.is_bare for s in eq.lhs.indices)):
        return None
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
    new = {r: _fresh(r + "_", taken) for r in red}
    masks, body = _top_masks(eq.rhs)
    inner, other = Const(1), _rename_indices(body, new)
    for r in reversed(red):
        inner = Call("where", (Compare(("==",), (IndexValue(new[r]), IndexValue(r))), inner,
                               other))
    p, y = _fresh(eq.output + "_others", taken), _fresh(eq.output + "_sum", taken)
    lhs = tuple(eq.lhs.indices) + tuple(Affine(((r, 1),)) for r in red)
    prod = Equation(Access(p, lhs), ":=",
                    _times(inner, *[_rename_indices(m, new) for m in masks]), "*")
    total = Equation(Access(y, eq.lhs.indices), ":=", _times(Access(p, lhs), eq.rhs))
    return prod, total


def _rename_indices(e, new: dict):
    """The expression with the indices in `new` renamed (in brackets and as values)."""
    def affine(a):
        for old, name in new.items():
            a = a.substitute(old, Affine(((name, 1),)))
        return a

    def slot(s):
        if isinstance(s, Wrapped):
            return Wrapped(s.kind, slot(s.inner), s.lo, s.hi)
        if isinstance(s, Gather):
            return Gather(s.array, tuple(affine(a) for a in s.indices), affine(s.offset))
        return affine(s)

    def node(n):
        if isinstance(n, Access):
            return Access(n.array, tuple(slot(s) for s in n.indices))
        if isinstance(n, IndexValue) and n.name in new:
            return IndexValue(new[n.name])
        return n
    return map_expr(e, node)


def _replace(d: Derivation, **kw) -> Derivation:
    from dataclasses import replace
    return replace(d, **kw)


def is_shifted_lhs(eq: Equation) -> bool:
    """True when a left-hand position is not a bare index or a constant."""
    return any(not isinstance(s, Affine) or (s.terms and not s.is_bare) for s in eq.lhs.indices)


def uses_array(eq: Equation, name: str) -> bool:
    return any(isinstance(n, Access) and n.array == name for n in walk(eq.rhs)) or any(
        g.array == name for g in eq.gathers())


