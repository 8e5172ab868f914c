"""A slow, obviously correct interpreter of a tullio_py `Equation`: the oracle for the tests.

It shares nothing with the library but the IR (`tullio_py.ir`): ranges are given to it, and it
loops over `itertools.product` of them, computing every value with Python scalars.

    evaluate(eq, arrays, ranges, out=None, pad_value=0) -> np.ndarray

Semantics (DESIGN.md section 2, spelled out):

* slot values: Affine -> sum(coef*index)+const; Gather -> J[...] + offset; Wrapped: 'pad' makes
  the whole read return `pad_value` when out of [0, n), 'clamp' clamps, 'mod' wraps.  Every other
  access outside [0, n) raises AssertionError("out of bounds ...") -- an independent check that
  range inference kept all accesses in bounds.
* guards: top-level factors of the RHS (through Binary('*')) that are comparisons of indices
  (and parameters) evaluating False skip the index tuple, for every reducer.  A failing comparison
  of left-hand indices only means the element is not written at all (a mask selecting elements);
  otherwise the tuple is skipped but its element is still written.  Under the '+' reducer with
  pad_value == 0, a top-level pad read out of bounds also skips the tuple (same value as adding 0).
* reduction: tuples are grouped by the LHS element they write; value = reducer over the group
  starting from the identity, then the finaliser once per element, then the assignment.
* in-place reads: the RHS reads the output from a snapshot taken before the statement.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from tullio_py.ir import (FLOAT_FUNCS, Access, Affine, Binary, Call, Compare, Const, Equation,
                          Gather, IndexValue, Param, Unary, Wrapped, walk)

__all__ = ["evaluate", "output_dtype"]


class _Padded:
    """Marker: a pad(...) read fell outside its array."""

    def __repr__(self):
        return "PADDED"


PADDED = _Padded()


def _scalar(x):
    """A Python scalar from a numpy scalar / 0-d array / Python number."""
    if isinstance(x, np.ndarray):
        if x.ndim != 0:
            raise AssertionError(f"parameter must be a scalar, got shape {x.shape}")
        return x.item()
    if isinstance(x, np.generic):
        return x.item()
    return x


# ----------------------------------------------------------------------------- functions
def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


_FUNCS = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
    "abs": abs, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "sinh": np.sinh, "cosh": np.cosh, "arctan": np.arctan, "sigmoid": _sigmoid,
    "relu": lambda x: x if x > 0 else 0 * x,
    "conj": lambda x: np.conj(x), "real": lambda x: np.real(x), "imag": lambda x: np.imag(x),
    "max": lambda a, b: a if a >= b else b,
    "min": lambda a, b: a if a <= b else b,
    "where": lambda c, a, b: a if c else b,
}


def _apply(func, args):
    with np.errstate(all="ignore"):
        v = _FUNCS[func](*args)
    return _scalar(v)


def _binary(op, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:   # IEEE semantics instead of ZeroDivisionError
            with np.errstate(all="ignore"):
                return _scalar(np.float64(a) / np.float64(b)) if not isinstance(a, complex) \
                    and not isinstance(b, complex) else _scalar(np.complex128(a) / np.complex128(b))
        return a / b
    if op == "**":
        return a ** b
    raise AssertionError(f"unknown binary operator {op!r}")


_CMP = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


# ----------------------------------------------------------------------------- interpreter
class _Interp:
    def __init__(self, eq: Equation, arrays: dict, pad_value, snapshot):
        self.eq = eq
        self.arrays = dict(arrays)
        if snapshot is not None:
            self.arrays[eq.output] = snapshot
        self.pad_value = pad_value

    def array(self, name):
        if name not in self.arrays:
            raise AssertionError(f"array {name!r} not given to the reference")
        return np.asarray(self.arrays[name])

    # --- index slots
    def affine(self, a: Affine, env) -> int:
        return sum(c * env[n] for n, c in a.terms) + a.const

    def gather(self, g: Gather, env) -> int:
        J = self.array(g.array)
        idx = tuple(self.affine(a, env) for a in g.indices)
        self.check(g.array, J.shape, idx)
        v = J[idx]
        if not np.issubdtype(J.dtype, np.integer):
            raise AssertionError(f"gather index array {g.array} is not integer ({J.dtype})")
        return int(v) + self.affine(g.offset, env)

    def inner(self, s, env) -> int:
        return self.gather(s, env) if isinstance(s, Gather) else self.affine(s, env)

    def slot(self, s, env, n: int):
        """Position in a dimension of size n, or PADDED."""
        if isinstance(s, Wrapped):
            v = self.inner(s.inner, env)
            if s.kind == "pad":
                return v if 0 <= v < n else PADDED
            if s.kind == "clamp":
                return min(max(v, 0), n - 1)
            if s.kind == "mod":
                return v % n
            raise AssertionError(f"unknown wrapper {s.kind}")
        return self.inner(s, env)

    @staticmethod
    def check(name, shape, idx):
        if len(idx) != len(shape):
            raise AssertionError(f"{name} has {len(shape)} dimensions, indexed with {len(idx)}")
        for d, (i, n) in enumerate(zip(idx, shape)):
            if not 0 <= i < n:
                raise AssertionError(f"out of bounds: {name}{list(idx)}, dimension {d} has "
                                     f"size {n}")

    def read(self, acc: Access, env):
        A = self.array(acc.array)
        if A.ndim != len(acc.indices):
            raise AssertionError(f"{acc.array} has {A.ndim} dimensions, indexed with "
                                 f"{len(acc.indices)}")
        idx = []
        for s, n in zip(acc.indices, A.shape):
            v = self.slot(s, env, n)
            if v is PADDED:
                return PADDED
            idx.append(v)
        idx = tuple(idx)
        self.check(acc.array, A.shape, idx)
        return _scalar(A[idx])

    # --- values
    def value(self, e, env):
        if isinstance(e, Const):
            return e.value
        if isinstance(e, Param):
            if e.name not in self.arrays:
                raise AssertionError(f"parameter {e.name!r} not given to the reference")
            return _scalar(self.arrays[e.name])
        if isinstance(e, IndexValue):
            return env[e.name]
        if isinstance(e, Access):
            v = self.read(e, env)
            return self.pad_value if v is PADDED else v
        if isinstance(e, Unary):
            v = self.value(e.operand, env)
            return -v if e.op == "-" else v
        if isinstance(e, Binary):
            return _binary(e.op, self.value(e.left, env), self.value(e.right, env))
        if isinstance(e, Compare):
            vals = [self.value(x, env) for x in e.operands]
            ok = all(_CMP[op](a, b) for op, a, b in zip(e.ops, vals, vals[1:]))
            return 1 if ok else 0
        if isinstance(e, Call):
            return _apply(e.func, [self.value(a, env) for a in e.args])
        raise AssertionError(f"unknown node {e!r}")

    # --- guards
    def skipped(self, env):
        """False, "term" (skip the contribution) or "element" (do not write the element)."""
        left = set(self.eq.lhs_indices)
        for f in _factors(self.eq.rhs):
            if isinstance(f, Compare) and _index_only(f):
                if not self.value(f, env):
                    names = {n.name for x in f.operands for n in walk(x)
                             if isinstance(n, IndexValue)}
                    return "element" if names <= left else "term"
        if self.eq.reducer != "+":
            return False
        for f in _factors(self.eq.rhs):
            if isinstance(f, Access) and self.pad_value == 0 \
                    and any(isinstance(s, Wrapped) and s.kind == "pad" for s in f.indices):
                if self.read(f, env) is PADDED:
                    return "term"
        return False


def _factors(e):
    if isinstance(e, Binary) and e.op == "*":
        return _factors(e.left) + _factors(e.right)
    return [e]


def _index_only(cmp: Compare) -> bool:
    return all(isinstance(n, (IndexValue, Param, Const, Binary, Unary))
               for x in cmp.operands for n in walk(x)) and any(
        isinstance(n, IndexValue) for x in cmp.operands for n in walk(x))


# ----------------------------------------------------------------------------- dtypes
def _uses_float_ops(eq: Equation) -> bool:
    for n in walk(eq.rhs):
        if isinstance(n, Binary) and n.op == "/":
            return True
        if isinstance(n, Call) and n.func in FLOAT_FUNCS:
            return True
    return eq.finaliser in FLOAT_FUNCS


def output_dtype(eq: Equation, arrays: dict) -> np.dtype:
    """The dtype of a ':=' result (see the module docstring of the brief)."""
    array_dtypes = []
    for acc in eq.accesses():
        array_dtypes.append(np.asarray(arrays[acc.array]).dtype)
    weak = []
    for n in walk(eq.rhs):
        if isinstance(n, Const):
            weak.append(n.value)
        elif isinstance(n, Param):
            weak.append(_scalar(arrays[n.name]))
        elif isinstance(n, IndexValue):
            weak.append(0)
    if not array_dtypes:
        if any(isinstance(w, complex) for w in weak):
            dt = np.dtype(np.complex128)
        elif any(isinstance(w, float) for w in weak):
            dt = np.dtype(np.float64)
        else:
            dt = np.dtype(np.int64)
    else:
        dt = np.result_type(*array_dtypes, *weak)
    if dt.kind in "biu" and _uses_float_ops(eq):
        dt = np.dtype(np.float64)
    if dt.kind == "b" and eq.reduction_indices:
        dt = np.dtype(np.int64)
    if dt.kind == "c" and not _complex_reaches(eq.rhs, arrays):
        dt = np.real(np.zeros(1, dt)).dtype       # abs/real/imag of complex values are real
    return np.dtype(dt)


def _complex_reaches(e, arrays) -> bool:
    """Whether a complex value reaches e's value other than through abs, real, imag or a
    comparison (numpy: np.abs of a complex array is real)."""
    if isinstance(e, Access):
        return np.asarray(arrays[e.array]).dtype.kind == "c"
    if isinstance(e, Const):
        return isinstance(e.value, complex)
    if isinstance(e, Param):
        return isinstance(_scalar(arrays[e.name]), (complex, np.complexfloating))
    if isinstance(e, Call):
        if e.func in ("abs", "real", "imag"):
            return False
        args = e.args[1:] if e.func == "where" else e.args
        return any(_complex_reaches(a, arrays) for a in args)
    if isinstance(e, Binary):
        return _complex_reaches(e.left, arrays) or _complex_reaches(e.right, arrays)
    if isinstance(e, Unary):
        return _complex_reaches(e.operand, arrays)
    return False            # comparisons, index values


def _identity(reducer: str, dtype: np.dtype):
    if reducer == "+":
        return 0
    if reducer == "*":
        return 1
    if reducer == "max":
        return int(np.iinfo(dtype).min) if dtype.kind in "iu" else -math.inf
    if reducer == "min":
        return int(np.iinfo(dtype).max) if dtype.kind in "iu" else math.inf
    raise AssertionError(f"unknown reducer {reducer!r}")


def _reduce(reducer: str, acc, v):
    if reducer == "+":
        return acc + v
    if reducer == "*":
        return acc * v
    if reducer == "max":
        return v if v > acc else acc
    if reducer == "min":
        return v if v < acc else acc
    raise AssertionError(reducer)


# ----------------------------------------------------------------------------- entry point
def evaluate(eq: Equation, arrays: dict, ranges: dict, out: np.ndarray | None = None,
             pad_value=0) -> np.ndarray:
    """Evaluate `eq` by brute force.  `ranges` must give a range for every index of `eq`.
    For in-place forms the result is a new array (the old values taken from `out`, or from
    `arrays[eq.output]` when `out` is None); `out` itself is not modified."""
    for name in eq.indices:
        if name not in ranges:
            raise AssertionError(f"no range given for index {name!r}")
    index_ranges = []
    for name in eq.indices:
        r = ranges[name]
        index_ranges.append(range(r) if isinstance(r, int) else r)

    if eq.assign != ":=":
        if out is None:
            out = arrays[eq.output]
        old = np.array(out, copy=True)
    else:
        old = None
    interp = _Interp(eq, arrays, pad_value, None if old is None else old.copy())

    # 1. walk every index tuple: the LHS element it writes and its contribution
    groups: dict[tuple, list] = {}
    lhs_values = []
    for vals in itertools.product(*index_ranges):
        env = dict(zip(eq.indices, vals))
        pos = tuple(interp.inner(s, env) if not isinstance(s, Wrapped) else _bad_lhs(s)
                    for s in eq.lhs.indices)
        lhs_values.append(pos)     # the shape of a new array counts every tuple
        skip = interp.skipped(env)
        if skip == "element":
            continue
        bucket = groups.setdefault(pos, [])
        if skip:
            continue
        bucket.append(interp.value(eq.rhs, env))

    # 2. the output array
    if eq.assign == ":=":
        dtype = output_dtype(eq, arrays)
        if eq.lhs.indices:
            if lhs_values:
                lo = [min(p[d] for p in lhs_values) for d in range(len(eq.lhs.indices))]
                if min(lo) < 0:
                    raise AssertionError(f"out of bounds: ':=' output position {lo} < 0")
                shape = tuple(max(p[d] for p in lhs_values) + 1
                              for d in range(len(eq.lhs.indices)))
            else:
                shape = (0,) * len(eq.lhs.indices)
        else:
            shape = ()
        result = np.full(shape, pad_value, dtype=dtype)
    else:
        result = old
        dtype = result.dtype
    for pos in groups:
        interp.check(eq.output, result.shape, pos)

    # 3. reduce, finalise, assign
    reducer = eq.reducer
    for pos, contributions in groups.items():
        acc = _identity(reducer, dtype)
        for v in contributions:
            acc = _reduce(reducer, acc, v)
        if eq.finaliser:
            acc = _apply(eq.finaliser, [acc])
        if eq.assign in (":=", "="):
            new = acc
        elif eq.assign == "+=":
            new = _scalar(result[pos]) + acc
        elif eq.assign == "-=":
            new = _scalar(result[pos]) - acc
        elif eq.assign == "*=":
            new = _scalar(result[pos]) * acc
        else:
            raise AssertionError(eq.assign)
        if dtype.kind in "iu" and isinstance(new, float) and math.isinf(new):
            raise AssertionError(f"infinite value for an integer output at {pos}")
        result[pos] = new
    return result


def _bad_lhs(s):
    raise AssertionError(f"boundary wrapper {s} on the left-hand side")
