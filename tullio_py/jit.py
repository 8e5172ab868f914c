"""Source -> callable.  The only module that imports numba.

Target "python" executes the generated source as plain Python (range for prange): slow, but
it is the same code, useful for debugging and as a cross-check of the compiled kernels.
"""
from __future__ import annotations

import numpy as np

from .codegen import Source

_HEADERS = {
    "cpu": "import numpy as _np\nfrom numba import prange as _prange\n",
    "python": "import numpy as _np\n_prange = range\n",
}
_LOADED: dict[tuple[str, str], object] = {}


def module_text(source: Source, target: str) -> str:
    return _HEADERS[target] + source.text


def load(source: Source, target: str):
    """The compiled (or plain Python) function for `source` on `target`, cached in memory."""
    key = (source.text, target, source.parallel, source.fastmath)
    fn = _LOADED.get(key)
    if fn is None:
        namespace: dict = {"__name__": "tullio_py_generated"}
        exec(compile(module_text(source, target), "<tullio_py kernel>", "exec"), namespace)
        fn = namespace[source.name]
        if target == "cpu":
            import numba
            fn = numba.njit(parallel=source.parallel, fastmath=source.fastmath,
                            error_model="numpy")(fn)
        _LOADED[key] = fn
    return fn


def set_threads(n: int | None):
    """Numba's thread count for the next call (None: all)."""
    import numba
    numba.set_num_threads(n or numba.config.NUMBA_NUM_THREADS)


def max_threads() -> int:
    import numba
    return numba.config.NUMBA_NUM_THREADS
