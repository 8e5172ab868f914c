"""dask arrays in, lazy dask arrays out: a statement becomes a graph of blocks, each block run
by the statement's compiled loops (the numpy path of `Kernel`) over its own index ranges.

Lowering, on the statement after the shifted-left-hand-side rewrite (rewrite.lower):
- a left-hand index used bare in exactly one position (schedule.safe_indices) is chunked: each
  output block iterates only that block's values;
- a reduction index used bare in some array read is chunked too when that array has several
  chunks along it: each of its blocks gives a partial result per output block, combined by a
  tree (`split_every` at a time) of the statement's reducer; the assignment and finaliser
  apply after the tree, as the statement `out[L] op f(R[L])` over the combined partials R;
- an index used only shifted (`i` of `x[s+i]`), inside clamp()/mod(), in a gather's offset,
  only as a value, or in a shifted left-hand position is not chunked: every block iterates
  its whole range;
- each block reads, of every array, the window its ranges touch (halos included), cut from
  the chunks that overlap it; gathered dimensions are read whole (rechunked to one chunk).

Blocks run in local coordinates.  A chunked index n counts from the block's origin o_n; the
positions it indexes are shifted by a constant fixed per statement (the lowest position the
other indices reach), so one compiled kernel serves every block whatever its size.  Where the
statement uses n as a value (naked indices, masks, the bounds of rewritten shifts) it reads
n + o_n, o_n being a runtime parameter; a pad() read compares its global position with the
array's global extent (runtime parameters too).  Block kernels run on one thread unless the
kernel asked for an explicit count (capped by a dask.distributed worker's thread count).
"""
from __future__ import annotations

import itertools
import operator
import sys

import numpy as np

from .. import bind as binding
from .. import rewrite, schedule
from ..errors import ArgumentError, LoweringError
from ..ir import (Access, Affine, Binary, Call, Equation, Gather, IndexValue,
                  Param, Wrapped, slot_names, walk)
from . import dask_graph as graph

TAPE = True     # call() refuses to be recorded by a Tape itself (registry.py)


def wants(arrays: dict, kernel=None) -> bool:
    """Whether any argument is a dask array (dask.array already imported by the caller)."""
    da = sys.modules.get("dask.array")
    return da is not None and any(isinstance(v, da.Array) for v in arrays.values())


# ----------------------------------------------------------------------------- entry points
def call(k, arrays: dict):
    """Kernel.__call__ with dask arrays: a lazy dask array (in-place forms return the updated
    array as a new dask array; the array passed is not modified)."""
    from ..tape import current
    eq = k.equation
    if current() is not None:
        raise LoweringError("a Tape records calls on numpy arrays and torch tensors: it cannot "
                            "record a lazy dask call", eq.text, None,
                            "call the kernel outside `with Tape()`, and Kernel.vjp for gradients")
    collected, values = _inputs(k, arrays)
    b = binding.bind(eq, k.options, collected)    # the index values the loops read, checked once
    rng, dtype, out_shape = b.ranges, b.dtype, b.shape
    old = None if eq.assign == ":=" else values[eq.output]
    params = {n: collected[n] for n in eq.params}
    return evaluate(eq, {n: values[n] for n in eq.arrays}, params, rng, tuple(out_shape),
                    np.dtype(dtype), old, _options(k, k.pad))


def vjp(k, cotangent, arrays: dict) -> dict:
    """Kernel.vjp with dask arrays: {input: lazy gradient}, the gradient statements lowered by
    the same rules as a forward call."""
    da = _da()
    eq, gr = k.equation, k.gradient_side()
    arrays = dict(arrays)
    out_value = arrays.pop(eq.output, None)
    cot = cotangent if isinstance(cotangent, da.Array) else da.asarray(np.asarray(cotangent))
    call_args = dict(arrays)
    if eq.assign != ":=":
        call_args[eq.output] = (out_value if out_value is not None
                                else da.zeros(cot.shape, cot.dtype, chunks=cot.chunks))
    collected, values = _inputs(k, call_args)
    st = gr.call_state(collected, _ghost(cot))
    d, rng, params = st.d, st.rng, st.params
    ns = {n: values[n] for n in collected
          if n not in eq.params and (n != eq.output or eq.output in eq.arrays)}
    ns.update({p: collected[p] for p in eq.params})
    ns[d.cotangent] = cot if cot.ndim else _scalar(cot)
    if st.reads_output and eq.output not in ns:
        ns[eq.output] = (_wrap(out_value) if out_value is not None else
                         call(k, {n: v for n, v in call_args.items()
                                  if n != eq.output or eq.assign != ":="}))
    opts = _options(k, 0)

    def run(g, shape, dtype, old):
        vals = {n: ns[n] for n in g.arrays}
        prm = {n: params[n] if n in params else ns[n] for n in g.params}
        return evaluate(g, vals, prm, grng_of.get(str(g), rng), shape, np.dtype(dtype), old, opts)

    grng_of: dict = {}
    for h, _ in st.helpers:
        dtype = gr.helper_dtype(h, {**ns, **params})
        ns[h.output] = run(h, cot.shape, dtype,
                           None if h.assign == ":=" else da.zeros(cot.shape, dtype, chunks=cot.chunks))
    result = {}
    for name, dtype, eqs in st.grads:
        x = values[name]
        acc = da.zeros(x.shape, dtype, chunks=x.chunks)
        for g, _, grng in eqs:
            grng_of[str(g)] = grng
            acc = run(g, x.shape, dtype, acc)
        if x.dtype.kind != "c" and acc.dtype.kind == "c":
            acc = acc.real
        result[name] = acc.astype(x.dtype)
    return result


# ----------------------------------------------------------------------------- inputs
def _da():
    import dask.array as da
    return da


def _ghost(a):
    """A stand-in numpy array of a dask array's shape and dtype (no memory): lets the numpy
    path's checks and range inference run without computing anything."""
    if any(isinstance(n, float) and np.isnan(n) for n in a.shape):
        raise ArgumentError("a dask array with unknown chunk sizes cannot be indexed",
                            hint="call .compute_chunk_sizes() on it first")
    return np.lib.stride_tricks.as_strided(np.zeros(1, a.dtype), a.shape, (0,) * a.ndim)


def _scalar(v):
    da = _da()
    return np.asarray(v.compute() if isinstance(v, da.Array) else v)[()]


def _wrap(v):
    da = _da()
    return v if isinstance(v, da.Array) else da.asarray(v)


def _inputs(k, arrays: dict):
    """(what the numpy path's checks see, name -> dask array or scalar).  Index arrays and
    0-d parameters are computed now: their values decide ranges, shapes and bounds checks."""
    da = _da()
    eq = k.equation
    index_arrays = {g.array for g in eq.gathers()}
    stand, values = {}, {}
    for n, v in arrays.items():
        if isinstance(v, da.Array) and (n in index_arrays or n in eq.params):
            v = np.asarray(v.compute())
        if isinstance(v, da.Array):
            stand[n], values[n] = _ghost(v), v
        else:
            stand[n], values[n] = v, v
    collected = binding.collect(eq, stand)
    for n, v in collected.items():
        if isinstance(v, np.ndarray) and (values[n] is stand[n] or not isinstance(values[n], da.Array)):
            values[n] = da.asarray(v)
    return collected, values


def _options(k, pad) -> dict:
    threads = k.options.threads
    return dict(threads=1 if threads is True else threads,
                target="python" if k.target == "python" else "cpu", pad=pad,
                fastmath=k.options.fastmath, blas=k.options.blas)


# ----------------------------------------------------------------------------- lowering
def evaluate(eq: Equation, values: dict, params: dict, rng: dict, out_shape: tuple, dtype,
             old, opts: dict):
    """The lazy result of one statement.  values: arrays read (dask); params: scalars; rng:
    the global index ranges; old: the output's value before an in-place statement."""
    scalars = {a.array for a in eq.accesses() if not a.indices}   # 0-d reads: parameters
    if scalars:
        from dataclasses import replace
        eq = replace(eq, rhs=graph.post_order(eq.rhs, lambda n: Param(n.array) if isinstance(n, Access)
                                   and n.array in scalars else n))
        params = {**params, **{n: _scalar(values.pop(n)) for n in scalars}}
    values = {n: _wrap(v) for n, v in values.items()}
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output} | set(params)
    fresh = _Fresh(taken)
    if old is not None:
        old = _wrap(old)
        if eq.output in eq.arrays:      # reads of the old value: a separate input
            name = fresh("old_" + eq.output)
            eq = _rename_reads(eq, eq.output, name)
            values[name] = old
    low = rewrite.lower(eq, rng, out_shape)
    work = low.equation
    params = {**params, **low.bound_params}
    renames = {p: fresh(p.strip("_")) for p in params if p.startswith("_")}
    if renames:
        work = _map_params(work, renames)
        params = {renames.get(p, p): v for p, v in params.items()}
    rng = {n: low.ranges[n] for n in work.indices}
    for g in work.gathers():                  # the gathered dimensions: one chunk
        for acc in [work.lhs] + work.accesses():
            dims = {d: -1 for d, s in enumerate(acc.indices)
                    if g in (s, getattr(s, "inner", None))}
            if dims and acc.array in values:
                values[acc.array] = values[acc.array].rechunk(dims)
    plan = _chunking(work, values, rng, out_shape, old, dtype)
    if plan.reduced and rewrite.is_scatter(work):
        _check_scatter(work, opts)
    blocks = graph.Blocks(work, values, params, rng, out_shape, dtype, old, opts, plan, fresh)
    if not plan.reduced:
        return blocks.direct()
    partial = blocks.partials()
    if rewrite.is_scatter(work) or not out_shape:
        return _finish_numpy(work, partial, old, dtype, opts)
    R = fresh("R")
    masks = [f for f in schedule.top_factors(work.rhs)
             if schedule.mask_guards(f) is not None
             and {n.name for n in walk(f) if isinstance(n, IndexValue)} <= set(work.lhs_indices)]
    value = Access(R, work.lhs.indices)
    rhs = Call(work.finaliser, (value,)) if work.finaliser else value
    for m in masks:
        rhs = Binary("*", rhs, m)
    final = Equation(Access(work.output, work.lhs.indices), work.assign, rhs, text=work.text)
    frng = {n: rng[n] for n in final.indices}
    return evaluate(final, {R: partial}, {p: params[p] for p in final.params}, frng, out_shape,
                    dtype, old, opts)


class _Fresh:
    """New names that no name of the statement uses (user-style: the block statements are
    parsed again, and names starting with '_' are reserved)."""

    def __init__(self, taken):
        self.taken = set(taken)

    def __call__(self, base: str) -> str:
        base = base.strip("_") or "t"
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}{k}", k + 1
        self.taken.add(name)
        return name


class _Plan:
    """Which indices are chunked and how: blocks[n] = [(origin, lo, hi, size)]."""

    def __init__(self, out_idx, red_idx, blocks, no_chunk):
        self.out_idx, self.red_idx, self.blocks, self.no_chunk = out_idx, red_idx, blocks, no_chunk
        self.reduced = bool(red_idx)
        self.chunked = set(out_idx) | set(red_idx)


def _chunking(eq: Equation, values, rng, out_shape, old, dtype) -> _Plan:
    no_chunk = set()
    for slots in [eq.lhs.indices] + [s for _, s in graph.reads(eq)]:
        for s in slots:
            if isinstance(s, Wrapped) and s.kind != "pad":
                no_chunk |= set(s.names)
            for g in ([s.inner] if isinstance(s, Wrapped) else [s]):
                if isinstance(g, Gather):
                    no_chunk |= set(g.offset.names)
                elif isinstance(g, Affine) and slots is eq.lhs.indices and not g.is_bare:
                    no_chunk |= set(g.names)
    bracketed = {n for _, slots in graph.reads(eq) for s in slots for n in slot_names(s)}
    bracketed |= set(eq.lhs_indices)
    no_chunk |= set(eq.indices) - bracketed
    lhs_affine = {n for s in eq.lhs.indices if isinstance(s, Affine) for n in s.names}
    count = {}
    for s in eq.lhs.indices:
        for n in s.names:
            count[n] = count.get(n, 0) + 1
    out_idx = [n for n in eq.lhs_indices
               if n in schedule.safe_indices(eq) and n not in no_chunk and count[n] == 1]
    bare = {}
    for a, slots in graph.reads(eq):
        for d, s in enumerate(slots):
            if isinstance(s, Affine) and s.is_bare:
                bare.setdefault(s.names[0], (a, d))
    blocks = {}
    for n in out_idx:
        d = next(d for d, s in enumerate(eq.lhs.indices) if n in s.names)
        r = rng[n]
        if old is not None:
            bounds = _bounds(old.chunks[d])
            blocks[n] = [(c0, max(c0, r.start), max(max(c0, r.start), min(c1, r.stop)), c1 - c0)
                         for c0, c1 in bounds]
            continue
        src = bare.get(n) or next(((a, e) for a, slots in graph.reads(eq) for e, s in enumerate(slots)
                                   if graph.slot_affine(s) and graph.slot_affine(s)[0].coef(n) == 1),
                                  None)
        if src is not None:
            cuts = [c for c, _ in _bounds(values[src[0]].chunks[src[1]]) if 0 < c < out_shape[d]]
        else:
            from dask.array.core import normalize_chunks
            sizes = normalize_chunks("auto", (out_shape[d],), dtype=dtype)[0]
            cuts = [c for c, _ in _bounds(sizes)][1:]
        edges = [0] + cuts + [out_shape[d]]
        blocks[n] = [(a, a, b, b - a) for a, b in zip(edges, edges[1:]) if b > a] or [(0, 0, 0, 0)]
    red_idx = []
    for n in eq.indices:
        if n in out_idx or n in no_chunk or n in lhs_affine or n not in bare:
            continue
        a, d = bare[n]
        r = rng[n]
        bl = [(c0, max(c0, r.start), min(c1, r.stop), c1 - c0) for c0, c1 in
              _bounds(values[a].chunks[d]) if min(c1, r.stop) > max(c0, r.start)]
        if len(bl) > 1:
            red_idx.append(n)
            blocks[n] = bl
    return _Plan(out_idx, red_idx, blocks, no_chunk)


def _bounds(chunks) -> list[tuple[int, int]]:
    edges = [0] + list(itertools.accumulate(chunks))
    return list(zip(edges, edges[1:]))


def _check_scatter(eq: Equation, opts):
    ok = (eq.finaliser is None and (
        (eq.reducer == "+" and eq.assign in ("+=", "-=")) or
        (eq.reducer == "+" and eq.assign == ":=" and opts["pad"] == 0) or
        (eq.reducer == "*" and eq.assign == "*=")))
    if not ok:
        raise LoweringError(
            f"a scattered left-hand side ({eq.lhs}) with '{eq.assign}', reducer "
            f"({eq.reducer}){' and a finaliser' if eq.finaliser else ''} cannot combine the "
            "partial results of chunks: elements no tuple writes are not told apart",
            eq.text, eq.lhs.span,
            "rechunk the arrays to one chunk along the indices inside the left-hand side")


_NUMPY_FIN = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0)}


def _finish_numpy(eq, R, old, dtype, opts):
    """The assignment after the tree, elementwise, where the output is a scalar or a scatter."""
    if eq.finaliser:
        f = _NUMPY_FIN.get(eq.finaliser) or getattr(np, eq.finaliser)
        R = R.map_blocks(f, dtype=dtype)
    if eq.assign in (":=", "="):
        return R.astype(dtype)
    op = {"+=": operator.add, "-=": operator.sub, "*=": operator.mul}[eq.assign]
    return op(old, R).astype(dtype)


# ----------------------------------------------------------------------------- equation edits
def _rename_reads(eq: Equation, old: str, new: str) -> Equation:
    from dataclasses import replace
    return replace(eq, rhs=graph.post_order(eq.rhs, lambda n: Access(new, n.indices, n.span)
                                 if isinstance(n, Access) and n.array == old else n))


def _map_params(eq: Equation, names: dict) -> Equation:
    from dataclasses import replace
    return replace(eq, rhs=graph.post_order(eq.rhs, lambda n: Param(names[n.name])
                                 if isinstance(n, Param) and n.name in names else n))
