"""Loop bounds clipped by guards: the one rule the CPU, python, CUDA and fused renderers share.

A guard `lo <= c*v + rest < hi` whose innermost index is v (every other index of it already
fixed by an outer loop) narrows v's loop instead of testing every v; a guard that is a plain
condition becomes an `if not (...): continue` check at the top of the loop body.  A guard's
expr has no constant term (schedule moves it into lo and hi).
"""
from __future__ import annotations

from ..ir import Affine
from ..schedule import Guard, Linear


def loop_bounds(v: str, outer: set[str], guards: list[Guard],
                base: tuple[str, str] | None = None) -> tuple[str, str, list[str]]:
    """(start, stop, checks) of index v's loop: from `base` (default its range arguments
    `_start_v`, `_stop_v`), clipped by the guards whose innermost index is v, and the checks
    that cannot be clipped."""
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


def loop_header(v: str, outer: set[str], guards: list[Guard], base: tuple[str, str] | None = None,
                parallel: bool = False) -> tuple[str, list[str]]:
    """The `for` line of index v's loop (a prange when `parallel`) with its clipped bounds,
    and the checks for its body."""
    start, stop, checks = loop_bounds(v, outer, guards, base)
    return f"for {v} in {'_prange' if parallel else 'range'}({start}, {stop}):", checks
