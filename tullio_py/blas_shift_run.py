"""Running a plan of blas_shift.py: the Python loop over its looped indices, each step one
matmul over strided views of the arrays (after an im2col copy where the plan merges axes),
stored or added into the output (col2im: value by value of the scattered indices); the
first looped index's steps cut into groups (as many as the machine's threads, whatever a
call's own), which Python threads share (blas_threads.py) where the plan allows.

Where the frontend supplies its own gemm (blas.gemm_provider: torch's BLAS on torch's
intra-op pool, which also adds into the output in place, and torch's copy for the im2col
copies) the steps run in order on the calling thread, all added into the one output as on
one thread, whatever the group count: each product and copy is spread over the frontend's
pool.  Python threads with single-threaded gemms next to that pool would run beside its
workers, which stay runnable (spinning) between its ops: on 2 cores right after a torch
op, a conv1d forward took 4.9-5.2 ms on 2 Python threads against 2.1 ms on an idle
machine.  The result then does not depend on the group count; torch's gemm may round by
its own thread count (its BLAS splits the products), which so may change the last bits.
"""
from __future__ import annotations

from functools import partial
from itertools import product

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import blas_shift_gather as gather
from . import blas_threads, memory
from .blas import gemms, pooled_gemm


def _master(arr: np.ndarray, v, writeable: bool) -> np.ndarray:
    base = arr[tuple(slice(s, s + 1) for s in v.start) + (Ellipsis,)]
    return as_strided(base, v.shape, v.strides, writeable=writeable)


def step_groups(p, groups: int) -> int:
    """Groups the steps of p's first looped index are cut into for the reference count."""
    n = min(groups, p.steps[0]) if p.split and p.loop else 1
    return n if n > 1 and blas_threads.available() else 1


def step_threads(p, groups: int, threads: int | None = None) -> int:
    """Python threads sharing p's step groups when the call may use `threads` (default:
    all); one under a frontend's gemm (blas.gemm_provider), whose own pool shares the work."""
    if pooled_gemm():
        return 1
    n = step_groups(p, groups)
    return n if threads is None else max(1, min(n, threads))


def run(p, sh, arrays: dict, out: np.ndarray, zero_first: bool,
        write: bool = False, groups: int = 1, threads: int | None = None):
    """Accumulate the statement into `out` (cleared first where written, for `=` and a
    `:=` output filled with a pad value), or with `write` (steps that share no element)
    store it there.  With `groups` > 1 the steps of the first looped index are cut into
    that many groups where the plan allows, each run in order with single-threaded gemms
    into its own output elements (split 1) or its own zeroed copy of the output, added in
    group order after (split 2); `threads` (default: one per group) share the groups, so
    they change no bit of the result.  Callers pass one reference count as `groups` for
    every call (frontends/numpy.shift_groups), whatever the call's threads.  Under a
    frontend's gemm (blas.gemm_provider) every step runs in order on this thread into `out`
    (no groups), each product and copy on the frontend's pool."""
    if getattr(p, "gather", False):         # blas_shift_gather.py's plan
        gemm = getattr(gemms, "f", None)
        return gather.run(p, sh, arrays, out, groups, threads, gemm,
                          getattr(gemms, "copy", None) if gemm is not None else None)
    a0, a1 = (arrays[a.array] for a in sh.reads)
    # (writeable where the array is: a frontend's gemm may want writeable views; never written)
    masters = (_master(a0, p.views[0], True), _master(a1, p.views[1], True))
    mo = _master(out, p.views[2], True)
    if zero_first:
        mo[...] = 0
    scale = sh.factor(arrays)
    g = step_groups(p, groups)
    gemm = getattr(gemms, "f", None)
    if g < 2 or gemm is not None:
        # the frontend's gemm and copy where it has them (blas.gemm_provider: torch's, on its
        # own pool), every step on this thread; groups of steps keep numpy's, made
        # single-threaded per thread.  Every operand and output of a step is a view of the
        # masters, a new array or a buffer of its own, and the output shares no memory with
        # a read (Shifted.call): checked once here, not at every step.
        copy = getattr(gemms, "copy", None) if gemm is not None else None
        views = getattr(gemms, "views", None) if gemm is not None else None
        if views is not None and all(views(m) for m in (*masters, mo)):
            gemm = partial(gemm, checked=True)
            copy = partial(copy, checked=True) if copy is not None else None
        _steps(p, masters, mo, 0, p.steps[0] if p.loop else 1, scale, write, gemm, copy)
        return out
    cut = [p.steps[0] * k // g for k in range(g + 1)]
    parts = [out] + ([np.zeros_like(out) for _ in range(g - 1)] if p.split == 2 else [])
    if any(x.strides != out.strides for x in parts):
        blas_threads.run([lambda: _steps(p, masters, mo, 0, p.steps[0], scale, write)], 1)
        return out
    targets = [mo] + [_master(x, p.views[2], True) for x in parts[1:]]
    blas_threads.run([lambda k=k: _steps(p, masters, targets[k] if p.split == 2 else mo,
                                         cut[k], cut[k + 1], scale, write) for k in range(g)],
                     step_threads(p, groups, threads))
    for x in parts[1:]:
        np.add(out, x, out=out)
    return out


def _steps(p, masters, mo, lo: int, hi: int, scale, write: bool, gemm=None, copy=None):
    """The steps whose first looped index is in [lo, hi) (all steps when nothing is looped);
    `gemm`, `copy`: a frontend's (blas.gemm_provider) the products and copies go to first."""
    subs = [v.sub for v in p.views]
    bufs = [None, None]     # an operand's merged (im2col) copy, reused by every step
    acc = tmp = None        # the summed results of a plan that accumulates (Plan.accumulate)
    ranges = [range(lo, hi)] + [range(n) for n in p.steps[1:]] if p.loop else []
    for pos in product(*ranges):
        xs = []
        for i in (0, 1):
            summed, perm, shape, contig, flip = p.ops[i]
            x = masters[i][tuple(pos[j] for j in subs[i]) + (Ellipsis,)]
            if summed:
                x = x.sum(axis=summed)
            x = x.transpose(perm)
            if bufs[i] is None:
                try:
                    x = np.reshape(x, shape, copy=False)
                except ValueError:              # the merge copies: into a buffer kept
                    bufs[i] = memory.empty(x.shape, x.dtype)
            if bufs[i] is not None:
                if copy is None or not copy(bufs[i], x):
                    np.copyto(bufs[i], x)
                x = bufs[i].reshape(shape)
            elif contig:
                x = _contiguous(copy, x)
            if flip:
                x = x.swapaxes(-1, -2)
            xs.append(x * scale if scale != 1 and i == p.small else x)
        a, b = xs[p.left], xs[1 - p.left]
        if p.scatter:
            r = _matmul(gemm, a, b).reshape(p.res_shape)
            for sv in product(*[range(n) for n in p.scatter_steps]):
                full = pos + sv
                t = mo[tuple(full[j] for j in subs[2]) + (Ellipsis,)].transpose(p.out_perm)
                at = [slice(None)] * len(p.res_shape)
                for ax, v in zip(p.scatter_axes, sv):
                    at[ax] = v
                store(copy, t, r[tuple(at)], True)
            continue
        t = mo[tuple(pos[j] for j in subs[2]) + (Ellipsis,)].transpose(p.out_perm)
        if write:
            if p.direct:
                try:
                    tv = np.reshape(t, p.mm_shape, copy=False)
                    if gemm is None or not gemm(a, b, tv, 1, 0):
                        np.matmul(a, b, out=tv)
                    continue
                except (ValueError, TypeError):     # the output's layout is no matmul result
                    pass
            store(copy, t, _matmul(gemm, a, b).reshape(p.res_shape), False)
            continue
        if p.accumulate and gemm is None:   # summed here, added into the output once
            if acc is None:
                acc = np.matmul(a, b)
                tmp = np.empty_like(acc)
            else:
                np.add(acc, np.matmul(a, b, out=tmp), out=acc)
            continue
        if gemm is not None and t.dtype == a.dtype == b.dtype:
            try:        # the frontend's gemm adds into the output in place (beta 1)
                if gemm(a, b, np.reshape(t, p.mm_shape, copy=False), 1, 1):
                    continue
            except ValueError:                      # the output's layout is no matmul result
                pass
        store(copy, t, _matmul(gemm, a, b).reshape(p.res_shape), True)
    if acc is not None:     # (no looped index names an output axis: one block for all steps)
        store(copy, mo[(Ellipsis,)].transpose(p.out_perm), acc.reshape(p.res_shape), True)


def store(copy, t, r, add: bool):
    """t[...] = r, or t += r: through the frontend's copy `copy` where there is one and it
    takes the call (on its pool: torch's), else numpy's on this thread (also relayout's
    scratch output taken into its output)."""
    if copy is not None and copy(t, r, add):
        return
    if add:
        np.add(t, r, out=t, casting="unsafe")
    else:
        np.copyto(t, r, casting="unsafe")


def _contiguous(copy, x):
    """x in C order: a copy (through the frontend's copy when there is one and it takes it),
    or x itself where it already is."""
    if copy is None or x.flags.c_contiguous:
        return np.ascontiguousarray(x)
    c = memory.empty(x.shape, x.dtype)
    return c if copy(c, x) else np.ascontiguousarray(x)


def _matmul(gemm, a, b):
    """a @ b, through the frontend's gemm when there is one and it takes the call."""
    if gemm is not None and a.dtype == b.dtype:
        r = memory.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                         + (a.shape[-2], b.shape[-1]), a.dtype)
        if gemm(a, b, r, 1, 0):
            return r
    return np.matmul(a, b)
