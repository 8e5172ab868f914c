"""Source -> callable.  With intrinsics.py, the only module that imports numba, and only when a
kernel is loaded.
It also chooses numba's threading layer and runs parallel kernels on a thread count (below).

Target "cpu": the generated module is written to the disk cache (cache.py) and compiled with
`numba.njit(cache=True)`, so a later process loads the machine code instead of compiling.  The
module text starts with a header naming everything the compiled code depends on beyond the
source itself (tullio_py, numba and Python versions, numba options, the argument types); the
file name is the hash of the whole text, so the cache key covers all of it.  With the disk
cache disabled the source is executed in memory and compiled without caching.

Target "python" executes the generated source as plain Python (range for prange): slow, but
it is the same code, useful for debugging and as a cross-check of the compiled kernels.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

from . import cache, cpu_load, memo, openmp_lib, tbb_lib, vecmath
from .codegen import Source

_ND = np.ndarray

_HEADERS = {
    "cpu": "import numpy as _np\nfrom numba import prange as _prange\n",
    "python": "import numpy as _np\n_prange = range\n",
}
# module text -> compiled function; a dropped function's counts stay in `stats`
_LOADED = memo.Memo("jit.loaded", 1024, on_drop=lambda fn: stats.retire(fn))
_NUMBA_OPTIONS = dict(error_model="numpy")


def module_text(source: Source, target: str) -> str:
    """The module of `source`: the header, the vector math functions it calls (vecmath.py,
    compiled by `vector_function`; numpy's ufunc of the same name in plain Python), then the
    function."""
    used = [n for n in vecmath.FUNCTIONS if f"_vm_{n}(" in source.text]
    if target == "python":
        imports = "".join(f"_vm_{n} = _np.{n.split('_')[0]}\n" for n in used)
    else:
        imports = "".join(f"from tullio_py.jit import vm_{n} as _vm_{n}\n" for n in used)
    if "_wide_vectors()" in source.text:
        imports += ("_wide_vectors = lambda: None\n" if target == "python" else
                    "from tullio_py.intrinsics import wide_vectors as _wide_vectors\n")
    return _HEADERS[target] + imports + source.text


def _keyed_text(source: Source, target: str, signature: str) -> str:
    numba = _numba(False)
    from .version import __version__
    head = (f"# tullio_py {__version__} kernel for numba {numba.__version__}, python "
            f"{sys.version_info[0]}.{sys.version_info[1]}; target {target}; parallel="
            f"{source.parallel}, fastmath={source.fastmath}, {_options(source)}\n"
            f"# vector math: {_vecmath_hash()}\n"
            f"# arguments: {signature or 'any'}\n")
    return head + module_text(source, target)


def _options(source: Source) -> dict:
    """numba's options.  A serial kernel that allocates nothing runs without numba's runtime
    (NRT): its entry point then takes an array without a heap record of its own per call."""
    return (_NUMBA_OPTIONS if source.parallel or source.allocates
            else {**_NUMBA_OPTIONS, "_nrt": False})


def load(source: Source, target: str, signature: str = ""):
    """The compiled (or plain Python) function for `source` on `target`, cached in memory and,
    for "cpu", on disk.  `signature` describes the argument types (dtypes, ranks, layouts) the
    caller will pass, as stable text (signature.CompileKey.arguments): it is part of the disk
    key, so each specialisation has its own file."""
    if target == "python":
        text = module_text(source, target)
        fn = _LOADED.get(text)
        if fn is None:
            namespace: dict = {"__name__": "tullio_py_generated"}
            exec(compile(text, "<tullio_py kernel>", "exec"), namespace)
            fn = _LOADED[text] = namespace[source.name]
        return fn
    text = _keyed_text(source, target, signature)
    fn = _LOADED.get(text)
    if fn is None:
        numba = _numba(source.parallel)
        module = cache.load_module(text)
        if module is not None:
            namespace = module.__dict__
        else:
            _defer_blas_check()             # compiled now, not loaded
            namespace = {"__name__": "tullio_py_generated"}
            exec(compile(text, "<tullio_py kernel>", "exec"), namespace)
        flags = set(source.fastmath) if isinstance(source.fastmath, tuple) else source.fastmath
        fn = numba.njit(parallel=source.parallel, fastmath=flags,
                        cache=module is not None, **_options(source))(namespace[source.name])
        if module is not None:
            _load_without_registries(fn)
        _LOADED[text] = fn
    return fn


def _load_without_registries(fn):
    """Make `fn`'s disk-cache load skip numba's registries.  numba refreshes its typing and
    lowering registries before it looks in its cache (importing most of numba's
    implementation modules: the larger part of a new process's first call), but machine code
    read from disk needs only numba's runtime (NRT) symbols (none, compiled without it:
    jit._options, then NRT is not set up, a fifth of that call); numba's C helpers are installed
    with its target context, and a parallel kernel's own reload hook starts the thread pool.
    A miss compiles as before (numba's compiler refreshes the registries itself), and only
    then are numba's extension entry points (third-party types, read from every installed
    package's metadata) initialised: a kernel's arguments are numpy arrays and scalars."""
    cache_ = getattr(fn, "_cache", None)
    load = getattr(cache_, "_load_overload", None)
    guard = getattr(cache_, "_guard_against_spurious_io_errors", None)
    if load is None or guard is None or not hasattr(fn, "_compilation_chain_init_hook"):
        return                              # another numba: its own load

    nrt = fn.targetoptions.get("_nrt", True)

    def load_overload(sig, target_context):
        if nrt:
            from numba.core.runtime import rtsys
            rtsys.initialize(target_context)
        with guard():
            cres = load(sig, target_context)
            if cres is not None:
                return cres
        from numba.core import entrypoints
        entrypoints.init_all()              # numba compiles next
        _defer_blas_check()
        return None

    cache_.load_overload = load_overload
    fn._compilation_chain_init_hook = _no_entry_points
    _type_arrays_directly(fn)


def _type_arrays_directly(fn):
    """numba types an argument it has not seen in Python (typeof_pyval), asking first whether an
    array is a numpy.ma.MaskedArray, which imports numpy.ma (a tenth of a new process's first
    call).  An exact numpy.ndarray is none: it gets numba's type for it (dtype, rank, layout,
    read-only) without the question; anything else goes to numba's typeof."""
    original = getattr(fn, "typeof_pyval", None)
    active = getattr(fn, "_types_active_call", None)
    if original is None or not isinstance(active, set):
        return
    from numba.core import types
    from numba.np import numpy_support

    def typeof_pyval(val):
        if val.__class__ is not _ND:
            return original(val)
        try:
            tp = types.Array(numpy_support.from_dtype(val.dtype), val.ndim,
                             numpy_support.map_layout(val), readonly=not val.flags.writeable)
        except Exception:           # a dtype numba does not take: its own answer
            return original(val)
        active.add(tp)
        return tp

    fn.typeof_pyval = typeof_pyval


def _no_entry_points():
    """A cached kernel's first call: entry points wait for a compile (load_overload)."""


def entry_point(fn, args):
    """The machine code `fn(*args)` runs after numba's type dispatch (the overload for exactly
    these arguments' types), or None.  Calling it skips the dispatch: later arguments must have
    the same numba types (dtype, rank, layout, alignment; an int parameter's range)."""
    try:
        return fn.overloads[tuple(map(fn.typeof_pyval, args))].entry_point
    except Exception:           # plain Python, no such overload, or a value numba cannot type
        return None


# ----------------------------------------------------------------------------- vector math
# Kernels import vecmath's functions compiled here (`from tullio_py.jit import vm_exp_f32`),
# each its own numba function with its own (strict) floating-point flags whatever the kernel's
# fastmath (numba would otherwise compile it with the flags of the first kernel that calls
# it), which LLVM inlines into the kernel's loops, which then vectorise.  Disk
# cached kernels contain its machine code, so the kernel header names a hash of vecmath.py.
_VM: dict = {}
_VM_LOCK = threading.Lock()


def __getattr__(name: str):
    if name.startswith("vm_") and name[3:] in vecmath.FUNCTIONS:
        return vector_function(name[3:])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def vector_function(name: str):
    """The compiled vecmath function `name` (vecmath.FUNCTIONS)."""
    fn = _VM.get(name)
    if fn is None:
        numba = _numba(False)
        with _VM_LOCK:                          # the overloads are registered once
            if not _VM:
                from . import intrinsics
                intrinsics.register(scalef=vector_bytes() == 64)
            fn = _VM.get(name)
            if fn is None:
                fn = _VM[name] = numba.njit(error_model="numpy",
                                            fastmath=False)(vecmath.FUNCTIONS[name])
    return fn


_VECTOR_BYTES: list = []


def vector_bytes() -> int:
    """Bytes of the widest vector registers compiled kernels can use: 64 where numba compiles
    for AVX-512 (which has 32 of them), else 32 (schedule.jam_choice sizes its tiles by it)."""
    if not _VECTOR_BYTES:
        from llvmlite import binding
        from numba.core import config
        features = config.CPU_FEATURES
        if features is None:        # (numba's own choices: a named CPU, AVX switched off)
            features = (binding.get_host_cpu_features().flatten()
                        if config.CPU_NAME is None and config.ENABLE_AVX else "")
        _VECTOR_BYTES.append(64 if "+avx512f" in features.split(",") else 32)
    return _VECTOR_BYTES[0]


_VECMATH_HASH: list = []


def _vecmath_hash() -> str:
    if not _VECMATH_HASH:
        import hashlib
        h = hashlib.sha256()
        for name in ("vecmath.py", "intrinsics.py"):      # intrinsics.py: read, not imported
            with open(os.path.join(os.path.dirname(vecmath.__file__), name), "rb") as f:
                h.update(f.read())
        _VECMATH_HASH.append(h.hexdigest()[:16])
    return _VECMATH_HASH[0]


stats = cache.CompileStats(_LOADED)   # numba's counters over the loaded kernels + cache.stats


# ----------------------------------------------------------------------------- threads
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
_CHOOSING = threading.Lock()
_layer: str | None = None   # the layer in use, once chosen
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


def _numba(parallel: bool = True):
    """numba, with the threading layer chosen and the pool started (once per process) unless
    only serial code is wanted (which never starts the pool: a serial kernel's load skips it)."""
    if parallel and _layer is None:
        _choose_layer()
    import numba
    return numba


def _choose_layer():
    global _layer, _lock, _set, _max
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
        if layer == "workqueue":
            _lock = threading.RLock()
        _set, _max = numba.set_num_threads, numba.config.NUMBA_NUM_THREADS
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _layer = layer


def _defer_blas_check():
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


def threading_layer() -> str:
    """The numba threading layer parallel kernels run on ("tbb", "omp" or "workqueue")."""
    _numba()
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
        if n is None:
            fn(*args)
        else:
            set_threads(max(1, min(n, _max)))
            try:
                fn(*args)
            finally:
                set_threads(None)
    finally:
        if lock is not None:
            lock.release()
    cpu_load.machine.ran(min(n or _max, _max))


def _call_sharing(fn, args, n: int | None):
    """fn(*args) on n threads, at most this caller's share of the CPUs among the Python threads
    inside a parallel kernel now ("omp": each brings a team of its own)."""
    global _inside
    with _INSIDE:
        _inside += 1
        share = max(1, _max // _inside)
    try:
        n = min(n or _max, share, _max)
        set_threads(n)
        try:
            fn(*args)
        finally:
            set_threads(None)
    finally:
        with _INSIDE:
            _inside -= 1
    cpu_load.machine.ran(n)


def set_threads(n: int | None):
    """numba's thread count for parallel kernels this Python thread calls next (None: all)."""
    if _set is None:
        _numba()
    _set(n or _max)


def _serial(fn):
    s = _SERIAL.get(fn)
    if s is None:
        import numba
        options = {**fn.targetoptions, "parallel": False}     # the same flags, serial
        options.pop("nopython", None)
        _defer_blas_check()
        s = _SERIAL[fn] = numba.njit(**options)(fn.py_func)
    return s


def max_threads() -> int:
    """numba's thread count (NUMBA_NUM_THREADS, or the number of CPUs)."""
    if _max:
        return _max
    import numba
    return numba.config.NUMBA_NUM_THREADS

# ----------------------------------------------------------------------------- target "cuda"
# (frontends/cuda.py compiles this text with numba-cuda)
_CUDA_HEADER = "import math\nimport cmath\nimport numpy as _np\nfrom numba import cuda\n"


def cuda_module_text(source) -> str:
    return _CUDA_HEADER + source.text
