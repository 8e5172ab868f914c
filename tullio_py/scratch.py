"""Reused memory for the big arrays a caller never sees: a chain's temporaries and the
cotangents of its temporaries (chain.py, chain_grad.py).

A fresh multi-megabyte numpy array costs more than the arithmetic of a bandwidth-bound chain:
glibc gives a freed heap top back to the system (past its trim threshold) and the next call
faults every page in again, and numpy asks for transparent huge pages on arrays of 4 MB and
more (softmax 4096x512 float32, numpy inputs, one thread: 1.2 ms on arrays reused, 3.5 ms on
arrays allocated fresh each call).  So the arrays that no caller can reach -- a softmax's
`e`, the vjp's `de` -- come from `pool` and go back to it when the call that took them ends
(`give`), or, for temporaries that a torch autograd node keeps for its backward, when the node
is freed (`Lease`: weakref.finalize on an object the node holds, so a graph kept with
retain_graph=True keeps them through every backward).

An array is handed out to one taker at a time: `empty` removes it from the pool, and only
arrays that own their memory are taken back (never a view of a caller's array).  Arrays
handed to a caller (a chain's result, `Chain.run`'s arrays, gradients) never come from here.
The pool is one per process, behind a lock (any Python thread may take, and a graph may be
freed on another thread than the one that built it), and holds at most `limit` bytes of idle
arrays: past it the arrays given back longest ago are dropped (freed by numpy as usual).
Arrays under `min_bytes` are not pooled (malloc reuses small blocks cheaply).
`tullio_py.clear_cache()` empties it.
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from . import memory

LIMIT = 64 << 20            # bytes of idle arrays the pool holds at most
MIN_BYTES = 1 << 16         # smaller arrays are allocated as usual


class Pool:
    """Idle arrays by (shape, dtype), at most `limit` bytes of them, oldest dropped first."""

    def __init__(self, limit: int = LIMIT, min_bytes: int = MIN_BYTES):
        self.limit, self.min_bytes = limit, min_bytes
        self._lock = threading.Lock()
        self._idle: list = []           # (key, array), given back longest ago first
        self.held = 0                   # bytes of the idle arrays

    def empty(self, shape, dtype) -> np.ndarray:
        """An unfilled C-contiguous array: an idle one of this shape and dtype, else new."""
        shape, dtype = tuple(shape), np.dtype(dtype)
        key = (shape, dtype.str)
        with self._lock:
            for k in range(len(self._idle) - 1, -1, -1):
                if self._idle[k][0] == key:
                    a = self._idle.pop(k)[1]
                    self.held -= a.nbytes
                    return a
        return memory.empty(shape, dtype)

    def give(self, arrays) -> None:
        """Take back arrays whose last user is done with them (arrays that do not own their
        memory, small ones and ones already idle are left alone)."""
        for a in arrays:
            if (not memory.whole(a) or a.nbytes < self.min_bytes
                    or a.nbytes > self.limit):
                continue
            with self._lock:
                if any(b is a for _, b in self._idle):
                    continue
                while self._idle and self.held + a.nbytes > self.limit:
                    self.held -= self._idle.pop(0)[1].nbytes
                self._idle.append(((a.shape, a.dtype.str), a))
                self.held += a.nbytes

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()
            self.held = 0

    def after_fork(self) -> None:
        """In a child forked while another thread held the lock: a fresh lock, and no idle
        arrays (they are the parent's memory, copied on write)."""
        self._lock = threading.Lock()
        self.clear()

    def idle(self) -> list:
        """The idle arrays (for tests and inspection)."""
        with self._lock:
            return [a for _, a in self._idle]


class Lease:
    """Gives `arrays` back to `pool` when this object is garbage-collected (an autograd
    node's context holds it beside the arrays it keeps for the backward)."""
    __slots__ = ("__weakref__",)

    def __init__(self, pool: Pool, arrays):
        weakref.finalize(self, pool.give, list(arrays)).atexit = False


pool = Pool()       # the process's pool (chain.py, chain_grad.py)

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=pool.after_fork)
