"""Text of several statements -> `ChainSpec`: the statements of a chain and the rules they obey.

A chain is several statements in one text, one per line or separated by `;` (a newline inside
brackets continues the statement).  Every statement defines a new array with `:=`; the arrays
no statement defines are the chain's inputs; the last statement's array is its result and the
others are temporaries.  The rules, each a `TullioError` with a caret under the statement:

- every statement is `:=` (no in-place update: a chain is a function of its inputs);
- an array is defined once, before any statement reads it: a name that a statement defines
  cannot be read by an earlier statement (which would make it an input, then redefine it);
- every temporary is read by a later statement (else the chain would compute it for nothing);
- a temporary with indices is read with brackets (a 0-d one, `s := x[i]`, is read as `s`,
  like a scalar parameter); an input is read either as an array or as a scalar, not both.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ArgumentError, ParseError, TullioError
from .ir import Equation, Param, walk
from .parse import parse

_OPEN, _CLOSE = "([{", ")]}"


@dataclass(frozen=True)
class Part:
    """One statement of a chain: its text, where it starts in the chain's text, its Equation
    and the names `ranges=` gives it (those of its indices)."""
    text: str
    start: int
    equation: Equation
    given: tuple[str, ...] = ()

    @property
    def reads(self) -> tuple[str, ...]:
        """Arrays and scalar parameters the statement reads, in order."""
        return tuple(dict.fromkeys((*self.equation.arrays, *self.equation.params)))


@dataclass(frozen=True)
class ChainSpec:
    text: str
    parts: tuple[Part, ...]
    inputs: tuple[str, ...]         # names no statement defines, in order of first read
    scalars: tuple[str, ...]        # the inputs read as scalar parameters
    defined: tuple[str, ...]        # each statement's output, in order

    @property
    def result(self) -> str:
        return self.defined[-1]

    @property
    def temporaries(self) -> tuple[str, ...]:
        return self.defined[:-1]


def split(text: str) -> list[tuple[int, str]]:
    """(offset, text) of each statement: pieces between ';' and newlines outside brackets,
    stripped, empty ones dropped; a newline inside brackets becomes a space."""
    out, depth, start = [], 0, 0
    for k, ch in enumerate(text + ";"):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif ch in ";\n" and (depth == 0 or k == len(text)):
            piece = text[start:k].replace("\r", " ").replace("\n", " ")
            if piece.strip():
                lead = len(piece) - len(piece.lstrip())
                out.append((start + lead, piece.strip()))
            start = k + 1
    return out


def is_chain(text) -> bool:
    """Whether `text` holds several statements (a single one, with a stray ';' or not, is
    parsed as one statement, which reports it)."""
    return isinstance(text, str) and (";" in text or "\n" in text.strip()) and len(split(text)) > 1


def _in_part(e: TullioError, k: int) -> TullioError:
    """`e`, raised for statement k (0-based), saying which statement of the chain it is."""
    out = type(e)(f"statement {k + 1} of the chain: {e.rule}", e.text, e.span, e.hint)
    out.__cause__ = e.__cause__
    return out


def _fail(parts, k: int, rule: str, span=None, hint=None, kind=ParseError):
    raise kind(f"statement {k + 1} of the chain: {rule}", parts[k].text, span, hint)


def _op_span(p: Part) -> tuple[int, int]:
    lhs = p.equation.lhs.span
    at = p.text.find(p.equation.assign, lhs[1] if lhs else 0)
    return (at, at + len(p.equation.assign)) if at >= 0 else None


def parse_chain(text: str, given: dict | None = None) -> ChainSpec:
    """Parse and check a chain (module docstring); `given`: the ranges= option, whose names
    go to the statements that use them."""
    given = given or {}
    parts = []
    for k, (start, piece) in enumerate(split(text)):
        try:
            eq = parse(piece)
            mine = tuple(n for n in given if n in eq.indices or n in eq.params)
            if mine:
                eq = parse(piece, mine)
        except TullioError as e:
            raise _in_part(e, k) from None
        parts.append(Part(piece, start, eq, mine))
    used = {n for p in parts for n in p.given}
    unused = [n for n in given if n not in used]
    if unused:
        raise ArgumentError(f"option ranges names {unused[0]!r}, which is not an index of any "
                            "statement of the chain", text, None)
    defined: dict[str, int] = {}
    first_read: dict[str, int] = {}
    as_scalar: dict[str, int] = {}
    as_array: dict[str, int] = {}
    for k, p in enumerate(parts):
        eq = p.equation
        if eq.assign != ":=":
            _fail(parts, k, f"'{eq.assign}' updates an array in place; every statement of a chain "
                  "defines a new array with ':='", _op_span(p),
                  "write the result to a new name with ':='")
        out = eq.output
        if out in defined:
            _fail(parts, k, f"{out} is defined by statement {defined[out] + 1} already; each array "
                  "of a chain is defined once", eq.lhs.span, "give the new array another name")
        if out in first_read:
            j = first_read[out]
            _fail(parts, k, f"this statement defines {out}, which statement {j + 1} reads before: "
                  "a chain reads an array only below the statement that defines it, and never "
                  "redefines an input", eq.lhs.span,
                  f"define {out} above statement {j + 1}, or give this array another name")
        for n in p.reads:
            if n in eq.params:
                span = next((x.span for x in walk(eq.rhs) if isinstance(x, Param) and x.name == n),
                            None)
                if n in defined and parts[defined[n]].equation.lhs.indices:
                    _fail(parts, k, f"{n} is read as a scalar, but statement {defined[n] + 1} "
                          "defines it as an array with indices", span,
                          f"read it with its indices, {n}[...]")
                if n in as_array:
                    _fail(parts, k, f"{n} is read as a scalar here and as an array by statement "
                          f"{as_array[n] + 1}", span, "use another name for one of them")
                as_scalar.setdefault(n, k)
            else:
                acc = next((a for a in eq.accesses() if a.array == n), None)
                if n in as_scalar and n not in defined:
                    _fail(parts, k, f"{n} is read as an array here and as a scalar by statement "
                          f"{as_scalar[n] + 1}", acc.span if acc else None,
                          "use another name for one of them")
                if n in defined and not parts[defined[n]].equation.lhs.indices and \
                        acc is not None and acc.indices:
                    _fail(parts, k, f"{n} is a 0-d array (statement {defined[n] + 1}): read it "
                          f"as {n}, without brackets", acc.span)
                as_array.setdefault(n, k)
            first_read.setdefault(n, k)
        defined[out] = k
    outs = [p.equation.output for p in parts]
    for k, p in enumerate(parts[:-1]):
        if not any(p.equation.output in q.reads for q in parts[k + 1:]):
            _fail(parts, k, f"{p.equation.output} is not read by any later statement: a chain's "
                  "result is its last statement's array, the others are temporaries",
                  p.equation.lhs.span, "remove the statement, or read its array below")
    inputs = tuple(n for n in first_read if n not in defined)
    scalars = tuple(n for n in inputs if n in as_scalar)
    return ChainSpec(text, tuple(parts), inputs, scalars, tuple(outs))


def check_nograd(spec: ChainSpec, names) -> None:
    """nograd= of a chain: inputs that get no gradient, or temporaries whose value the gradient
    treats as a constant (nothing flows back through the statement that defines them)."""
    for n in names:
        if n == spec.result:
            raise ArgumentError(f"option nograd names {n!r}, the chain's result", spec.text,
                                None, "nograd names inputs, or temporaries held constant")
        if n not in spec.inputs and n not in spec.defined:
            raise ArgumentError(f"option nograd names {n!r}, which is neither an input nor a "
                                "temporary of the chain", spec.text, None,
                                f"inputs are {', '.join(spec.inputs) or '(none)'}; temporaries "
                                f"{', '.join(spec.temporaries) or '(none)'}")
