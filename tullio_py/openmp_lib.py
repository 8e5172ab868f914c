"""Joining the OpenMP runtime the process has already loaded (jit.py chooses the layer).

torch's CPU wheels run their intra-op pool on GNU OpenMP (their own libgomp), loaded into the
process's global symbol scope when torch is imported.  numba's "omp" threading layer
(omppool) is linked against libgomp too, and the dynamic loader binds a library's undefined
symbols to the global scope before the library's own dependencies: imported after torch,
omppool's `GOMP_parallel` is torch's.  Then tullio_py's parallel kernels run on the very
threads of torch's pool instead of on a second pool whose threads compete for the cores with
torch's workers, which spin for a while after every torch op (libgomp's default wait policy).
Measured (`exp` over 4096x512 float32 right after a `torch.mul`, 2 threads, idle 2-CPU
machine): 0.92-1.00 ms on numba's TBB pool, 0.67-0.71 ms on torch's pool, 0.88 ms on one
thread.

Starting numba's omp pool sets two of the runtime's per-thread settings for the calling
thread (`omp_set_num_threads(NUMBA_NUM_THREADS)`, `omp_set_nested(1)`), which would change
torch's thread count (torch.get_num_threads() is omp_get_max_threads()); `keep` puts both back.
"""
from __future__ import annotations

import sys

_SYMBOLS = ("GOMP_parallel", "omp_get_max_threads", "omp_set_num_threads",
            "omp_get_max_active_levels", "omp_set_max_active_levels")


def loaded():
    """The process's global symbol scope as a ctypes library when it already resolves an
    OpenMP runtime (GOMP_parallel and the settings `keep` restores), else None.  Linux only:
    the binding rule above is ELF's."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        scope = ctypes.CDLL(None)
        for name in _SYMBOLS:
            getattr(scope, name)
    except (OSError, AttributeError):
        return None
    return scope


class keep:
    """`with keep(scope):` the calling thread's OpenMP thread count and nesting depth are
    the same after the block as before it (scope None: no runtime, nothing to keep)."""
    __slots__ = ("scope", "threads", "levels")

    def __init__(self, scope):
        self.scope = scope

    def __enter__(self):
        if self.scope is not None:
            self.threads = self.scope.omp_get_max_threads()
            self.levels = self.scope.omp_get_max_active_levels()

    def __exit__(self, *exc):
        if self.scope is not None:
            self.scope.omp_set_num_threads(self.threads)
            self.scope.omp_set_max_active_levels(self.levels)
