"""Binding a statement to the arrays of one call: the only place arrays are checked.

`bind(equation, options, arrays)` takes what a call passes (arrays and scalars by name, or
`ArrayInfo(shape, dtype)` where only the shape and dtype are known, as for arrays in GPU
memory or dask arrays) and returns a `Binding`: the call signature (names, dtypes, ranks,
layouts, target), the index ranges, the output's shape and dtype, whether a new output is
filled first, and the index arrays' extrema.  Every frontend calls it before running anything,
so a bad call fails with the same error on every target.  The rule, in order:
1. names: every array and parameter the statement reads (and the output of `=`, `+=`, ...)
   is passed, nothing else; parameters are scalars, arrays are numbers of a native byte
   order numba has loops for, indexed with as many indices as they have dimensions; index
   arrays hold integers; an in-place output is writeable;
2. ranges: ranges.py's rules over the shapes, `ranges=` and the index arrays' (min, max)
   over what the statement's text can read; then the gathers without a shifted index are
   checked over exactly the elements the loops read;
3. the result: `:=` makes an array of ranges.output_shape and numpy's result type of the
   arrays read (scalars weak; float64 for integers under a division or float function; real
   where complex values reach the value only through abs/real/imag; int64 for a sum of
   booleans); `=` and the updates write into the output passed, of its shape and dtype;
   a (max) or (min) reduction needs a real result.  A new output is filled with `pad` first
   when some of its elements may not be written (`fill`).

Worked example: `y[i] := x[i+j] * h[j] / 2` with x int32 of 10 elements, h int64 of 3.
Step 1: x and h are passed, ranks 1 and 1.  Step 2: j in 0:3 (from h), i in 0:8 (i yields:
x[i+j] needs i + 2 < 10).  Step 3: y has shape (8,), dtype float64 (int32 and int64 give
int64, the division makes it float); every y[i] is written, so no fill.  With
`y[2i] := x[i]` the odd elements are never written: fill is True and they hold `pad`.
Passing x of 2 dimensions fails at step 1: "'x' has 2 dimensions but is indexed with 1".
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import memo, ranges as ranges_mod, schedule
from .errors import ArgumentError, RangeError
from .ir import (FLOAT_FUNCS, Access, Affine, Binary, Call, Compare, Const, Equation, Gather,
                 Param, value_children, walk)
from .options import NAMES as OPTION_NAMES
from .signature import array_codes


class ArrayInfo(NamedTuple):
    """An array known by its shape and dtype only (in GPU memory, a dask array)."""
    shape: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class Binding:
    """One statement bound to the arrays of one call (see the module docstring)."""
    equation: Equation
    arrays: dict            # name -> checked numpy array (placeholder for an ArrayInfo) or scalar
    signature: tuple        # signature.ArrayCode (name, dtype, ndim, layout) per argument, by name
    target: str
    ranges: dict            # index -> range the loops iterate
    extrema: dict           # index array -> (min, max) over what the text can read
    read: dict              # index array -> (min, max) over what the loops read
    shape: tuple            # the output's shape
    dtype: np.dtype         # the output's dtype
    fill: bool              # a new output is filled with pad first

    @property
    def shapes(self) -> dict:
        return {n: a.shape for n, a in self.arrays.items() if isinstance(a, np.ndarray)}


def bind(eq: Equation, options, arrays: dict, extrema: dict | None = None) -> Binding:
    """Check the arrays of one call and bind them (rules 1-3 of the module docstring).
    `extrema`: the index arrays' (min, max), when they are not host arrays (then the gathers
    are checked over these values)."""
    checked = collect(eq, arrays)
    given = options.given
    if extrema is None:
        ext = gather_extrema(eq, checked)
        rng = ranges_mod.infer(eq, shapes_of(checked), ext, given)
        read = gather_extrema(eq, checked, rng) if ext else ext
    else:
        ext = read = extrema
        rng = ranges_mod.infer(eq, shapes_of(checked), ext, given)
    check_gathers(eq, checked, read)
    if eq.assign == ":=":
        dtype = result_dtype(eq, checked)
        shape = tuple(ranges_mod.output_shape(eq, rng, read))
    else:
        dtype, shape = checked[eq.output].dtype, tuple(checked[eq.output].shape)
    check_real_reduction(eq, dtype)
    return Binding(eq, checked, signature(checked), options.target, rng, ext, read, shape,
                   np.dtype(dtype), eq.assign == ":=" and needs_fill(eq))


def shapes_of(arrays: dict) -> dict:
    return {n: a.shape for n, a in arrays.items() if isinstance(a, np.ndarray)}


def signature(arrays: dict) -> tuple:
    """What compiled code depends on: each array's dtype, rank and layout, each scalar's type
    (signature.ArrayCode per argument, by name)."""
    return array_codes(arrays)


# ----------------------------------------------------------------------------- rule 1: names
def collect(eq: Equation, arrays: dict) -> dict:
    """The arrays and scalars the statement reads, checked (rule 1); ArrayInfo values become
    zero-stride placeholders of their shape and dtype."""
    needed = list(eq.arrays) + list(eq.params)
    if eq.assign != ":=":
        needed = [eq.output] + needed
    missing = [n for n in needed if n not in arrays]
    if missing:
        raise ArgumentError(f"missing array{'s' if len(missing) > 1 else ''}: "
                            f"{', '.join(missing)}", eq.text, find(eq.text, missing[0]),
                            f"pass {missing[0]}=... as a keyword")
    extra = [n for n in arrays if n not in needed and n != eq.output]
    if extra:
        raise ArgumentError(f"not used by the expression: {', '.join(extra)}", eq.text, None,
                            f"options are {', '.join(OPTION_NAMES)}")
    out = {}
    for n in needed:
        v = arrays[n]
        if isinstance(v, ArrayInfo):
            v = placeholder(v.shape, v.dtype)
        if n in eq.params:
            if isinstance(v, np.ndarray) and v.ndim == 0:
                v = v.item()
            if not isinstance(v, (int, float, complex, np.number, bool, np.bool_)):
                raise ArgumentError(f"'{n}' is used as a scalar parameter but got "
                                    f"{type(v).__name__}", eq.text, find(eq.text, n))
            if isinstance(v, np.generic) and extended(v.dtype):
                raise ArgumentError(f"'{n}' is a {v.dtype} scalar, which the compiled loops "
                                    "do not support", eq.text, find(eq.text, n),
                                    f"pass float({n}) or complex({n})")
            out[n] = v
            continue
        if not isinstance(v, np.ndarray):
            if hasattr(v, "__array__") or isinstance(v, (list, tuple)):
                v = np.asarray(v)
            elif np.isscalar(v) and n != eq.output:
                v = np.asarray(v)
            else:
                raise ArgumentError(f"'{n}' must be an array, got {type(v).__name__}",
                                    eq.text, find(eq.text, n))
        out[n] = v
    check_arrays(eq, out)
    return out


def check_arrays(eq: Equation, arrays: dict):
    """Ranks, dtypes and byte order of the arrays, integer index arrays, a writeable output."""
    for acc in [eq.lhs] + eq.accesses():
        a = arrays.get(acc.array)
        if a is None:
            continue
        if a.ndim != len(acc.indices):
            raise ArgumentError(f"'{acc.array}' has {a.ndim} dimension"
                                f"{'s' if a.ndim != 1 else ''} but is indexed with "
                                f"{len(acc.indices)}", eq.text, acc.span)
        if a.dtype.kind not in "biufc":
            raise ArgumentError(f"'{acc.array}' has dtype {a.dtype}: tullio_py needs numbers",
                                eq.text, acc.span)
        if a.dtype == np.float16 or extended(a.dtype):
            to = ("float32" if a.dtype == np.float16 else
                  "complex128" if a.dtype.kind == "c" else "float64")
            raise ArgumentError(f"'{acc.array}' is {a.dtype}, which the compiled loops do not "
                                "support", eq.text, acc.span,
                                f"pass {acc.array}.astype(np.{to})")
        if not a.dtype.isnative:
            raise ArgumentError(f"'{acc.array}' has non-native byte order ({a.dtype.str})",
                                eq.text, acc.span,
                                f"pass {acc.array}.astype({acc.array}.dtype.newbyteorder('='))")
    for g in eq.gathers():
        J = arrays[g.array]
        if J.ndim != len(g.indices):
            raise ArgumentError(f"index array '{g.array}' has {J.ndim} dimensions but is "
                                f"indexed with {len(g.indices)}", eq.text, g.span)
        if J.dtype.kind not in "iu":
            raise RangeError(f"index array '{g.array}' must hold integers, not {J.dtype}",
                             eq.text, g.span, f"convert it with {g.array}.astype(int)")
    if eq.assign != ":=":
        out = arrays[eq.output]
        if not out.flags.writeable:
            raise ArgumentError(f"output '{eq.output}' is read-only", eq.text, eq.lhs.span)


def placeholder(shape, dtype) -> np.ndarray:
    """A writeable host array of this shape and dtype backed by one element (zero strides):
    what the checks and range inference look at for an array known by shape and dtype."""
    dtype = np.dtype(dtype)
    return np.ndarray(tuple(shape), dtype, buffer=bytearray(max(dtype.itemsize, 1)),
                      strides=(0,) * len(shape))


# ----------------------------------------------------------------------------- rule 2: gathers
def gather_extrema(eq: Equation, arrays: dict, rng: dict | None = None) -> dict:
    """Index arrays' (min, max) over what the loops read (with rng), or over what the text
    can read (without: range inference uses this over-estimate)."""
    return ranges_mod.gather_extrema(eq, arrays, rng)


def check_gathers(eq: Equation, arrays: dict, ext: dict, raises: bool = True) -> bool:
    """Gathers without a shift cannot go through range inference: check values directly
    (ext: the index values the loops read).  With raises=False, only say if they fit."""
    for acc in ([eq.lhs] if eq.assign != ":=" else []) + eq.accesses():
        for d, s in enumerate(acc.indices):
            if isinstance(s, Gather) and s.array in ext and not s.offset.terms:
                lo, hi = ext[s.array][0] + s.offset.const, ext[s.array][1] + s.offset.const
                n = arrays[acc.array].shape[d]
                if (lo < 0 or hi >= n) and not raises:
                    return False
                if lo < 0 or hi >= n:
                    raise RangeError(f"index array '{s.array}' holds values {lo}..{hi} (with "
                                     f"offset) where the loops read it, out of bounds for "
                                     f"'{acc.array}' which has {n} along dimension {d}",
                                     eq.text, s.span)
    return True


# ----------------------------------------------------------------------------- rule 3: the result
def check_real_reduction(eq: Equation, dtype: np.dtype):
    if eq.reducer in ("max", "min") and np.dtype(dtype).kind == "c":
        raise ArgumentError(f"a ({eq.reducer}) reduction needs real values, but the result "
                            f"type is {dtype} (numpy's result type of the arrays read)",
                            eq.text, eq.lhs.span,
                            "write into an existing real array with '=' (e.g. of abs(...))")


@memo.lru(maxsize=1024)
def needs_fill(eq: Equation) -> bool:
    """A new output must be filled first: some elements may not be written (diagonals,
    constants, shifted or gathered positions, masks on left indices)."""
    lhs = eq.lhs.indices
    bare = [s.names[0] for s in lhs if isinstance(s, Affine) and s.is_bare]
    return (len(bare) != len(lhs) or len(set(bare)) != len(bare) or any(
        schedule.mask_guards(f) is not None for f in schedule.top_factors(eq.rhs)))


@memo.lru(maxsize=1024)
def _dtype_inputs(eq: Equation) -> tuple:
    """What the result type depends on, from the statement alone: the arrays read (not index
    arrays), the constants and parameters, whether a division or float function makes
    integers float, and what can make the result complex (below)."""
    # (nodes inside the condition of a `where` only choose a branch: numpy's `np.where(x == y,
    # k, n)` of float32 x, y and integers k, n is an integer array, and the argmax helper of a
    # (max), `(min) m_arg[i] := where(x[i,j] == m[i], j, none)`, so holds its positions as
    # integers, exact past 2**24 tuples where float32 would round two positions to one)
    nodes = list(walk(eq.rhs, value_children))
    read = tuple(dict.fromkeys(n.array for n in nodes if isinstance(n, Access)))
    consts = tuple(n.value for n in nodes if isinstance(n, Const))
    params = tuple(dict.fromkeys(n.name for n in nodes if isinstance(n, Param)))
    floaty = eq.finaliser in FLOAT_FUNCS or any(
        (isinstance(n, Binary) and n.op == "/") or (isinstance(n, Call) and n.func in FLOAT_FUNCS)
        for n in nodes)
    return read, consts, params, floaty, _complex_sources(eq.rhs)


_REAL_VALUED = ("abs", "real", "imag")     # real results of complex arguments, as in numpy


def _complex_sources(e) -> tuple:
    """(array names, parameter names, constants) whose values reach the right side's value
    other than through abs/real/imag or a comparison: only these can make the result
    complex (`abs(z[i])` of a complex z is real)."""
    def kids(n):        # not into abs/real/imag or a comparison, nor a where's condition
        real = isinstance(n, Compare) or isinstance(n, Call) and n.func in _REAL_VALUED
        return () if real else value_children(n)
    nodes = list(walk(e, kids))
    return (tuple(dict.fromkeys(n.array for n in nodes if isinstance(n, Access))),
            tuple(dict.fromkeys(n.name for n in nodes if isinstance(n, Param))),
            tuple(n.value for n in nodes if isinstance(n, Const)))


def result_dtype(eq: Equation, arrays: dict) -> np.dtype:
    """numpy's result_type of the arrays read (not index arrays), with scalars weak; float when
    the right side divides or calls a float function on integers; real when complex values
    reach it only through abs, real, imag (or comparisons)."""
    read, consts, params, floaty, (c_arrays, c_params, c_consts) = _dtype_inputs(eq)
    dts = [arrays[n].dtype for n in read]
    weak = [_weak(arrays[p]) for p in params] + [_weak(c) for c in consts]
    if dts:
        dt = np.result_type(*dts, *weak)
    else:
        dt = np.result_type(np.int64, *weak) if weak else np.dtype(np.int64)
    if dt.kind == "c" and not (any(arrays[n].dtype.kind == "c" for n in c_arrays)
                               or any(np.result_type(_weak(arrays[p])).kind == "c"
                                      for p in c_params)
                               or any(isinstance(c, complex) for c in c_consts)):
        return np.finfo(dt).dtype
    if dt.kind in "biu" and floaty:
        return np.dtype(np.float64)
    if dt.kind == "b" and eq.reduction_indices:
        return np.dtype(np.int64)
    return np.dtype(dt)


def _weak(v):
    if isinstance(v, np.ndarray):
        v = v.item()
    if isinstance(v, np.generic):
        return v.dtype
    return v


# ----------------------------------------------------------------------------- small helpers
def extended(dtype: np.dtype) -> bool:
    """numpy's long double and its complex (80- or 128-bit): numba has no loops for them.
    Where they are the same as float64/complex128 they are not extended."""
    return dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f" else 16)


def find(text: str, name: str):
    """The span of `name` as a whole word in `text` (for a caret), or None."""
    m = re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text or "")
    return (m.start(), m.end()) if m else None
