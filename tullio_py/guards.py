"""Guards: the index-only masks and padded reads of a statement that restrict its iteration,
as bounds (`Guard`, over `Linear` code) that code generation turns into clipped loop bounds.
Used by schedule.py (which re-exports these names) and the renderers."""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Access, Affine, Binary, Compare, Const, Equation, IndexValue, Param, Unary, Wrapped, walk
from .rewrite import is_scatter


@dataclass(frozen=True)
class Linear:
    """sum(coef * symbol) + const, symbols being code (indices, parameters, `x.shape[0]`):
    loop bounds are built from these so the generated code reads `p - _lo_s + 1`, not
    `(0 - (-p)) - (_lo_s) + 1`."""
    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(terms=(), const: int = 0) -> "Linear":
        merged: dict[str, int] = {}
        for name, coef in terms:
            merged[name] = merged.get(name, 0) + coef
        return Linear(tuple((n, c) for n, c in merged.items() if c), const)

    @staticmethod
    def of_affine(a: Affine) -> "Linear":
        return Linear.of(a.terms, a.const)

    def __add__(self, other) -> "Linear":
        if isinstance(other, int):
            return Linear(self.terms, self.const + other)
        return Linear.of(self.terms + other.terms, self.const + other.const)

    def __neg__(self) -> "Linear":
        return Linear(tuple((n, -c) for n, c in self.terms), -self.const)

    def __sub__(self, other) -> "Linear":
        return self + (-other)

    def __str__(self) -> str:
        out = ""
        for name, coef in sorted(self.terms, key=lambda t: t[1] < 0):
            mag = abs(coef)
            term = name if mag == 1 else f"{mag}*{name}"
            out += (f" - {term}" if coef < 0 else f" + {term}") if out else (
                f"-{term}" if coef < 0 else term)
        if self.const:
            out += (f" + {self.const}" if self.const > 0 else f" - {-self.const}") if out else str(self.const)
        return out or "0"


@dataclass(frozen=True)
class Guard:
    """lo <= expr < hi must hold for an iteration to run; lo/hi are code (None: unbounded).
    A guard is applied at the loop of its innermost index.  A guard that involves a reduction
    index restricts the terms of the reduction and must be applied at a reduction loop; only a
    guard on left-hand indices alone may skip writing an element (a mask selecting elements)."""
    expr: Affine
    lo: Linear | None
    hi: Linear | None
    cond: str | None = None       # a general condition (e.g. i != j) checked with `if`



def top_factors(e) -> list:
    """The factors of a product at the root of the right-hand side."""
    if isinstance(e, Binary) and e.op == "*":
        return top_factors(e.left) + top_factors(e.right)
    return [e]


def linear(e):
    """(Affine over indices, {param: coef}, const) for + - and constant * of indices, params and
    integer constants; None if e is not of that form."""
    if isinstance(e, IndexValue):
        return Affine(((e.name, 1),)), {}, 0
    if isinstance(e, Param):
        return Affine(), {e.name: 1}, 0
    if isinstance(e, Const) and isinstance(e.value, int):
        return Affine(), {}, e.value
    if isinstance(e, Unary) and e.op == "-":
        inner = linear(e.operand)
        return inner and _scale(inner, -1)
    if isinstance(e, Binary) and e.op in "+-":
        a, b = linear(e.left), linear(e.right)
        if a is None or b is None:
            return None
        return _add(a, _scale(b, 1 if e.op == "+" else -1))
    if isinstance(e, Binary) and e.op == "*":
        a, b = linear(e.left), linear(e.right)
        if a is None or b is None:
            return None
        for x, y in ((a, b), (b, a)):
            if not x[0].terms and not x[1]:
                return _scale(y, x[2])
    return None


def _scale(t, k):
    return t[0].scale(k), {p: c * k for p, c in t[1].items()}, t[2] * k


def _add(a, b):
    params = dict(a[1])
    for p, c in b[1].items():
        params[p] = params.get(p, 0) + c
    return a[0] + b[0], {p: c for p, c in params.items() if c}, a[2] + b[2]




def compare_guards(c: Compare) -> list[Guard] | None:
    """Guards equivalent to an index-only comparison, or None if it is not of that form."""
    out = []
    for op, a, b in zip(c.ops, c.operands, c.operands[1:]):
        la, lb = linear(a), linear(b)
        if la is None or lb is None or op == "!=":
            return None
        diff = _add(la, _scale(lb, -1))            # a - b = idx + params + const
        idx = Affine(diff[0].terms)
        if not idx.terms:
            return None
        neg = _scale(diff, -1)                     # idx  op  -(params + const)
        bound = Linear.of(tuple(neg[1].items()), neg[2])
        if op == "<":
            out.append(Guard(idx, None, bound))
        elif op == "<=":
            out.append(Guard(idx, None, bound + 1))
        elif op == ">":
            out.append(Guard(idx, bound + 1, None))
        elif op == ">=":
            out.append(Guard(idx, bound, None))
        else:
            out.append(Guard(idx, bound, bound + 1))
    return out


def index_only(e) -> bool:
    """An expression of indices, parameters and constants only (no array reads, no calls)."""
    return all(isinstance(n, (IndexValue, Param, Const, Binary, Unary)) for n in walk(e))


def mask_guards(f) -> list[Guard] | None:
    """The guards of a top-level factor that is a comparison of indices, else None."""
    if not isinstance(f, Compare) or not all(index_only(x) for x in f.operands):
        return None
    if not any(isinstance(n, IndexValue) for x in f.operands for n in walk(x)):
        return None
    g = compare_guards(f)
    if g is not None:
        return g
    names = []
    for x in f.operands:
        for n in walk(x):
            if isinstance(n, IndexValue) and n.name not in names:
                names.append(n.name)
    return [Guard(Affine(tuple((n, 1) for n in names)), None, None, str(f))]


def factor_reads(rhs) -> list[Access]:
    """The array reads (with indices) of the top-level factors of `rhs` that are not masks
    (masks are guards, not reads), in order; the same read may appear more than once."""
    return [a for f in top_factors(rhs) if mask_guards(f) is None
            for a in walk(f) if isinstance(a, Access) and a.indices]


def find_guards(eq: Equation, pad_value) -> tuple[list[Guard], set[str], list]:
    """Top-level mask factors become guards (they restrict the iteration).  Under a sum with
    pad value 0, a top-level pad read contributes nothing outside its array, so it becomes a
    guard too and the read needs no check."""
    guards, guarded, rest = [], set(), []
    for f in top_factors(eq.rhs):
        g = mask_guards(f)
        if g is not None:
            guards += g
            continue
        if (isinstance(f, Access) and eq.reducer == "+" and pad_value == 0 and not is_scatter(eq)
                and any(isinstance(s, Wrapped) and s.kind == "pad" for s in f.indices)
                and all(not isinstance(s, Wrapped) or (s.kind == "pad" and isinstance(s.inner, Affine))
                        for s in f.indices)):
            reduced = set(eq.reduction_indices)
            pads = [(d, s) for d, s in enumerate(f.indices) if isinstance(s, Wrapped)]
            # A guard on left-hand indices only would skip writing elements that `:=`/`=` must
            # write (as the pad value): those reads keep their per-element check.  Under `+=`
            # and `-=` a skipped element is unchanged, which is what adding 0 gives.
            if eq.assign in ("+=", "-=") or all(reduced & set(s.names) for _, s in pads):
                for d, s in pads:
                    c = s.inner.const
                    guards.append(Guard(Affine(s.inner.terms), Linear((), -c),
                                        Linear(((f"{f.array}.shape[{d}]", 1),), -c)))
                guarded.add(str(f))
        rest.append(f)
    return guards, guarded, rest
