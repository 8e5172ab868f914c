"""Forward mode: Equation -> statements computing the output's tangent from the inputs' tangents.

For `out[L] := (red) RHS`, the tangent is the sum over every read `x[S]` of a differentiable
input (and every 0-d parameter `s` that gets a gradient) of partial * tangent:

    dout[L] += factor * dRHS/dx[S] * dx[S]          one statement per read, summed over the
                                                     reduction indices like the forward

Names: the tangent of input `x` is `dx`, of the output `dout` (the same names as the gradients;
a clash gets a trailing `_`).  `dout` starts at zero; helper statements (`:=`) run first.  The
shared rules come from grad.chain: `factor` is the finaliser's f'(acc) (chain rule), for `(*)`
and `*=` the product of the other factors (exact with zeros; `*=` also the old value), and for
`(max)`/`(min)` the tangent is that of the selected (first extremal) tuple.  Complex data:
dout += dRHS/dx * dx + dRHS/dconj(x) * conj(dx).  In-place forms hold the output's old value
constant (as vjp does), so jvp and vjp are each other's transpose.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import memo
from .grad import chain, derive, finish
from .grad_sympy import partials, times
from .ir import Access, Binary, Call, Const, Equation, Param


@dataclass(frozen=True)
class Tangents:
    """Frozen result of `derive_tangents`: `output` names the output's tangent, `names` maps
    each input to its tangent's name; `helpers` run first, then `terms` (input -> statements
    accumulating into `output`).  `params` as in grad.Derivation."""
    forward: Equation
    output: str
    names: tuple[tuple[str, str], ...]
    helpers: tuple[Equation, ...]
    terms: tuple[tuple[str, tuple[Equation, ...]], ...]
    params: tuple[tuple[str, tuple], ...]
    scalars: tuple[str, ...] = ()
    error: str | None = None


_CACHE = memo.Memo("tangent.derivations", 512)


def derive_tangents(eq: Equation, nograd: tuple[str, ...] = (), complex_mode: bool = False,
                    scalars: tuple[str, ...] = ()) -> Tangents:
    key = (eq, tuple(nograd), complex_mode, tuple(scalars))
    t = _CACHE.get(key)
    if t is None:
        t = _CACHE[key] = _derive(eq, tuple(nograd), complex_mode, tuple(scalars))
    return t


def _derive(eq: Equation, nograd, complex_mode: bool, scalars) -> Tangents:
    d = derive(eq, nograd, complex_mode, scalars=scalars)   # inputs, names (as gradients)
    base = Tangents(eq, d.cotangent, d.gradient_names, (), (), (), d.scalars, d.error)
    if d.error:
        return base
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output, d.cotangent}
    taken |= {n for _, n in d.gradient_names}
    c = chain(eq, taken, complex_mode)
    if isinstance(c, str):
        return Tangents(eq, d.cotangent, d.gradient_names, (), (), (), d.scalars, c)
    names = dict(d.gradient_names)
    inputs = [n for n, _ in d.gradient_names if n not in d.scalars]
    parts = partials(c.body, inputs, complex_mode, d.scalars)
    lhs = Access(d.cotangent, eq.lhs.indices)
    op = "-=" if eq.assign == "-=" else "+="
    params, terms = list(c.params), []
    for name, _ in d.gradient_names:
        out = []
        for read, (dx, dbar) in parts[name]:
            tan = (Access(names[name], read.indices) if isinstance(read, Access)
                   else Param(names[name]))
            pieces = []
            if dx is not None:
                pieces.append(times(tan, dx))
            if dbar is not None and complex_mode:
                pieces.append(times(Call("conj", (tan,)), dbar))
            if not pieces:
                continue
            value = times(c.factor, pieces[0] if len(pieces) == 1 else Binary("+", *pieces))
            if c.chosen is not None:
                value = Call("where", (c.chosen, value, Const(0)))
            out.append(finish(eq, c, Equation(lhs, op, times(value, *c.masks)), taken, params))
        terms.append((name, tuple(out)))
    return Tangents(eq, d.cotangent, d.gradient_names, tuple(c.helpers), tuple(terms),
                    tuple(params), d.scalars)
