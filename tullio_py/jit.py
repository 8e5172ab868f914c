"""Source -> callable.  With intrinsics.py and threads.py (numba's threading layer and the
thread count of a parallel call, re-exported here), the only modules that import numba, and
only when a kernel is loaded.

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
from dataclasses import replace

import numpy as np

from . import cache, memo, vecmath
from .codegen import Source
# numba's threading layer and the thread count of a parallel call (re-exported for callers)
from .threads import (defer_blas_check, numba_module, asked, budgets, call, max_threads,  # noqa: F401
                      pool, serial_maker, set_threads, thread_budget, threading_layer)

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
    if "_nthreads()" in source.text:    # (the threads of this call: numba's count)
        imports += ("_nthreads = lambda: 1\n" if target == "python" else
                    "from tullio_py.intrinsics import call_threads as _nthreads\n")
    if "_wide_vectors()" in source.text:
        imports += ("_wide_vectors = lambda: None\n" if target == "python" else
                    "from tullio_py.intrinsics import wide_vectors as _wide_vectors\n")
    return _HEADERS[target] + imports + source.text


def _keyed_text(source: Source, target: str, signature: str) -> str:
    numba = numba_module(False)
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
        numba = numba_module(source.parallel)
        module = cache.load_module(text)
        if module is not None:
            namespace = module.__dict__
        else:
            defer_blas_check()             # compiled now, not loaded
            namespace = {"__name__": "tullio_py_generated"}
            exec(compile(text, "<tullio_py kernel>", "exec"), namespace)
        flags = set(source.fastmath) if isinstance(source.fastmath, tuple) else source.fastmath
        fn = numba.njit(parallel=source.parallel, fastmath=flags,
                        cache=module is not None, **_options(source))(namespace[source.name])
        if module is not None:
            _load_without_registries(fn)
        if source.parallel:
            serial_maker(fn, lambda: load(replace(source, parallel=False), target, signature))
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
        defer_blas_check()
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
        numba = numba_module(False)
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


# ----------------------------------------------------------------------------- target "cuda"
# (frontends/cuda.py compiles this text with numba-cuda)
_CUDA_HEADER = "import math\nimport cmath\nimport numpy as _np\nfrom numba import cuda\n"


def cuda_module_text(source) -> str:
    return _CUDA_HEADER + source.text
