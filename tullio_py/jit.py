"""Source -> callable.  The only module that imports numba, and only when a kernel is loaded.

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

import sys

from . import cache, memo
from .codegen import Source

_HEADERS = {
    "cpu": "import numpy as _np\nfrom numba import prange as _prange\n",
    "python": "import numpy as _np\n_prange = range\n",
}
_LOADED = memo.Memo("jit.loaded", 1024)     # module text -> compiled function
_NUMBA_OPTIONS = dict(error_model="numpy")


def module_text(source: Source, target: str) -> str:
    return _HEADERS[target] + source.text


def _keyed_text(source: Source, target: str, signature: str) -> str:
    import numba
    from . import __version__
    head = (f"# tullio_py {__version__} kernel for numba {numba.__version__}, python "
            f"{sys.version_info[0]}.{sys.version_info[1]}; target {target}; parallel="
            f"{source.parallel}, fastmath={source.fastmath}, {_NUMBA_OPTIONS}\n"
            f"# arguments: {signature or 'any'}\n")
    return head + module_text(source, target)


def load(source: Source, target: str, signature: str = ""):
    """The compiled (or plain Python) function for `source` on `target`, cached in memory and,
    for "cpu", on disk.  `signature` describes the argument types (dtypes, ranks, layouts) the
    caller will pass: it is part of the disk key, so each specialisation has its own file."""
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
        import numba
        module = cache.load_module(text)
        if module is not None:
            namespace = module.__dict__
        else:
            namespace = {"__name__": "tullio_py_generated"}
            exec(compile(text, "<tullio_py kernel>", "exec"), namespace)
        flags = set(source.fastmath) if isinstance(source.fastmath, tuple) else source.fastmath
        fn = numba.njit(parallel=source.parallel, fastmath=flags,
                        cache=module is not None, **_NUMBA_OPTIONS)(namespace[source.name])
        _LOADED[text] = fn
    return fn


class _Stats:
    """Counters for this process.  `compiles`: specialisations numba compiled; `disk_hits`:
    specialisations loaded from numba's disk cache instead; the rest comes from cache.stats
    (module files written / reused / rebuilt, pickles, pruning) and `log` lists file events."""

    def _numba_counts(self):
        hits = misses = 0
        for fn in list(_LOADED.values()):
            st = getattr(fn, "stats", None)
            if st is not None:
                hits += sum(st.cache_hits.values())
                misses += sum(st.cache_misses.values())
        return hits, misses

    @property
    def compiles(self) -> int:
        return self._numba_counts()[1]

    @property
    def disk_hits(self) -> int:
        return self._numba_counts()[0]

    def __getattr__(self, name):
        return getattr(cache.stats, name)

    def snapshot(self) -> dict:
        hits, misses = self._numba_counts()
        return {"compiles": misses, "disk_hits": hits, "kernels_loaded": len(_LOADED),
                **cache.stats.as_dict()}

    def __repr__(self):
        return f"jit.stats({self.snapshot()})"


stats = _Stats()


def set_threads(n: int | None):
    """Numba's thread count for the next call (None: all)."""
    import numba
    numba.set_num_threads(n or numba.config.NUMBA_NUM_THREADS)


def call(fn, args, parallel: bool, n: int | None):
    """fn(*args) on n threads (None: numba's setting) when it was compiled parallel."""
    if parallel and n is not None:
        set_threads(n)
        try:
            fn(*args)
        finally:
            set_threads(None)
    else:
        fn(*args)


def max_threads() -> int:
    import numba
    return numba.config.NUMBA_NUM_THREADS


# ----------------------------------------------------------------------------- target "cuda"
_CUDA_HEADER = "import math\nimport cmath\nimport numpy as _np\nfrom numba import cuda\n"
_CUDA_LOADED = memo.Memo("jit.cuda_loaded", 256)


def load_cuda(source) -> dict:
    """{kernel name: numba-cuda dispatcher} for a codegen_cuda.CudaSource, cached in memory.
    Not written to the disk cache: numba-cuda compiles each dispatcher lazily per signature."""
    key = (source.text, source.fastmath)
    fns = _CUDA_LOADED.get(key)
    if fns is None:
        from numba import cuda
        namespace: dict = {"__name__": "tullio_py_generated_cuda"}
        exec(compile(cuda_module_text(source), "<tullio_py cuda kernel>", "exec"), namespace)
        fns = {n: cuda.jit(fastmath=source.fastmath)(namespace[n]) for n in source.kernels}
        _CUDA_LOADED[key] = fns
    return fns


def cuda_module_text(source) -> str:
    return _CUDA_HEADER + source.text
