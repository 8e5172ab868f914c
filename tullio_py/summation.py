"""The SummationWarning rule: a term of a `+` reduction that misses a reduction index.

In `y[i] := x[i,j] + b[i]` the reduction over j sums the whole right-hand side, so b[i] is
added once per j (n times): the term b[i] does not use j.  `message(eq)` returns the warning's
text for the first such term (None when every additive term uses every reduction index, or
the reduction is not a sum); Kernel() warns with it once per statement.
"""
from __future__ import annotations

from .ir import Access, Binary, Equation, IndexValue, Unary, walk


def summation_terms(e):
    """Top-level additive terms of an expression."""
    if isinstance(e, Binary) and e.op in "+-":
        return summation_terms(e.left) + summation_terms(e.right)
    if isinstance(e, Unary):
        return summation_terms(e.operand)
    return [e]


def term_indices(e) -> set[str]:
    out = set()
    for n in walk(e):
        if isinstance(n, Access):
            for s in n.indices:
                out |= set(s.names)       # a gather's names are its index array's indices
        elif isinstance(n, IndexValue):
            out.add(n.name)
    return out


def message(eq: Equation) -> str | None:
    """The SummationWarning text when an additive term misses a reduction index."""
    red = eq.reduction_indices
    if not red or eq.reducer != "+":
        return None
    for t in summation_terms(eq.rhs):
        missing = [n for n in red if n not in term_indices(t)]
        if missing:
            return (f"the term {t} does not use the reduction index {', '.join(missing)}, so it "
                    f"is summed over {', '.join(missing)} as well (the whole right-hand side is "
                    f"reduced): {eq.text or eq}.  Split the statement if that is not intended.")
    return None
