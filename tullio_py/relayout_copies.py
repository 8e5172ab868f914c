"""The copies relayout.py makes, as data and as arrays: `Copy` (a read's copy: its axes in
another order, padded), `Output` (a scratch output in another axis order, taken into the
output after the loops), `copies` (the arrays themselves, or stand-ins for planning) and
`standin`.  relayout.py states when they are made and why.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import blas, blas_threads, jit, memory, transpose
from .blas_shift_run import store
from .ir import Equation



@dataclass(frozen=True)
class Copy:
    """The layout of a read's copy: the original's axes in the order `axes`, and `pads`
    ((lo, hi) per axis of the copy; () for none) elements of the value `fill` before and after
    the original's on each axis."""
    axes: tuple
    pads: tuple = ()
    fill: object = 0

    @staticmethod
    def of(c) -> "Copy":
        """`c`, or a bare axis order as a Copy."""
        return c if isinstance(c, (Copy, Output)) else Copy(tuple(c))

    def describe(self, name: str) -> str:
        """What the copy is, in words."""
        moved = self.axes != tuple(range(len(self.axes)))
        text = (f"a C-ordered copy of {name} with axes {self.axes}" if moved or not self.pads
                else f"a copy of {name}")
        widths = ", ".join(f"{lo} before and {hi} after axis {d}"
                           for d, (lo, hi) in enumerate(self.pads) if lo or hi)
        return text + (f" padded with {self.fill!r} ({widths})" if widths else "")


@dataclass(frozen=True)
class Output:
    """The statement computes into a C-contiguous scratch whose axes are the output's in the
    order `axes` (`:=`), which is then stored, added or subtracted into the output by the
    statement's own assignment (`take`)."""
    axes: tuple

    def describe(self, name: str) -> str:
        return f"a scratch of {name} with axes {self.axes}, taken into {name} after the loops"


def _output(order, name: str) -> Output | None:
    """The Output of `name` in `order` ((name, layout) pairs or a dict), or None."""
    c = dict(order).get(name) if order else None
    return c if isinstance(c, Output) else None


def target_shape(order, name: str, shape) -> tuple:
    """The shape the moved statement writes: `shape`, or its scratch's (an Output in `order`)."""
    c = _output(order, name)
    return tuple(shape[d] for d in c.axes) if c else tuple(shape)


def scratch(order, name: str, out: np.ndarray) -> np.ndarray:
    """Where the moved statement writes: `out`, or a new scratch (an Output in `order`)."""
    if _output(order, name) is None:
        return out
    return memory.empty(target_shape(order, name, out.shape), out.dtype)


def take(order, eq: Equation, out: np.ndarray, dest: np.ndarray,
         threads: int | None = None) -> None:
    """Take a scratch `dest` (an Output in `order`) into `out` by `eq`'s assignment: a tiled
    transposing copy on at most `threads` threads (transpose.py) where it applies, else
    through the frontend's own copy where it has one (blas_shift_run.store)."""
    c = _output(order, eq.output)
    if c is None:
        return
    back = np.transpose(dest, np.argsort(c.axes))
    if eq.assign == "-=":
        np.subtract(out, back, out=out)
    else:
        n = jit.asked(threads)
        if not transpose.copy(out, back, eq.assign == "+=", n):
            store(_pool_copy(n), out, back, eq.assign == "+=")


def copies(arrays: dict, order, run: bool = True, threads: int | None = None) -> dict:
    """`arrays` with each array of `order` ((name, Copy or axis order) pairs or a dict)
    replaced by its copy: C-contiguous, cache-line aligned, its axes in that order, widened by
    the pad value where the Copy says (`run` False: a stand-in of its shape, for planning).
    `threads`: how many threads a moved copy may share (None: this Python thread's budget,
    else numba's count)."""
    out = dict(arrays)
    for n, c in (order.items() if isinstance(order, dict) else order):
        if isinstance(c, Output):
            continue
        c, v = Copy.of(c), out[n]
        shape = tuple(v.shape[d] for d in c.axes)
        widths = c.pads or ((0, 0),) * len(shape)
        wide = tuple(m + lo + hi for m, (lo, hi) in zip(shape, widths))
        if not run:
            out[n] = standin(wide, v.dtype)
            continue
        # (memory.py's buffers: a new megabyte of numpy's faults its pages in)
        out[n] = memory.empty(wide, v.dtype)
        inside = tuple(slice(lo, lo + m) for m, (lo, _) in zip(shape, widths))
        if wide != shape:
            for d, (lo, hi) in enumerate(widths):       # only the border gets the pad value
                edge = [slice(None)] * len(wide)
                for part in (slice(0, lo), slice(lo + shape[d], wide[d])):
                    edge[d] = part
                    out[n][tuple(edge)] = c.fill
        _copy_moved(out[n][inside], np.transpose(v, c.axes), threads=threads)
    return out


def _copy_moved(dst: np.ndarray, src: np.ndarray, block: int = 16,
                threads: int | None = None) -> None:
    """dst[...] = src, where src's last axis may step through memory with a stride: as a tiled
    transposing copy (transpose.py) where it applies; else through the frontend's pool copy
    (`_pool_copy`); else by numpy's copy, from transpose.SHARED_BYTES on on `threads` threads
    (None: this Python thread's budget) in slabs of
    `block` elements of the last axis (numpy's copy releases the GIL).  On one thread numpy's
    copy whole: where the tiles do not apply it was as fast as slabs or faster (conv1d's x
    (32, 64, 260) moved channel-last: 0.12 ms whole, 0.19 ms in slabs; inside a
    forward+backward under torch, 0.35-0.52 ms whole against 1.4-1.5 ms in slabs)."""
    threads = jit.asked(threads)
    if transpose.copy(dst, src, threads=threads):
        return
    copy = _pool_copy(threads)
    if copy is not None and copy(dst, src, False):
        return
    n = src.shape[-1] if src.ndim else 0
    if (src.ndim < 2 or abs(src.strides[-1]) == src.itemsize or n <= 2 * block
            or (threads or 1) < 2 or dst.nbytes < transpose.SHARED_BYTES
            or not blas_threads.available()):
        np.copyto(dst, src)
        return
    blas_threads.run([functools.partial(np.copyto, dst[..., s:s + block], src[..., s:s + block])
                      for s in range(0, n, block)], threads)


def _pool_copy(threads: int | None):
    """The frontend's copy on its own pool (blas.gemm_provider: torch's copy_), or None: the
    copies go there, so that no Python threads of this module run beside that pool's spinning
    workers (a conv2d NCHW forward and backward under torch on 2 threads: 14.7 ms with the
    copies on Python threads, 13.3 ms on torch's pool).  None on one thread, where no Python threads run and
    numpy's copy on this thread is the faster: conv1d's x (32, 64, 260) moved channel-last
    inside a forward+backward under torch on one thread, 0.35-0.52 ms against 0.81-1.47 ms in
    torch's copy_ (AMD Zen 5).  `threads`: the count asked (jit.asked)."""
    if threads == 1:
        return None
    return getattr(blas.gemms, "copy", None) if blas.pooled_gemm() else None


def standin(shape, dtype) -> np.ndarray:
    """A C-contiguous array of this shape and dtype backed by one element: what planning
    looks at (shape, dtype, strides) of an array a run will allocate or copy; never read."""
    dtype = np.dtype(dtype)
    strides, step = [], dtype.itemsize
    for n in reversed(tuple(shape)):
        strides.insert(0, step)
        step *= max(n, 1)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), tuple(shape), tuple(strides))
