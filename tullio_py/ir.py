"""The vocabulary of tullio_py: frozen dataclasses passed between pipeline stages.

An `Equation` is one statement `lhs op [reduction] rhs [|> finaliser]`.  Inside brackets
each position ("slot") is an `Affine` combination of loop indices, a `Gather` (`A[J[k]]`),
or a `Wrapped` boundary form (`pad`, `clamp`, `mod`).  Outside brackets the right-hand side
is a tree of `Access`, `Const`, `Param`, `IndexValue`, `Unary`, `Binary`, `Compare`, `Call`.

`str()` of every node prints valid tullio_py notation; `parse(str(eq)) == eq`.
Source spans (for carets in errors) are carried with `compare=False`, so they never affect
equality or hashing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Union

Span = tuple[int, int] | None

ASSIGN_OPS = (":=", "=", "+=", "-=", "*=")
REDUCTIONS = ("+", "*", "max", "min")
ELEMENTWISE_FUNCS = ("exp", "log", "log1p", "expm1", "sqrt", "abs", "sin", "cos", "tan", "tanh",
                     "sinh", "cosh", "arctan", "sigmoid", "relu", "conj", "real", "imag")
BINARY_FUNCS = ("max", "min")
FUNCTIONS = ELEMENTWISE_FUNCS + BINARY_FUNCS + ("where",)
FINALISERS = ELEMENTWISE_FUNCS
BOUNDARY_WRAPPERS = ("pad", "clamp", "mod")
# Functions whose result is floating point even for integer arguments.
FLOAT_FUNCS = ("exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tan", "tanh", "sinh",
               "cosh", "arctan", "sigmoid")


# ----------------------------------------------------------------------------- index slots
@dataclass(frozen=True)
class Affine:
    """sum(coef * index) + const, terms in order of first appearance, no zero coefficients.

    `shifted` marks a plain index written as arithmetic (`i+0`, `0+i`, `i-0`): Tullio's way
    to ask for the intersection of extents.  It is not bare, and prints as `i+0`."""
    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0
    span: Span = field(default=None, compare=False)
    shifted: bool = False

    @staticmethod
    def of(terms, const: int = 0, span: Span = None) -> "Affine":
        merged: dict[str, int] = {}
        for name, coef in terms:
            merged[name] = merged.get(name, 0) + coef
        return Affine(tuple((n, c) for n, c in merged.items() if c != 0), const, span)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    @property
    def is_bare(self) -> bool:
        return (len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0
                and not self.shifted)

    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def __add__(self, other: "Affine") -> "Affine":
        return Affine.of(self.terms + other.terms, self.const + other.const, self.span)

    def scale(self, k: int) -> "Affine":
        return Affine.of(tuple((n, c * k) for n, c in self.terms), self.const * k, self.span)

    def substitute(self, name: str, value: "Affine") -> "Affine":
        """Replace index `name` by the affine expression `value`."""
        c = self.coef(name)
        if c == 0:
            return self
        rest = Affine.of(tuple(t for t in self.terms if t[0] != name), self.const, self.span)
        return rest + value.scale(c)

    def renamed(self, new: dict) -> "Affine":
        """The indices in `new` renamed all at once (`{i: j, j: i}` swaps them)."""
        merged = Affine.of(tuple((new.get(n, n), c) for n, c in self.terms)).terms
        return Affine(merged, self.const, self.span, self.shifted)

    def __str__(self) -> str:
        out = ""
        for name, coef in self.terms:
            sign = "-" if coef < 0 else ("+" if out else "")
            mag = abs(coef)
            out += f"{sign}{'' if mag == 1 else f'{mag}*'}{name}"
        if self.const or not out or self.shifted:
            out += f"{self.const:+d}" if out else str(self.const)
        return out


@dataclass(frozen=True)
class Gather:
    """J[k, ...] (+ offset) used as an index: the value of an integer array."""
    array: str
    indices: tuple[Affine, ...]
    offset: Affine = Affine()
    span: Span = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        seen = []
        for a in self.indices + (self.offset,):
            seen += [n for n in a.names if n not in seen]
        return tuple(seen)

    def __str__(self) -> str:
        base = f"{self.array}[{', '.join(map(str, self.indices))}]"
        if not self.offset.terms and not self.offset.const:
            return base
        off = str(self.offset)
        return base + (off if off.startswith("-") else "+" + off)


@dataclass(frozen=True)
class Wrapped:
    """pad(e, lo, hi) / clamp(e) / mod(e).  For pad, lo=hi=None means unbounded: no range constraint."""
    kind: str
    inner: Union[Affine, Gather]
    lo: int | None = None
    hi: int | None = None
    span: Span = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return self.inner.names

    def __str__(self) -> str:
        if self.kind == "pad" and self.lo is not None:
            return f"pad({self.inner}, {self.lo}, {self.hi})"
        return f"{self.kind}({self.inner})"


Slot = Union[Affine, Gather, Wrapped]


# ----------------------------------------------------------------------------- values
# Printing precedence: higher binds tighter.
_PREC = {"cmp": 1, "+": 2, "-": 2, "*": 3, "/": 3, "neg": 4, "**": 5, "atom": 6}


@dataclass(frozen=True)
class Access:
    array: str
    indices: tuple[Slot, ...]
    span: Span = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.array}[{', '.join(map(str, self.indices))}]" if self.indices else self.array


@dataclass(frozen=True, eq=False)
class Const:
    """A number.  Equal only to a Const of the same type: `2` and `2.0` give results of
    different dtypes, so statements (and caches keyed by them) must tell them apart."""
    value: Union[int, float, complex]

    def __eq__(self, other):
        return (type(other) is Const and type(other.value) is type(self.value)
                and other.value == self.value)

    def __hash__(self):
        return hash((type(self.value), self.value))

    def __str__(self) -> str:
        v = self.value
        if isinstance(v, complex):
            return f"{v.imag!r}j" if v.real == 0 else f"({v.real!r}+{v.imag!r}j)"
        return repr(v)


@dataclass(frozen=True)
class Param:
    """A scalar runtime parameter: a name used bare on the right that is not an index."""
    name: str
    span: Span = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class IndexValue:
    """A loop index used as a value (`A[i,j] := i + 10*j`)."""
    name: str
    span: Span = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "+"
    operand: "Expr"

    def __str__(self) -> str:
        return f"{self.op}{_wrap(self.operand, _PREC['neg'] + 1)}"


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / **
    left: "Expr"
    right: "Expr"

    def __str__(self) -> str:
        p = _PREC[self.op]
        if self.op == "**":   # right-associative
            return f"{_wrap(self.left, p + 1)}**{_wrap(self.right, p)}"
        right_min = p + 1 if self.op in ("-", "/", "+", "*") else p
        return f"{_wrap(self.left, p)} {self.op} {_wrap(self.right, right_min)}"


@dataclass(frozen=True)
class Compare:
    ops: tuple[str, ...]          # "<", "<=", ">", ">=", "==", "!="
    operands: tuple["Expr", ...]  # len(ops) + 1

    def __str__(self) -> str:
        out = _wrap(self.operands[0], _PREC["cmp"] + 1)
        for op, x in zip(self.ops, self.operands[1:]):
            out += f" {op} {_wrap(x, _PREC['cmp'] + 1)}"
        return out


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple["Expr", ...]
    span: Span = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.func}({', '.join(map(str, self.args))})"


Expr = Union[Access, Const, Param, IndexValue, Unary, Binary, Compare, Call]


def _prec(e) -> int:
    if isinstance(e, Binary):
        return _PREC[e.op]
    if isinstance(e, Compare):
        return _PREC["cmp"]
    if isinstance(e, Unary):
        return _PREC["neg"]
    if isinstance(e, Const) and (isinstance(e.value, complex) or e.value < 0):
        return _PREC["neg"]
    return _PREC["atom"]


def _wrap(e, min_prec: int) -> str:
    s = str(e)
    return f"({s})" if _prec(e) < min_prec else s


def children(e) -> tuple:
    """The direct sub-expressions of node e (none for a leaf: an Access, a Param, a Const)."""
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Compare):
        return e.operands
    if isinstance(e, Call):
        return e.args
    return ()


def value_children(e) -> tuple:
    """The sub-expressions of e whose values can become e's value: all of them, but a
    `where`'s two branches only (its condition only chooses between them)."""
    if isinstance(e, Call) and e.func == "where":
        return e.args[1:]
    return children(e)


def walk(e, kids=children):
    """Every node of an expression tree, parents before children; `kids(node)`: the children
    to descend into (`value_children`: not into the conditions of `where`)."""
    yield e
    for x in kids(e):
        yield from walk(x, kids)


def map_expr(e, f):
    """Apply f to every node, parents first (f returns the node or its replacement), rebuilding
    the tree around the results."""
    e = f(e)
    if isinstance(e, Unary):
        return Unary(e.op, map_expr(e.operand, f))
    if isinstance(e, Binary):
        return Binary(e.op, map_expr(e.left, f), map_expr(e.right, f))
    if isinstance(e, Compare):
        return Compare(e.ops, tuple(map_expr(x, f) for x in e.operands))
    if isinstance(e, Call):
        return Call(e.func, tuple(map_expr(x, f) for x in e.args), e.span)
    return e


def rename_reads(e, old: str, new: str):
    """The expression with every read of array `old` reading array `new` instead."""
    return map_expr(e, lambda n: Access(new, n.indices, n.span)
                    if isinstance(n, Access) and n.array == old else n)


def as_parsed(eq: "Equation", indices=()) -> "Equation":
    """`eq` in the form `parse(str(eq), indices)` gives it, without printing: a read with no
    brackets on the right (`ds`, a 0-d array another stage derived) is a parameter, and the
    parameters in `indices` (names given ranges by `ranges=`) are loop indices."""
    indices = [n for n in indices if n in eq.params]
    if not indices and not any(isinstance(n, Access) and not n.indices for n in walk(eq.rhs)):
        return eq

    def node(n):
        if isinstance(n, Access) and not n.indices:
            n = Param(n.array, n.span)
        if isinstance(n, Param) and n.name in indices:
            return IndexValue(n.name, n.span)
        return n
    return Equation(eq.lhs, eq.assign, map_expr(eq.rhs, node), eq.reduction, eq.finaliser,
                    eq.text)


def slot_names(slot: Slot) -> tuple[str, ...]:
    return slot.names


def slot_gathers(slot: Slot) -> tuple[Gather, ...]:
    inner = slot.inner if isinstance(slot, Wrapped) else slot
    return (inner,) if isinstance(inner, Gather) else ()


# ----------------------------------------------------------------------------- equation
@dataclass(frozen=True)
class Equation:
    lhs: Access
    assign: str                 # one of ASSIGN_OPS
    rhs: Expr
    reduction: str | None = None  # None: implicit "+" (no prefix written)
    finaliser: str | None = None
    text: str = field(default="", compare=False)

    @property
    def reducer(self) -> str:
        if self.reduction is not None:
            return self.reduction
        return "*" if self.assign == "*=" else "+"

    @property
    def output(self) -> str:
        return self.lhs.array

    def accesses(self) -> list[Access]:
        """Every array read on the right, in order (gathers' index arrays not included)."""
        return list(self._accesses)

    def gathers(self) -> list[Gather]:
        return list(self._gathers)

    @cached_property   # every call asks for these: walked once per equation
    def _accesses(self) -> tuple[Access, ...]:
        return tuple(n for n in walk(self.rhs) if isinstance(n, Access))

    @cached_property
    def _gathers(self) -> tuple[Gather, ...]:
        out = []
        for acc in (self.lhs, *self._accesses):
            for s in acc.indices:
                out += slot_gathers(s)
        return tuple(out)

    @cached_property   # the equation is frozen: computed once
    def lhs_indices(self) -> tuple[str, ...]:
        seen: list[str] = []
        for s in self.lhs.indices:
            seen += [n for n in slot_names(s) if n not in seen]
        return tuple(seen)

    @cached_property
    def indices(self) -> tuple[str, ...]:
        """Every loop index: left-hand first, then right-hand in order of appearance."""
        seen = list(self.lhs_indices)
        for acc in self.accesses():
            for s in acc.indices:
                seen += [n for n in slot_names(s) if n not in seen]
        for n in walk(self.rhs):
            if isinstance(n, IndexValue) and n.name not in seen:
                seen.append(n.name)
        return tuple(seen)

    @cached_property
    def value_indices(self) -> tuple[str, ...]:
        """Loop indices no bracket uses, read only as values (`A[i] := i**2`): parsing the
        printed statement makes them indices only when told (parse's `extra_indices`)."""
        bracketed = set(self.lhs_indices)
        for acc in self.accesses():
            for s in acc.indices:
                bracketed.update(slot_names(s))
        return tuple(n for n in self.indices if n not in bracketed)

    @cached_property
    def reduction_indices(self) -> tuple[str, ...]:
        left = set(self.lhs_indices)
        return tuple(n for n in self.indices if n not in left)

    @cached_property
    def arrays(self) -> tuple[str, ...]:
        """Names of arrays read (including gathers' index arrays), in order, without the output
        unless the right-hand side reads it."""
        seen: list[str] = []
        for acc in self.accesses():
            if acc.array not in seen:
                seen.append(acc.array)
        for g in self.gathers():
            if g.array not in seen:
                seen.append(g.array)
        return tuple(seen)

    @cached_property
    def params(self) -> tuple[str, ...]:
        seen: list[str] = []
        for n in walk(self.rhs):
            if isinstance(n, Param) and n.name not in seen:
                seen.append(n.name)
        return tuple(seen)

    def __str__(self) -> str:
        prefix = f"({self.reduction}) " if self.reduction is not None else ""
        fin = f" |> {self.finaliser}" if self.finaliser else ""
        return f"{prefix}{self.lhs} {self.assign} {self.rhs}{fin}"
