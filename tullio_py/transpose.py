"""dst[...] = src, or dst += src, where the two step through memory along different axes: a
tiled transposing copy, compiled once (jit.py) and run on the caller's threads.

The rule, on conv2d's dy (16, 64, 32, 32) copied channel-last to (16, 32, 32, 64): the copy is
dst[b, p, c] = src[b, p, c] over the view src = dy.reshape(16, 64, 1024).transpose(0, 2, 1),
whose finest axis (p, 4 bytes) is not dst's (c).  numpy walks dst's order and reads src 4096
bytes apart, so every read is a cache miss (1.7 ms on one thread, 1.3 ms in slabs).  Here the
copy goes in tiles of TILE_SRC x TILE_DST elements: each tile reads TILE_DST runs of
TILE_SRC elements contiguous in src (a cache line of float32 each, few enough lines that they
do not all alias one cache set) and writes TILE_SRC runs of TILE_DST contiguous in dst; 0.32 ms
on one thread on AMD Zen 5.

`views` reduces any pair of same-shaped arrays to that form: the axis finest in dst (N, last),
the axis finest in src (M, before it), the other axes first (in src's order, finest last, so that
the one next to M in memory may merge into it), adjacent axes merged where both arrays allow it, at most two of them left (A, B); size-1 axes dropped.  A pair it cannot reduce
(more than two other axes after merging; M shorter than a tile or N shorter than
TILE_DST, where the tiles would run their scalar remainders: conv2d's 3x3 weight w[o,c,i,j]
moved to [i,j,o,c] took 70 us tiled, 15 us in torch's copy; or src finest along dst's finest
axis: numpy's own copy then reads src in order) is left to the caller.
"""
from __future__ import annotations

import numpy as np

from . import jit, memo
from .codegen import Source

TILE_SRC = 16       # elements along src's finest axis per tile (a 64-byte line of float32)
TILE_DST = 8        # along dst's finest axis: 8 lines of src a tile, even 4096 bytes apart
MIN_BYTES = 1 << 15     # below this numpy's copy costs less than a compiled call
SHARED_BYTES = 1 << 20  # from this size on the copy may be shared by several threads
# The tiles pay where numpy's walk along dst reads src at least a page apart (a new page and a
# cache line per element, lines 4096 bytes apart all in one cache set).  One thread, AMD Zen 5,
# float32, caches flushed before each copy (warm in brackets), tiled against numpy's copy:
#   conv2d dy (16,64,32,32) channel-last, src step 4096 bytes:  0.94 (0.36) ms vs 2.36 (1.74)
#   conv2d x (16,32,34,34) channel-last, step 4624 bytes:       0.53 (0.23) ms vs 0.75 (0.15)
#   conv1d dy (32,64,256) channel-last, step 1024 bytes:        0.62 (0.20) ms vs 0.46 (0.20)
#   conv1d x (32,64,260) channel-last, step 1040 bytes:         0.48 (0.22) ms vs 0.44 (0.14)
FAR_BYTES = 4096
_KINDS = "biufc"

_TEXT = """
def {name}(dst, src):
    n_a, n_b, n_n, n_m = src.shape
    tiles = (n_m + {ti} - 1) // {ti}
    full = n_n - n_n % {tj}
    for t in _prange(n_a * n_b * tiles):
        ab = t // tiles
        i0 = (t - ab * tiles) * {ti}
        a = ab // n_b
        b = ab - a * n_b
        if i0 + {ti} <= n_m:
            for j0 in range(0, full, {tj}):
                for j in range({tj}):
                    for i in range({ti}):
                        dst[a, b, i0 + i, j0 + j] {op} src[a, b, j0 + j, i0 + i]
            for j in range(full, n_n):
                for i in range({ti}):
                    dst[a, b, i0 + i, j] {op} src[a, b, j, i0 + i]
        else:
            for j in range(n_n):
                for i in range(i0, n_m):
                    dst[a, b, i, j] {op} src[a, b, j, i]
"""


def _source(add: bool, parallel: bool) -> Source:
    name = "_tiled_add" if add else "_tiled_copy"
    text = _TEXT.format(name=name, ti=TILE_SRC, tj=TILE_DST, op="+=" if add else "=")
    return Source(text=text, name=name, args=("dst", "src"), parallel=parallel, fastmath=False)


# (add, parallel) -> Source; the serial one runs one thread's copies and the small ones
# without starting the thread pool (a 73 KB copy: 15 us serial, 60 us on a pool of one)
_SOURCES = {(a, p): _source(a, p) for a in (False, True) for p in (False, True)}
_LOADED = memo.Memo("transpose.loaded", 4)     # (add, parallel) -> compiled function (jit.load
#                                                 builds its key text: 19 us a lookup)


def _function(add: bool, parallel: bool):
    fn = _LOADED.get((add, parallel))
    if fn is None:
        fn = _LOADED[add, parallel] = jit.load(_SOURCES[add, parallel], "cpu")
    return fn


def views(dst: np.ndarray, src: np.ndarray):
    """(dst4, src4): 4-d views of dst and src (same shape) with the same elements in the same
    correspondence, dst finest along the last axis and src along the one before; or None where
    the copy is not such a transpose (see the module's docstring)."""
    if dst.shape != src.shape:
        return None
    keep = [d for d in range(dst.ndim) if dst.shape[d] > 1]
    if len(keep) < 2:
        return None
    n = min(keep, key=lambda d: abs(dst.strides[d]))
    m = min((d for d in keep if d != n), key=lambda d: abs(src.strides[d]))
    if abs(src.strides[n]) <= abs(src.strides[m]):
        return None
    axes: list = []         # [size, dst stride, src stride], merged where both allow
    others = sorted((d for d in keep if d not in (m, n)), key=lambda d: -abs(src.strides[d]))
    for d in others + [m, n]:
        size, ds, ss = dst.shape[d], dst.strides[d], src.strides[d]
        if axes and d != n and axes[-1][1] == ds * size and axes[-1][2] == ss * size:
            axes[-1] = [axes[-1][0] * size, ds, ss]
        else:
            axes.append([size, ds, ss])
    if len(axes) > 4 or axes[-2][0] < TILE_SRC or axes[-1][0] < TILE_DST:
        return None
    axes = [[1, 0, 0]] * (4 - len(axes)) + axes
    shape = tuple(a[0] for a in axes)
    as_strided = np.lib.stride_tricks.as_strided
    return (as_strided(dst, shape, tuple(a[1] for a in axes)),
            as_strided(src, shape, tuple(a[2] for a in axes), writeable=False))


def copy(dst: np.ndarray, src: np.ndarray, add: bool = False, threads: int | None = None) -> bool:
    """dst[...] = src (`add`: dst += src) as a tiled transposing copy on `threads` threads
    (None: this Python thread's budget, else numba's count; jit.call); False, with nothing
    done, where it does not apply: different dtypes, a dtype the compiled copy does not take,
    fewer than MIN_BYTES, a pair `views` does not reduce, or src's step along dst's finest
    axis under FAR_BYTES (numpy's own copy is as fast there)."""
    if (dst.dtype != src.dtype or dst.dtype.kind not in _KINDS or dst.dtype == np.float16
            or dst.nbytes < MIN_BYTES or not dst.flags.writeable):
        return False
    got = views(dst, src)
    if got is None or abs(got[1].strides[3]) < FAR_BYTES:
        return False
    n = jit.asked(threads)
    parallel = n != 1 and dst.nbytes >= SHARED_BYTES
    d4, s4 = got
    # src with its last two axes swapped: often C-contiguous (dy's own layout), and then
    # numba's C-layout specialisation reads the runs of TILE_SRC as vectors
    jit.call(_function(add, parallel), (d4, s4.swapaxes(2, 3)), parallel, n)
    return True
