"""Signatures: the one description of a call, or of compiled code, that every cache is keyed by.

Three records, all immutable and hashable:

- `ArraySig(name, dtype, shape, strides)`: one argument as a call sees it.  Values never enter
  it: two arrays that differ only in their elements have equal ArraySigs; a non-contiguous view
  and its contiguous copy do not (their strides differ).  A scalar is its Python type's name.
- `CallSignature(arrays, ranges, dtype, out_shape, extra)`: a call, for the memos that plan it
  (Kernel.plan_for, Gradient.vjp's call states, blas_shift's plans).
- `ArrayCode(name, dtype, ndim, layout)` and `CompileKey(text, dtype, target, parallel, plan,
  arrays)`: what changes the generated code (the rewritten statement, the result dtype, the
  target, threading, the plan's choices, each argument's dtype, rank and memory layout).  One
  compiled function serves every call whose CompileKey is equal.

`stable(obj)` writes a key as text that depends only on its value (never on a repr that a
library may change, nor on an address) and raises TypeError for anything it cannot write that
way; `digest(obj)` is its sha256.  The disk cache names its files by these (cache.py), and the
kernel modules' headers name their arguments with `CompileKey.arguments` (jit.py).

The call-path records are NamedTuples rather than dataclasses: a memo lookup hashes and
compares its key on every call, and a tuple's hash and equality run in C (a frozen dataclass
costs about twice as much per lookup).  They compare equal to plain tuples of the same fields.
`CompileKey` is built once per specialisation and looked up by identity, so it is a frozen
dataclass whose hash is computed once.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, is_dataclass
from typing import NamedTuple

import numpy as np

_new = tuple.__new__
_ND = np.ndarray


class ArraySig(NamedTuple):
    """One argument of a call: dtype, shape and strides; a scalar: its type's name only."""
    name: str
    dtype: str                  # numpy's dtype.str ('<f8'); a scalar: its type's name ('float')
    shape: tuple | None = None  # None: a scalar
    strides: tuple | None = None

    @staticmethod
    def of(name: str, a) -> "ArraySig":
        if isinstance(a, _ND):
            return _new(ArraySig, (name, a.dtype.str, a.shape, a.strides))
        return _new(ArraySig, (name, type(a).__name__, None, None))


def array_sigs(arrays: dict) -> tuple:
    """ArraySig of every value of `arrays`, in the dict's order (a loop: it runs per call)."""
    out = []
    for n, a in arrays.items():
        if isinstance(a, _ND):
            out.append(_new(ArraySig, (n, a.dtype.str, a.shape, a.strides)))
        else:
            out.append(_new(ArraySig, (n, type(a).__name__, None, None)))
    return tuple(out)


class CallSignature(NamedTuple):
    """A call as the memos that plan it see it: its arguments, index ranges, result dtype and
    shape, and `extra` facts a caller adds (e.g. which parameters came as 0-d arrays).

    `of` stores each argument as the plain tuple of ArraySig's fields (equal to the ArraySig,
    same hash): a NamedTuple per argument would cost an allocation more per argument on every
    call; `array_sigs` gives them as ArraySigs."""
    arrays: tuple               # (name, dtype, shape, strides) per argument, in the order passed
    ranges: tuple = ()          # (index, start, stop, step) per index
    dtype: str = ""             # the result's dtype.str
    out_shape: tuple = ()
    extra: tuple = ()

    @staticmethod
    def of(arrays: dict, ranges: dict | None = None, dtype=None, out_shape=(),
           extra: tuple = (), names: tuple | None = None) -> "CallSignature":
        """`dtype`: a numpy dtype (or None); `names`: only these arrays, in this order (all,
        in the dict's order, by default).  Built on every call of a planned statement: one
        loop, no helper calls (as fast as the plain tuple it replaced)."""
        sigs = []       # ArraySig's fields as plain tuples (equal to ArraySigs): see below
        for n, a in arrays.items() if names is None else [(n, arrays[n]) for n in names]:
            if isinstance(a, _ND):
                sigs.append((n, a.dtype.str, a.shape, a.strides))
            else:
                sigs.append((n, type(a).__name__, None, None))
        rng = tuple([(n, r.start, r.stop, r.step) for n, r in ranges.items()]) if ranges else ()
        return _new(CallSignature, (tuple(sigs), rng, "" if dtype is None else dtype.str,
                                    tuple(out_shape), extra))

    def with_ranges(self, ranges: dict) -> "CallSignature":
        """This signature with these index ranges (start, stop and step: range objects compare
        as sequences, so every empty range equals every other)."""
        return _new(CallSignature, (self.arrays, tuple([(n, r.start, r.stop, r.step)
                                                        for n, r in ranges.items()]),
                                    self.dtype, self.out_shape, self.extra))

    @property
    def array_sigs(self) -> tuple:
        return tuple(ArraySig._make(a) for a in self.arrays)


# ----------------------------------------------------------------------------- compiled code
def layout(a: np.ndarray):
    """"C", "F", or the dimensions from the largest stride to the smallest (`dims_by_stride`)."""
    if a.flags.c_contiguous:
        return "C"
    return "F" if a.flags.f_contiguous else dims_by_stride(a)


def dims_by_stride(a: np.ndarray) -> tuple:
    """Dimensions from the largest stride to the smallest; empty when none is contiguous."""
    if a.flags.c_contiguous:
        return tuple(range(a.ndim))
    if a.flags.f_contiguous:
        return tuple(range(a.ndim - 1, -1, -1))
    dims = tuple(sorted(range(a.ndim), key=lambda d: -abs(a.strides[d])))
    return dims if dims and abs(a.strides[dims[-1]]) == a.itemsize else ()


class ArrayCode(NamedTuple):
    """What compiled code depends on in one argument: dtype, rank and memory layout (None where
    the target ignores layouts); a scalar: its type's name."""
    name: str
    dtype: str
    ndim: int | None = None
    layout: object = None

    @staticmethod
    def of(name: str, a, layouts: bool = True) -> "ArrayCode":
        if isinstance(a, _ND):
            return _new(ArrayCode, (name, a.dtype.str, a.ndim, layout(a) if layouts else None))
        return _new(ArrayCode, (name, type(a).__name__, None, None))


def array_codes(arrays: dict, layouts: bool = True) -> tuple:
    """ArrayCode of every value, sorted by name (the order arguments are passed in does not
    change the code)."""
    return tuple(ArrayCode.of(n, a, layouts) for n, a in sorted(arrays.items()))


@dataclass(frozen=True, eq=True)
class CompileKey:
    """Everything that changes the generated code of one statement: equal keys, one compiled
    function."""
    text: str                   # the statement as rewritten for the code generator
    dtype: str                  # the result's dtype.str
    target: str                 # "cpu", "python" or "cuda"
    parallel: object            # threading chosen (schedule.threading)
    plan: tuple                 # the plan's choices (loop order, form, blocks, ...)
    arrays: tuple               # ArrayCode per argument, sorted by name
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.text, self.dtype, self.target,
                                                self.parallel, self.plan, self.arrays)))

    def __hash__(self):         # looked up on every call of a compiled statement: hashed once
        return self._hash

    @staticmethod
    def of(text: str, dtype, target: str, parallel, plan: tuple, arrays: dict,
           layouts: bool = True) -> "CompileKey":
        return CompileKey(text, np.dtype(dtype).str, target, parallel, tuple(plan),
                          array_codes(arrays, layouts))

    @property
    def arguments(self) -> str:
        """Stable text of everything but the statement: what a generated module's source does
        not show (jit.py writes it in the module's header, so it is part of the file's hash)."""
        return stable((self.dtype, self.target, self.parallel, self.plan, self.arrays))

    def __str__(self):
        return stable(self)

    def digest(self) -> str:
        return digest(self)


# ----------------------------------------------------------------------------- stable text
def stable(obj) -> str:
    """Text of a key that depends only on its value: str, numbers, bool, None, numpy
    scalars and dtypes, tuples (NamedTuples too) and lists, sets (sorted), dicts (sorted by
    key), dataclasses (by field).  Anything else is a TypeError (its repr may hold an address
    or change between library versions).  Keys that differ get different texts; keys that
    are equal in memory but of other types (1 and 1.0, np.float32(1) and 1.0) may get
    different texts too: on disk that is a miss, never a wrong hit."""
    if obj is None or obj is True or obj is False:
        return repr(obj)
    t = type(obj)
    if t is str or t is int or t is float or t is complex:
        return repr(obj)
    if isinstance(obj, (tuple, list)):       # a NamedTuple as its tuple, which it equals
        inner = ", ".join(stable(v) for v in obj)
        return f"({inner}{',' if len(obj) == 1 else ''})" if isinstance(obj, tuple) else f"[{inner}]"
    if isinstance(obj, (set, frozenset)):
        return "{" + ", ".join(sorted(stable(v) for v in obj)) + "}"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(
            (stable(k), stable(v)) for k, v in obj.items())) + "}"
    if isinstance(obj, np.generic):
        return f"{obj.dtype.str}:{stable(obj.item())}"
    for base in (int, float, complex, str):          # subclasses (an IntEnum, a str subclass)
        if isinstance(obj, base):
            return stable(base(obj))
    if isinstance(obj, np.dtype):
        return f"dtype:{obj.str}"
    if is_dataclass(obj) and not isinstance(obj, type):
        parts = ", ".join(f"{f.name}={stable(getattr(obj, f.name))}" for f in fields(obj)
                          if f.compare)
        return f"{t.__name__}({parts})"
    raise TypeError(f"no stable text for a {t.__name__} (a key holds str, numbers, None, "
                    "tuples, lists, sets, dicts, numpy scalars and dtypes, and dataclasses "
                    "of these)")


def digest(obj) -> str:
    """sha256 (hex) of `stable(obj)`."""
    return hashlib.sha256(stable(obj).encode()).hexdigest()
