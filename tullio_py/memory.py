"""New arrays whose first element starts a cache line: `empty`, `zeros`, `full`.

numpy aligns its data to 16 bytes.  An array of a megabyte or more gets its own pages from
glibc's mmap, and the data then starts 16 bytes after a page boundary (`np.empty((4096, 512),
np.float32).ctypes.data % 64 == 16`), so every 64-byte vector a kernel loads or stores on an
AVX-512 machine straddles two cache lines.  Measured on this project's 2-core AVX-512 machine,
`y[i,j] = exp(x[i,j] - m[i])` over 4096x512 float32, one thread: 0.70 ms with x and y on
64-byte boundaries, 0.75 ms with both 16 bytes past one (2 threads: 0.41 and 0.43 ms).

So every array tullio_py allocates for a result, a temporary or a gradient comes from here:
one byte buffer `ALIGN` bytes longer than the data, the array a view of it starting at the
first multiple of `ALIGN`.  Arrays under `SMALL` bytes come from numpy directly (their
vectors are few, and the view costs about a microsecond a call).  The arrays are writeable
and C-contiguous like numpy's; their `.base` is the byte buffer, which `whole` recognises so
that scratch.Pool takes them back (it takes only arrays that own all their memory).

Buffers of `RECYCLE` bytes and more are also kept here after use and handed out again once
no array refers to them (their reference count says so: every view of a buffer, a torch
tensor made from one included, holds a reference to it).  glibc gives a large block freed
at the top of its heap back to the system, and the next array of that size then faults its
pages in again, at several microseconds a page: in a training loop that accumulates
gradients into `.grad` (the first gradient becomes `.grad` itself and stays, the later ones
are freed after they are added), a softmax chain's forward and backward (4096x512 float32,
2 threads) took 10 ms each, with about 500 page faults a pass, against 1.6-1.9 ms and none
once its buffers came back from here (benchmarks/bench_memory.py).  At most `KEEP` bytes of
buffers are remembered (the oldest forgotten first: a buffer still in use is then freed as
usual when its last view goes).  They are mappings of their own (mmap), outside the heap
that numpy and torch share.

glibc serves a block from an mmap of its own when it is larger than its mmap threshold, and
raises that threshold to the size of the largest such block freed (up to 32 MiB): numpy
programs that free large arrays raise it, and torch's large blocks then come from the heap.
Kept buffers are never freed, so without more a process that runs tullio_py's kernels would
leave the threshold low and every large torch block mapped and faulted in at each call (a
torch conv2d forward+backward, 16x32x34x34, 2 threads: 12.6 ms with 2400 page faults a call,
9 ms with none).  So the first time a buffer is kept, a block of `PRIME` bytes is allocated
and freed, as any program freeing such an array does once.
"""
from __future__ import annotations

import mmap
import os
import sys
import threading
import weakref

import numpy as np

ALIGN = 64          # bytes: a cache line, and an AVX-512 vector
SMALL = 1 << 14     # arrays under this many bytes are numpy's own
RECYCLE = 1 << 18   # buffers of this many bytes and more are handed out again
KEEP = 64 << 20     # bytes of such buffers remembered at most
PRIME = 31 << 20    # bytes of the block freed once (under glibc's 32 MiB threshold limit)

_buffers: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # id -> byte buffer
_kept: list = []    # recycled buffers, least recently handed out first
_held = [0]         # their bytes
_primed = [False]   # the PRIME block was freed (_prime)
_lock = threading.Lock()


def _refs(kept: list, k: int) -> int:
    """References to kept[k], counted the same way for every buffer."""
    return sys.getrefcount(kept[k])


# what _refs counts for a kept buffer that no array refers to (the list's reference and the
# call's own: measured, as interpreters differ in what they count for the argument)
_IDLE = _refs([bytearray()], 0)


def empty(shape, dtype) -> np.ndarray:
    """An unfilled C-contiguous array whose data starts at a multiple of ALIGN bytes (for
    `SMALL` bytes and more)."""
    shape, dtype, n = _size(shape, dtype)
    if n < SMALL:
        return np.empty(shape, dtype)
    raw = _recycled(n + ALIGN) if n >= RECYCLE else _registered(np.empty(n + ALIGN, np.uint8))
    return _aligned(raw, n, shape, dtype)


def zeros(shape, dtype) -> np.ndarray:
    """`empty`, filled with zeros.  Of RECYCLE bytes and more: zeroed by calloc and not kept
    (a kept buffer is zeroed on the calling thread alone; calloc's pages, where fresh, are
    zeroed by the threads that first write them: a max-pool's forward+backward through torch,
    16x32x64x64 float32 on 2 threads, 6.0-6.2 ms with its 8 MB gradient zeroed here, 5.2-5.7
    with calloc's)."""
    shape, dtype, n = _size(shape, dtype)
    if n < RECYCLE:
        out = empty(shape, dtype)
        out.fill(0)
        return out
    return _aligned(_registered(np.zeros(n + ALIGN, np.uint8)), n, shape, dtype)


def full(shape, value, dtype) -> np.ndarray:
    """`empty`, filled with `value` (`zeros` for 0)."""
    if isinstance(value, (int, float)) and value == 0:
        return zeros(shape, dtype)
    out = empty(shape, dtype)
    out.fill(value)
    return out


def _size(shape, dtype):
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    n = dtype.itemsize
    for d in shape:
        n *= d
    return shape, dtype, n


def _registered(raw: np.ndarray) -> np.ndarray:
    """raw, known to `whole` as a buffer of this module."""
    _buffers[id(raw)] = raw
    return raw


def _aligned(raw, n: int, shape, dtype) -> np.ndarray:
    """The array of `shape` in `raw` from its first multiple of ALIGN bytes."""
    off = -raw.__array_interface__["data"][0] % ALIGN
    return raw[off:off + n].view(dtype).reshape(shape)


def _prime() -> None:
    """Once per process: a block of PRIME bytes from numpy, freed at once (see the module's
    docstring: glibc's mmap threshold then rises to its size, as after any such free)."""
    with _lock:
        if _primed[0]:
            return
        _primed[0] = True
    np.empty(PRIME, np.uint8)


def _mapped(nbytes: int) -> np.ndarray:
    """nbytes of memory of their own (an anonymous mapping, page-aligned), as a byte array;
    the mapping goes when the last array viewing it does."""
    m = mmap.mmap(-1, nbytes)
    if nbytes >= 2 << 20 and hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)       # (transparent huge pages where the system allows)
    return np.frombuffer(m, np.uint8)


def _recycled(nbytes: int) -> np.ndarray:
    """A kept buffer of `nbytes` that no array refers to (moved to the end of the list), else
    a new one, kept from now on (the oldest forgotten past KEEP bytes)."""
    if not _primed[0]:
        _prime()
    with _lock:
        for k in range(len(_kept)):
            if _kept[k].nbytes == nbytes and _refs(_kept, k) == _IDLE:
                raw = _kept.pop(k)
                _kept.append(raw)
                return raw
    raw = _registered(_mapped(nbytes))
    with _lock:
        _kept.append(raw)
        _held[0] += raw.nbytes
        while _held[0] > KEEP and len(_kept) > 1:
            _held[0] -= _kept.pop(0).nbytes
    return raw


def forget() -> None:
    """Drop every kept buffer (tullio_py.clear_cache)."""
    with _lock:
        _kept.clear()
        _held[0] = 0


def _after_fork() -> None:
    """In a child forked while another thread held the lock: a fresh lock and no kept
    buffers (the parent's memory, copied on write)."""
    global _lock
    _lock = threading.Lock()
    forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def whole(a) -> bool:
    """Whether `a` owns all its memory: a numpy array that owns its data, or an array that
    `empty` returned (the one view of its whole buffer that starts at the aligned element
    and covers the data)."""
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        return False
    if a.base is None:
        return a.flags.owndata
    raw = a.base
    if _buffers.get(id(raw)) is not raw:
        return False
    start = raw.__array_interface__["data"][0]
    here = a.__array_interface__["data"][0]
    return here == start + (-start % ALIGN) and a.nbytes + ALIGN == raw.nbytes
