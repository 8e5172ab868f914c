"""tullio_py: einsum-style index notation compiled to fast, threaded, differentiable loops.

    from tullio_py import tullio
    C = tullio("C[i,k] := A[i,j] * B[j,k]", A=A, B=B)
"""
from .errors import (ArgumentError, GradientError, LoweringError, OverwriteWarning, ParseError,
                     RangeError, SummationWarning, TullioError)
from .kernel import Kernel, kernel, tullio
from .tape import Tape
from .cache import clear as clear_cache

__version__ = "0.1.0"
__all__ = ["Tape", "tullio", "kernel", "Kernel", "TullioError", "ParseError", "RangeError",
           "GradientError", "ArgumentError", "LoweringError", "SummationWarning", "OverwriteWarning",
           "clear_cache"]
