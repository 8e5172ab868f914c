"""numpy's dtype rules for one element of a right-hand side (NEP 50).

Every node of a right-hand side gets the dtype numpy would give it if every array read were a
numpy array of its dtype: `int8 * int8` is int8 (and wraps), `uint64 * int64` is float64,
`float32 * 2.5` is float32.  Python scalars (constants, parameters passed as int, float,
complex or bool, and index values) are weak: they take the other operand's dtype when they
are of the same kind or lower.  numpy scalars passed as parameters are strong; a 0-d array
parameter is read as a Python scalar (bind.collect), so weak.  Deviations: `-` and `**`
of booleans, which numpy refuses, are int64 (the gradients write sign(a) as
(a > 0) - (a < 0)); a float function (exp, sqrt, ... and `/`) of integers or bools is float64
(numpy gives float16 for int8 and float32 for int16; float16 has no compiled loops here).

A dtype here is an `np.dtype` (strong) or one of the Python types bool, int, float, complex
(weak).  The code generators cast operands and results to these dtypes (casts are generated
text, never a user's value).
"""
from __future__ import annotations

import numpy as np

from .ir import FLOAT_FUNCS, Access, Binary, Call, Compare, Const, IndexValue, Param, Unary

_WEAK_ORDER = (bool, int, float, complex)
_WEAK_SAMPLE = {bool: False, int: 0, float: 0.0, complex: 0j}


def weak_or_dtype(v):
    """The dtype of a parameter's value: weak for Python scalars, strong for numpy values."""
    if isinstance(v, (np.ndarray, np.generic)):
        return np.dtype(v.dtype)
    for t in _WEAK_ORDER:
        if type(v) is t:
            return t
    return np.asarray(v).dtype


def with_dtypes(plan, arrays: dict):
    """The plan with the dtypes of the arrays and parameters of a call (values or arrays of
    their shape and dtype): what the code generators compute each element in."""
    from dataclasses import replace
    return replace(plan, dtypes=tuple((n, weak_or_dtype(arrays[n])) for n in sorted(arrays)))


def is_weak(t) -> bool:
    return not isinstance(t, np.dtype)


def kind(t) -> str:
    return t.kind if isinstance(t, np.dtype) else {bool: "b", int: "i", float: "f",
                                                   complex: "c"}[t]


def promote(*ts):
    """numpy's result type of operands of these dtypes (weak ones weak)."""
    strong = [t for t in ts if isinstance(t, np.dtype)]
    weak = [t for t in ts if not isinstance(t, np.dtype)]
    if not strong:
        return max(weak, key=_WEAK_ORDER.index)
    return np.result_type(*strong, *[_WEAK_SAMPLE[t] for t in weak])


def concrete(t) -> np.dtype:
    """A weak dtype made strong (numpy's default of its kind)."""
    if isinstance(t, np.dtype):
        return t
    return np.dtype({bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}[t])


def _floaty(t):
    """The dtype of a float function of t: float64 for integers and bools."""
    return (float if is_weak(t) else np.dtype(np.float64)) if kind(t) in "biu" else t


def _real(t):
    if kind(t) != "c":
        return t
    return float if is_weak(t) else np.dtype(np.float32 if t == np.complex64 else np.float64)


_INT = np.dtype(np.int64)


def dtype_of(e, env: dict, default: np.dtype):
    """The dtype of node `e`; `env` maps array and parameter names to dtypes (missing names
    have `default`)."""
    if isinstance(e, Access):
        return env.get(e.array, default)
    if isinstance(e, Const):
        return weak_or_dtype(e.value)
    if isinstance(e, Param):
        return env.get(e.name, default)
    if isinstance(e, IndexValue):
        return int
    if isinstance(e, Unary):
        t = dtype_of(e.operand, env, default)
        return _INT if kind(t) == "b" else t
    if isinstance(e, Binary):
        t = promote(dtype_of(e.left, env, default), dtype_of(e.right, env, default))
        if kind(t) == "b" and e.op not in "+*":
            return _INT     # numpy refuses; integers give the sign (a > 0) - (a < 0) its value
        return _floaty(t) if e.op == "/" else t
    if isinstance(e, Compare):
        return np.dtype(np.bool_)
    if isinstance(e, Call):
        f = e.func
        args = [dtype_of(a, env, default) for a in e.args]
        if f == "where":
            return promote(args[1], args[2])
        if f in ("max", "min"):
            return promote(args[0], args[1])
        if f == "relu":
            return promote(args[0], int)
        if f in ("abs", "real", "imag"):
            return _real(args[0])
        if f == "conj":
            return args[0]
        if f in FLOAT_FUNCS or f == "sigmoid":
            return _floaty(args[0])
        return args[0]
    raise TypeError(f"no dtype for {e!r}")


def narrow(t) -> bool:
    """Whether the compiler may compute an operation on t in another type, so its result is
    cast back (numba widens small integers and bools to int64, negates uint64 as int64, and
    mixes float32 with float64 constants)."""
    return isinstance(t, np.dtype) and t not in _NATIVE


_NATIVE = (np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.complex128))
