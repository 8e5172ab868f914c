"""numba's threading layer, chosen once per process, and the thread count each parallel kernel
call runs on (jit.py loads the kernels; this module starts numba's pool and calls them).
With jit.py and intrinsics.py, the only modules that import numba."""
from __future__ import annotations

import os
import sys
import threading

from . import cpu_load, memo, openmp_lib, tbb_lib

# The threading layer (numba's thread pool) is chosen once per process, before numba starts
# its pool, the first time a parallel kernel is loaded:
# - "omp" when the process already has an OpenMP runtime in its global symbol scope (torch's,
#   once torch is imported): numba's omp layer then runs on that runtime's threads, one pool
#   with torch's instead of two competing for the cores (openmp_lib.py).  GNU OpenMP kills a
#   forked child that enters its pool, so such children run serial copies (below).
# - else "tbb" when the TBB library loads (tbb_lib.py: the `tbb` wheel's, by its path): safe from
#   many Python threads at once and in forked children.
# - otherwise "workqueue" (fork-safe), with a lock so that two Python threads never run a
#   parallel kernel at once (workqueue aborts the process on concurrent use).
# A layer chosen by the user (NUMBA_THREADING_LAYER, numba.config.THREADING_LAYER set before the
# first kernel, or a pool numba had already started) is kept.  Then "workqueue" gets the same
# lock, and GNU OpenMP ("omp" on Linux), which kills a forked child that enters its pool, is
# avoided in such children: their parallel kernels run as serial compilations of the same code.
_SERIAL = memo.Memo("jit.serial", 256)      # parallel dispatcher -> its serial compilation
_MAKERS = memo.Memo("threads.serial_makers", 1024)   # parallel dispatcher -> serial_maker's make
_CHOOSING = threading.Lock()
_layer: str | None = None   # the layer in use, once chosen
_joined = False             # "omp" on the OpenMP runtime already loaded (torch's)
_lock = None                # "workqueue": held while a parallel kernel runs
_serial_only = False        # a forked child of a GNU OpenMP process
_set = None                 # numba.set_num_threads, once the layer is chosen
_max = 0                    # numba's thread count, once the layer is chosen
budgets = threading.local()   # .n: thread_budget of this Python thread
# "omp": every Python thread that enters a parallel kernel brings a team of its own (TBB's
# callers share one pool), so callers inside a kernel at once split the CPUs between them:
# with 2 dask threads on 2 CPUs each 2-thread team oversubscribed the cores (an exp over
# 8 blocks of 1024x512: 28 ms against 21 ms on TBB's shared pool).
_inside = 0
_INSIDE = threading.Lock()


def numba_module(parallel: bool = True):
    """numba, with the threading layer chosen and the pool started (once per process) unless
    only serial code is wanted (which never starts the pool: a serial kernel's load skips it)."""
    if parallel and _layer is None:
        _choose_layer()
    import numba
    return numba


def _choose_layer():
    global _layer, _lock, _set, _max, _joined
    with _CHOOSING:
        if _layer is not None:
            return
        import numba
        try:
            layer = numba.threading_layer()          # numba's pool already runs: keep it
        except ValueError:
            chosen = "NUMBA_THREADING_LAYER" in os.environ \
                or str(numba.config.THREADING_LAYER).lower() != "default"
            scope = openmp_lib.loaded()
            if not chosen:
                if scope is not None and _omppool_loads():
                    numba.config.THREADING_LAYER = "omp"     # join torch's pool
                else:
                    scope = None
                    numba.config.THREADING_LAYER = "tbb" if _load_tbb() else "workqueue"
            else:
                _load_tbb()             # for a user's "tbb" (or "safe"/"threadsafe")
            with openmp_lib.keep(scope):
                numba.get_num_threads()              # starts the pool on the chosen layer
            layer = numba.threading_layer()
            _joined = layer == "omp" and scope is not None
        if layer == "workqueue":
            _lock = threading.RLock()
        _set, _max = _setter(numba), numba.config.NUMBA_NUM_THREADS
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _layer = layer


def _setter(numba):
    """numba's per-thread thread count setter: the pool's own C function where numba exposes
    it (numba.set_num_threads checks its argument in Python first, about 3 us a call, twice
    per parallel call; set_threads passes only counts from 1 to NUMBA_NUM_THREADS)."""
    from numba.np.ufunc import parallel
    raw = getattr(parallel, "_set_num_threads", None)
    return raw if callable(raw) else numba.set_num_threads


def defer_blas_check():
    """numba.np.arraymath checks on import whether scipy's BLAS loads (importing scipy.linalg:
    about 0.15 s of a new process's first call) for np.correlate/np.convolve, which no kernel
    calls: imported here with a check that only finds scipy.linalg (numba.np.linalg still
    imports scipy's BLAS before compiling a function that calls it).  Called before anything
    jit.py compiles (numba's registries import arraymath then), not before a disk load."""
    if "numba.np.arraymath" not in sys.modules:
        import importlib.util
        from numba.np import linalg
        check = getattr(linalg, "ensure_blas", None)
        if check is None:            # a numba without this check: nothing to defer
            return
        linalg.ensure_blas = lambda: importlib.util.find_spec("scipy.linalg") or check()
        try:
            from numba.np import arraymath
            arraymath.ensure_blas = check
        finally:
            linalg.ensure_blas = check


def _load_tbb() -> bool:
    """Whether numba's TBB layer can load (tbb_lib.load: the library, 2021.6 or later)."""
    if not tbb_lib.load():
        return False
    try:
        from numba.np.ufunc import tbbpool  # noqa: F401  (its dependency resolves now)
    except (ImportError, OSError):
        return False
    return True


def _omppool_loads() -> bool:
    """Whether numba's omp layer extension loads (it needs a libgomp.so.1.0.0 of its own to
    resolve its dependency, even where its symbols then bind to an earlier runtime)."""
    try:
        from numba.np.ufunc import omppool  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def _after_fork_in_child():
    global _lock, _serial_only
    if _lock is not None:
        _lock = threading.RLock()        # a lock held by a thread the child does not have
    if _layer == "omp":
        from numba.np.ufunc import omppool
        _serial_only = getattr(omppool, "openmp_vendor", "GNU") == "GNU"


_NAMES = {"tbb": "TBB"}


def pool() -> str:
    """The thread pool parallel kernels run on, in words (Kernel.explain prints it)."""
    numba_module()
    if _layer == "omp":
        return "on torch's OpenMP pool" if _joined else "on numba's OpenMP pool"
    return f"on numba's {_NAMES.get(_layer, _layer)} pool"


def threading_layer() -> str:
    """The numba threading layer parallel kernels run on ("tbb", "omp" or "workqueue")."""
    numba_module()
    return _layer


class thread_budget:
    """`with thread_budget(n, pool):` parallel kernels called from this Python thread use at
    most n threads (None: no limit beyond the kernel's `threads` option); `pool` workers of
    the caller's own pool (torch's) are not counted as other threads (cpu_load.py)."""
    __slots__ = ("n", "pool", "old")

    def __init__(self, n: int | None, pool: int = 0):
        self.n, self.pool = n, pool

    def __enter__(self):
        self.old = (getattr(budgets, "n", None), getattr(budgets, "pool", 0))
        budgets.n, budgets.pool = self.n, self.pool

    def __exit__(self, *exc):
        budgets.n, budgets.pool = self.old


def asked(n: int | None) -> int | None:
    """The thread count a call may use: `n` where given, else this Python thread's budget
    (thread_budget; torch's intra-op count under the torch frontend), else None (numba's)."""
    return getattr(budgets, "n", None) if n is None else n


def call(fn, args, parallel: bool, n: int | None):
    """fn(*args); when fn was compiled parallel, on n threads (None: numba's setting), at most
    the thread budget of this Python thread and the CPUs left free (cpu_load.py)."""
    if not parallel:
        fn(*args)
        return
    if _serial_only:
        _serial(fn)(*args)
        return
    budget = getattr(budgets, "n", None)
    if budget is not None:
        n = min(n or budget, budget)
    m = cpu_load.machine.limit(n or _max, getattr(budgets, "pool", 0))   # fewer under load
    n = m if m < (n or _max) else n
    if _layer == "omp":
        _call_sharing(fn, args, n)
        return
    lock = _lock
    if lock is not None:
        lock.acquire()
    try:
        _run(fn, args, n)
    finally:
        if lock is not None:
            lock.release()


def _call_sharing(fn, args, n: int | None):
    """fn(*args) on n threads, at most this caller's share of the CPUs among the Python threads
    inside a parallel kernel now ("omp": each brings a team of its own)."""
    global _inside
    with _INSIDE:
        _inside += 1
        share = max(1, _max // _inside)
    try:
        _run(fn, args, n if share >= _max else min(n or _max, share))
    finally:
        with _INSIDE:
            _inside -= 1


def _run(fn, args, n: int | None):
    """fn(*args) on n threads (None: numba's own setting, untouched), then tells cpu_load."""
    if n is None:
        fn(*args)
    else:
        set_threads(max(1, n))          # (set_threads caps it at _max)
        try:
            fn(*args)
        finally:
            set_threads(None)
    cpu_load.machine.ran(min(n or _max, _max))


def set_threads(n: int | None):
    """numba's thread count for parallel kernels this Python thread calls next (None: all)."""
    if _set is None:
        numba_module()
    _set(max(1, min(n or _max, _max)))


def serial_maker(fn, make):
    """How a forked child of a GNU OpenMP process gets parallel function fn's serial copy:
    `make()` (jit.load of the same source with parallel=False: a kernel of its own in the disk
    cache, so only the first child that calls it compiles it)."""
    _MAKERS[fn] = make


def _serial(fn):
    s = _SERIAL.get(fn)
    if s is None:
        make = _MAKERS.get(fn)
        if make is not None:
            s = make()
        else:
            import numba
            options = {**fn.targetoptions, "parallel": False}     # the same flags, serial
            options.pop("nopython", None)
            defer_blas_check()
            s = numba.njit(**options)(fn.py_func)
        _SERIAL[fn] = s
    return s


def max_threads() -> int:
    """numba's thread count (NUMBA_NUM_THREADS, or the number of CPUs)."""
    if _max:
        return _max
    import numba
    return numba.config.NUMBA_NUM_THREADS
