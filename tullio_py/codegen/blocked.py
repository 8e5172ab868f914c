"""The register-blocked row form (Plan.jam, decided by schedule.jam_choice).

A row-form sum `out[.., v, r] = sum over reductions of value` normally updates a row of the
output at every reduction step.  Here `factor` values of the left index `v` run at once and the
row index `r` runs in tiles of `lanes` elements: each (factor x lanes) tile of the output is
summed in a local accumulator tile `_acc` across the whole reduction and stored once.  In the
body, `for _l in range(lanes)` updates `factor` accumulators from one load of every read that
`v` does not select, so the compiler vectorises over `_l` and each loaded element feeds
`factor` sums.  Reads hoisted at or inside the jammed loop are loaded once per value of `v`
(`_h<k>_<f>`).

    for _jb in prange(ceil(n_v / factor)):       # v = _j0 + f, f < factor (n_v >= factor)
        for _rb in range(ceil(n_r / lanes)):      # r = _r0 + _l, _l < lanes (n_r >= lanes)
            _acc[:, :] = 0
            for <reductions>:
                for _l in range(lanes):
                    _acc[f, _l] += value(v = _j0 + f, r = _r0 + _l)     (each f)
            out[.., _j0 + f, _r0 + _l] (=, +=, -=) _acc[f, _l]   (f, _l not stored before)

The last tile of a row ends at the row's end: it overlaps the tile before it and stores only
the elements that tile did not (a row of 30 with lanes 16 runs tiles at 0 and 14, the second
storing 16..29), so the end of the row is summed in the vector lanes too.  The last block of
`v` does the same: 34 values with factor 8 run blocks at 0, 8, 16, 24 and 26, the last storing
v = 32, 33.  Each element is stored by exactly one tile, so `+=` adds once and the parallel
blocks never write the same element.  (A scalar nest for the left-over values, one sum per
element with the row read a stride apart, made the NHWC gradient dx[b,p,q,c], q of 34, six
times slower than the same statement with q of 32: 19.1 against 3.6 ms, 2 threads.)

jam_choice only picks this form with n_v >= factor and n_r >= lanes, and the compiled code is
keyed by the plan's jam: the kernel checks both on entry and raises rather than leave elements
unwritten.

The sums are the row form's, in another order: results agree to rounding.
"""
from __future__ import annotations

from ..guards import factor_reads
from ..ir import Affine
from .bounds import loop_bounds
from .expr import STORE, Expr, hoist_table, identity_code


def render_jam(nest):
    """Render `nest.plan` (form "row" with a `jam`) into `nest.out`."""
    plan, out, x = nest.plan, nest.out, nest.x
    eq = plan.equation
    v, factor, lanes = plan.jam
    n = len(plan.loops)
    kj = next(k for k, l in enumerate(plan.loops) if l.index == v)
    r = plan.loops[-1].index
    ident = identity_code(eq.reducer, x.dtype)
    store_op = STORE[eq.assign]
    table = hoist_table(plan.hoists)
    outer = {s: h for s, h in table.items() if h[1] < kj}
    inner = [h for h in table.values() if h[1] >= kj]
    # The reads of the row that v does not select: loaded once into locals `_x<m>` for the
    # `factor` sums (after a store to _acc the compiler would have to read them again).
    shared: dict = {}
    for a in factor_reads(eq.rhs):
        names = {n for s in a.indices for n in s.names}
        if str(a) not in table and v not in names and str(a) not in shared:
            shared[str(a)] = (f"_x{len(shared)}", n - 1, a)
    packed = _packed(plan, shared, kj) if plan.pack else {}
    per_f = [Expr(plan, x.target, {**outer, **shared, **{
        s: (f"{h[0]}_{f}",) + h[1:] for s, h in table.items() if h[1] >= kj}})
        for f in range(factor)]
    for e in (x, *per_f):
        e.lane_indices = frozenset({r})
    lhs = x.plain_access(eq.lhs)

    def loads(level):
        """The reads hoisted at `level`, one local per value of v."""
        here = [h for h in inner if h[1] == level]
        for f in range(factor if here else 0):
            out.add(f"{v} = _j0 + {f}")
            for name, _, a in here:
                out.add(f"{name}_{f} = {x.plain_access(a)}")

    # Both bounds are the plan's range arguments, whatever loops are open around them
    # (jam_choice refuses guards on v and r).
    start, stop, _ = loop_bounds(v, set(), list(plan.guards))
    rstart, rstop, _ = nest.inner_bounds(r, opened={v})
    out.add(f"if {stop} - {start} < {factor} or {rstop} - {rstart} < {lanes}:\n"
            f"    raise ValueError('register-blocked loops need {factor} values of {v} and "
            f"rows of {lanes}')")
    nest.emit_hoists(-1)
    if packed:
        _pack(nest, packed, kj, lanes)
    nest.open_range(range(kj))
    loop = "_prange" if plan.loops[kj].parallel else "range"
    # _lo and _nr are computed in each parallel body: computed once outside, they made the
    # compiler's version of the tiles 2.5x slower (512 matmul).
    row_tiles = (f"_lo = {rstart}\n_nr = (max({rstop} - _lo, 0) + {lanes - 1}) // {lanes}")
    out.add(f"_nj = (max({stop} - {start}, 0) + {factor - 1}) // {factor}\n"
            f"for _jb in {loop}(_nj):")
    out.depth += 1
    nest.opened.append(v)
    if plan.wide:
        out.add("_wide_vectors()")
    # The last block ends at the range's end, overlapping the one before: its values below
    # _f0 were stored by that one.
    out.add(f"_j0 = min({start} + _jb * {factor}, {stop} - {factor})\n"
            f"_f0 = {start} + _jb * {factor} - _j0\n"
            f"_acc = _np.empty(({factor}, {lanes}), _T)\n" + row_tiles)
    loads(kj)
    out.add("for _rb in range(_nr):")
    out.depth += 1
    # (max(.., _lo): the compiler then knows that _r0 >= 0 where _lo is, so it drops the
    # negative-index wraparound and vectorises the tiles: 2x faster)
    out.add(f"_r0 = max(min(_lo + _rb * {lanes}, {rstop} - {lanes}), _lo)\n"
            f"_k0 = _lo + _rb * {lanes} - _r0\nfor _l in range({lanes}):")
    out.add("\n".join(f"    _acc[{f}, _l] = {ident}" for f in range(factor)))
    level, count = nest.mark()
    red = plan.loops[n - 2].index
    for k in range(kj + 1, n - 1):
        nest.open(k, hoist=False)
        loads(k)
    out.add(f"for _l in range({lanes}):\n    {r} = _r0 + _l")
    out.depth += 1
    for key, (name, _, a) in shared.items():
        out.add(f"{name} = {packed[key][0]}[_rb, {red} - _start_{red}, _l]" if key in packed
                else f"{name} = {x.plain_access(a)}")
    for f in range(factor):
        out.add(f"{v} = _j0 + {f}\n_acc[{f}, _l] += {per_f[f].rhs_without_guards()}")
    nest.close_to(level, count)
    # Every tile but a row's overlapping last one stores all its lanes, in a loop of constant
    # length (one loop from _k0 made the local convolution's dW 20% slower); every block but
    # the last of v stores all its rows.
    level = out.depth
    for head, first in (("if _k0 == 0:", "0"), ("else:", "_k0")):
        out.depth = level
        out.add(f"{head}\n    for _l in range({first}, {lanes}):\n        {r} = _r0 + _l")
        out.depth += 2
        for f in range(factor):
            store = f"{v} = _j0 + {f}\n{lhs} {store_op} {x.result(f'_acc[{f}, _l]')}"
            out.add(store if f == factor - 1 else
                    f"if _f0 <= {f}:\n" + "\n".join("    " + t for t in store.split("\n")))


def _packed(plan, shared: dict, kj: int) -> dict:
    """The shared reads copied into contiguous panels before the loops (Plan.pack): with one
    reduction loop q between the jammed index and the row r, a read of exactly q and r, both
    bare (B[q,r] of a matmul), without guards on q.  Each
    tile's column of it is read once per block of v, row after row of B a stride apart
    (many rows of a power-of-two stride share a cache set); packed, tile `_rb`'s values lie in
    `_p<m>[_rb, q - start, 0:lanes]`, one contiguous stream.  512 float32 matmul, one thread,
    CPU time on a loaded machine: 2.56 -> 2.31 ms (numpy 1.80); 1024: 42 -> 24 ms.
    {read key: (panel name, read, reduction index)}."""
    n = len(plan.loops)
    if n - kj != 3:
        return {}
    q, r = plan.loops[kj + 1].index, plan.loops[-1].index
    if any(q in g.expr.names for g in plan.guards):
        return {}
    out = {}
    for key, (name, _, a) in shared.items():
        if (len(a.indices) == 2 and all(isinstance(s, Affine) and s.is_bare for s in a.indices)
                and {s.names[0] for s in a.indices} == {q, r}):
            out[key] = (f"_p{len(out)}", a, q)
    return out


def _pack(nest, packed: dict, kj: int, lanes: int):
    """The panels of `packed` (see _packed), filled tile by tile, in parallel over tiles when
    the jammed loop is parallel; the tiles start where render_jam's do."""
    plan, out, x = nest.plan, nest.out, nest.x
    v = plan.jam[0]
    r = plan.loops[-1].index
    rstart, rstop, _ = nest.inner_bounds(r, opened={v})
    q = next(iter(packed.values()))[2]
    qstart, qstop, _ = loop_bounds(q, set(), list(plan.guards))
    loop = "_prange" if plan.loops[kj].parallel else "range"
    out.add(f"_plo = {rstart}\n_pnr = (max({rstop} - _plo, 0) + {lanes - 1}) // {lanes} "
            f"if {rstop} - _plo >= {lanes} else 0\n_pnq = max({qstop} - {qstart}, 0)")
    for name, _, _ in packed.values():
        out.add(f"{name} = _np.empty((_pnr, _pnq, {lanes}), _T)")
    out.add(f"for _rb in {loop}(_pnr):")
    out.depth += 1
    out.add(f"_r0 = max(min(_plo + _rb * {lanes}, {rstop} - {lanes}), _plo)\n"
            f"for _q in range(_pnq):\n    {q} = {qstart} + _q\n"
            f"    for _l in range({lanes}):\n        {r} = _r0 + _l")
    out.depth += 2
    for name, a, _ in packed.values():
        out.add(f"{name}[_rb, _q, _l] = {x.plain_access(a)}")
    out.depth -= 3
