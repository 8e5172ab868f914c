"""tullio_py: einsum-style index notation compiled to fast, threaded, differentiable loops.

    from tullio_py import tullio
    C = tullio("C[i,k] := A[i,j] * B[j,k]", A=A, B=B)
"""
from .errors import (ArgumentError, GradientError, LoweringError, OverwriteWarning, ParseError,
                     RangeError, SummationWarning, TullioError)
from .kernel import Kernel, kernel, tullio
from .tape import Tape
from .version import __version__
from . import cache as _cache, memo as _memo, memory as _memory, scratch as _scratch


def __getattr__(name):
    """`Chain` (chain.py), imported on first use: `import tullio_py` stays light."""
    if name == "Chain":
        from .chain import Chain
        return Chain
    raise AttributeError(f"module 'tullio_py' has no attribute {name!r}")


def clear_cache() -> None:
    """Empty every cache tullio_py keeps: in memory (kernels, derivations, compiled functions,
    plans and remembered calls, see memo.py) and on disk (cache.py).  Arrays and Kernel objects
    a program still holds keep working; what they need is worked out and compiled again."""
    _memo.clear_all()
    _cache.clear()
    _scratch.pool.clear()
    _memory.forget()


__all__ = ["Tape", "tullio", "kernel", "Kernel", "Chain", "TullioError", "ParseError", "RangeError",
           "GradientError", "ArgumentError", "LoweringError", "SummationWarning", "OverwriteWarning",
           "clear_cache"]
