"""Opening the loops of a plan, one at a time, into an Emitter: the loop machinery the CPU /
python renderer and the fused renderer share."""
from __future__ import annotations

from ..ir import Affine, Call, walk
from ..schedule import CHUNKS, Plan
from .bounds import loop_bounds, loop_header
from .emit import Emitter
from .expr import Expr


def nonneg_indices(plan: Plan, equations) -> set[str]:
    """Loop indices used bare in some array position of `equations`: they start at >= 0 (range
    inference), and saying so lets the compiler drop negative-index wraparound."""
    bare = {s.names[0] for eq in equations for a in [eq.lhs] + eq.accesses() for s in a.indices
            if isinstance(s, Affine) and s.is_bare}
    return {l.index for l in plan.loops if l.index in bare}


def nonunit_indices(equations) -> set[str]:
    """Indices some array position of `equations` multiplies by a coefficient other than +-1
    (`x[b, c, 2*h+i, 2*v+j]`: h and v): their innermost loop keeps a plain range header.  None
    where a right side chooses with `where`: the 2x2 max-pool's argmax helper `(min) y_arg :=
    where(x[..., 2*v+j] == y[...], i * 2 + j, where(...))` ran 3.6 ms counted from 0 and 7.9
    ms with the plain header (16x32x64x64 float64, one thread), its gradient's scatter 4.4
    against 6.3 ms."""
    if any(isinstance(n, Call) and n.func == "where" for eq in equations for n in walk(eq.rhs)):
        return set()
    slots = [getattr(s, "inner", s) for eq in equations for a in [eq.lhs] + eq.accesses()
             for s in a.indices]            # (inside pad(...), clamp(...), mod(...) too)
    return {n for s in slots if isinstance(s, Affine) for n in s.names if abs(s.coef(n)) != 1}


class Nest:
    """The loops of `plan` opened into `out`; `x` renders the hoisted reads (the plan's
    `hoists`), which are loaded just inside their loop (level -1: before every loop)."""

    def __init__(self, plan: Plan, out: Emitter, x: Expr, nonneg: set[str],
                 nonunit: set[str] = frozenset()):
        self.plan, self.out, self.x, self.nonneg, self.nonunit = plan, out, x, nonneg, nonunit
        self.opened: list[str] = []

    def emit_hoists(self, level: int):
        for name, lev, acc in self.x.hoists.values():
            if lev == level:
                self.out.add(f"{name} = {self.x.plain_access(acc)}")

    def inner_bounds(self, v: str, base=None, opened=()) -> tuple[str, str, list]:
        """loop_bounds of the innermost loop `v` inside the open loops (and `opened`), its start
        written `max(start, 0)` when v is known to be >= 0 (nonneg_indices): the compiler then
        drops negative-index wraparound and vectorises the loop."""
        start, stop, checks = loop_bounds(v, set(self.opened) | set(opened),
                                          list(self.plan.guards), base)
        return (f"max({start}, 0)" if v in self.nonneg else start), stop, checks

    def open(self, k: int, hoist: bool = True, chunks: bool = True):
        """Open loop number k of the plan (bounds clipped by its guards); `chunks=False` runs
        a chunked loop as a plain loop."""
        plan, out = self.plan, self.out
        loop = plan.loops[k]
        chunked = plan.chunked if chunks else None
        if plan.collapse and k == 0:
            a, b = plan.collapse
            out.add(f"_na = max(_stop_{a} - _start_{a}, 0)\n_nb = max(_stop_{b} - _start_{b}, 0)")
            out.add(f"for _ab in _prange(_na * _nb):")
            out.depth += 1
            self.wide()
            out.add(f"{a} = _start_{a} + _ab // _nb\n{b} = _start_{b} + _ab % _nb")
            self.opened += [a, b]
            if hoist:
                self.emit_hoists(0)
                self.emit_hoists(1)
            return
        base = ("_clo", "_chi") if chunked == loop.index else None
        if plan.block and plan.block[0] == loop.index:
            base = ("_jb", f"min(_jb + {plan.block[1]}, _stop_{loop.index})")
        if k == len(plan.loops) - 1 and (not loop.parallel or plan.chunked == loop.index) \
                and loop.index not in self.nonunit:
            # Innermost loop counted from 0 (inner_bounds), also a block of a chunked row
            # (`dg[j] += dy[i,j]`: 2.2 -> 0.55 ms at 4096x512, one thread): a plain
            # range(_clo, _chi) keeps the negative-index wraparound and stays scalar.  Not an
            # index read at a stride (nonunit_indices): counted from 0, the 2x2 max-pool's
            # row update `y[b,c,h,v] = max(y[b,c,h,v], x[b,c,2h+i,2v+j])` took 5.7-6.2 ms
            # at 16x32x64x64 float64 on one thread, 0.97 ms with the plain header.
            v = loop.index
            start, stop, checks = self.inner_bounds(v, base)
            out.add(f"_first = {start}\nfor _k in range({stop} - _first):\n    {v} = _first + _k")
        else:
            head, checks = loop_header(loop.index, set(self.opened), list(plan.guards), base,
                                       loop.parallel and plan.chunked != loop.index)
            out.add(head)
        out.depth += 1
        self.opened.append(loop.index)
        if k == 0 and not chunked:
            self.wide()
        for c in checks:
            out.add(c)
        if hoist:
            self.emit_hoists(k)

    def wide(self):
        """Inside the outermost loop (the body a parallel loop is compiled into): 512-bit
        vectors for a plan that asks for them (Plan.wide; the register-blocked renderer marks
        its own loops)."""
        if self.plan.wide and not self.plan.jam:
            self.out.add("_wide_vectors()")

    def open_range(self, ks, hoist: bool = True, chunks: bool = True):
        i = 0
        ks = list(ks)
        while i < len(ks):
            self.open(ks[i], hoist=hoist, chunks=chunks)
            i += 2 if (self.plan.collapse and ks[i] == 0) else 1

    def close_to(self, depth: int, count: int):
        self.out.depth = depth
        del self.opened[count:]

    def mark(self) -> tuple[int, int]:
        """(depth, loops open): where `close_to` returns to."""
        return self.out.depth, len(self.opened)

    def open_chunks(self, prepare: str = "", least: int = 1, per_thread: bool = False):
        """The outer prange over blocks of the chunked index (block bounds _clo, _chi): CHUNKS
        blocks, fewer when a block would have fewer than `least` values.  `per_thread`: one
        block per thread of the call (numba's count for it), for a split whose blocks do not
        change the results (no partials: each output element is summed whole in one block).
        Each block loops over every value of the indices outside the split, so with the
        contiguous index split, each block reads a slice of every row: the column sum
        dg[j] += dy[i,j] * (x[i,j] - mu[i]) / sqrt(var[i] + eps), 4096x512 float32, one
        thread, took 2.5 ms in 16 blocks of 32 values of j (16 passes over dy and x, 128
        bytes of each 2 KB row a pass) and 0.30 ms in one."""
        v, out = self.plan.chunked, self.out
        n_c = "_n_c" if least == 1 else f"_n_c // {least}"
        most = "_nthreads()" if per_thread else CHUNKS
        out.add(f"_n_c = max(_stop_{v} - _start_{v}, 0)\n_nc = min({most}, max({n_c}, 1))")
        if prepare:
            out.add(prepare)
        out.add("for _c in _prange(_nc):")
        out.depth += 1
        self.wide()
        out.add(f"_clo = _start_{v} + (_n_c * _c) // _nc\n"
                f"_chi = _start_{v} + (_n_c * (_c + 1)) // _nc")
