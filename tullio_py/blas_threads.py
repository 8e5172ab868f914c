"""Threads for blas_shift.py's loop over a batch index: its steps split over a few Python
threads, each calling single-threaded gemms (numpy releases the GIL in matmul, copies and
adds), instead of one thread calling gemms that OpenBLAS splits over its own threads.

Many mid-sized gemms (64 x 320 x 256, one per batch element) gain little from OpenBLAS's
threads, whose workers spin between calls and fight other thread pools (torch's OpenMP
threads, numba's) for the cores: on a loaded 2-core machine a conv1d forward ran 5-10x slower
on 2 threads than on 1.  Python threads wait on a lock instead of spinning.

The gemms run single-threaded through OpenBLAS's `openblas_set_num_threads_local` (OpenBLAS
0.3.27+), called through ctypes in the library numpy loaded; where numpy uses another BLAS or
an OpenBLAS without it, `available()` is False and blas_shift keeps one thread of steps.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

_NAMES = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_",
          "scipy_openblas_set_num_threads_local_64_")
_set_local = None       # the ctypes function, False when absent, None before the first look
_pool = None            # (pid, ThreadPoolExecutor, workers)
_lock = threading.Lock()


def _find():
    """OpenBLAS's set-threads-for-this-thread function in a library loaded by numpy."""
    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "openblas" in parts[-1].rsplit("/", 1)[-1].lower():
                    paths.add(parts[-1])
    except OSError:
        return False
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        except (OSError, AttributeError):
            continue
        for name in _NAMES:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                return fn
    return False


def available() -> bool:
    """Whether gemms can be made single-threaded in the calling thread."""
    global _set_local
    if _set_local is None:
        import numpy  # noqa: F401  (its BLAS must be loaded before looking)
        _set_local = _find()
    return bool(_set_local)


def single(f, *args):
    """f(*args) with this thread's gemms on one thread (OpenBLAS's own setting restored)."""
    old = _set_local(1)
    try:
        return f(*args)
    finally:
        _set_local(old)


@contextlib.contextmanager
def gemm_threads(n: int):
    """numpy's gemms on n threads inside the block, OpenBLAS's setting restored after; where it
    cannot be set (`available()` False) BLAS keeps its own count."""
    if not available():
        yield
        return
    old = _set_local(n)
    try:
        yield
    finally:
        _set_local(old)


def _in_worker(f):
    """f() on a pool thread: its gemms on one thread.  Nothing is restored: a pool thread
    only ever runs these steps, and where the setting is process-wide a worker's restore
    would lift it while another worker's gemm runs."""
    _set_local(1)
    return f()


def run(tasks: list, threads: int | None = None):
    """Run the zero-argument callables `tasks` on `threads` threads (default: one each), every
    one with single-threaded gemms; their results, in order.  Each thread runs a contiguous
    run of the tasks in order, the first run on this thread and the others on the pool.

    OpenBLAS 0.3.31's `openblas_set_num_threads_local` is process-wide where numpy's build
    has it (set on one thread, every thread reads it): the calling thread sets one gemm thread
    for the whole run and restores the old count once every worker has finished.  When each
    worker set and restored it, a worker's restore could hand another worker's gemm to
    OpenBLAS's threads, which round differently (dW of a conv1d differed in the last bits
    between calls in about one run in three)."""
    n = len(tasks) if threads is None else max(1, min(threads, len(tasks)))
    cut = [len(tasks) * k // n for k in range(n + 1)]
    runs = [lambda a=a, b=b: [t() for t in tasks[a:b]] for a, b in zip(cut, cut[1:])]
    pool = _executor(n - 1) if n > 1 else None
    old = _set_local(1)
    futures = []
    try:
        futures = [pool.submit(_in_worker, r) for r in runs[1:]]
        first = runs[0]()
        return first + [x for f in futures for x in f.result()]
    finally:
        wait(futures)
        _set_local(old)


def _executor(n: int) -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[2] < n:
            # a forked child inherits the executor but not its threads: a new one
            if _pool is not None and _pool[0] == os.getpid():
                _pool[1].shutdown(wait=False)
            _pool = (os.getpid(), ThreadPoolExecutor(max(n, 1), "tullio_py-blas"), max(n, 1))
        return _pool[1]
