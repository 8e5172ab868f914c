"""Memory overlap between arrays: an in-place statement reads its inputs as they were before it.

An input passed under another name than the output can still be the output's memory: the same
array, a view, a transpose, an overlapping slice, or the memory of an index array.  The loops
would then read values the statement has already written.  Such an input is replaced by a copy
(its snapshot), exactly as reads of the output under its own name read `_old_<out>`; inputs
that share a buffer without sharing an element (disjoint slices of one array) are not copied.
"""
from __future__ import annotations

import numpy as np

_EXACT_WORK = 10_000    # bound on np.shares_memory's search; past it, count it as an overlap


def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays share the memory of any element: the bounds first (cheap), then
    numpy's exact test where it finishes within a bounded search (too hard: an overlap)."""
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=_EXACT_WORK))
    except np.exceptions.TooHardError:
        return True


def snapshot_aliases(eq, arrays: dict) -> dict:
    """`arrays` with every array the statement reads under another name than its in-place
    output (index arrays included) that overlaps the output replaced by a copy (same memory
    order); `arrays` itself when there is none."""
    if eq.assign == ":=":
        return arrays
    out = arrays[eq.output]
    copies = {n: arrays[n].copy(order="K") for n in eq.arrays
              if n != eq.output and isinstance(arrays.get(n), np.ndarray)
              and overlaps(arrays[n], out)}
    return {**arrays, **copies} if copies else arrays


def bounds_meet(out: np.ndarray, reads: tuple) -> bool:
    """Whether the memory bounds of any of `reads` meet the output's (the replayed call path's
    guard: such a call goes the full way, which decides exactly)."""
    for r in reads:
        if np.may_share_memory(out, r):
            return True
    return False


def device_span(a) -> tuple[int, int]:
    """[first, last] byte addresses of the elements of an array in GPU memory (any object with
    `__cuda_array_interface__`); an empty array spans nothing (first > last)."""
    iface = a.__cuda_array_interface__
    shape = tuple(iface["shape"])
    itemsize = np.dtype(iface["typestr"]).itemsize
    strides = iface.get("strides")
    if strides is None:                       # C-contiguous
        strides, step = [], itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    first = last = iface["data"][0]
    if any(n == 0 for n in shape):
        return first, first - 1
    for n, s in zip(shape, strides):
        if s > 0:
            last += (n - 1) * s
        else:
            first += (n - 1) * s
    return first, last + itemsize - 1


def device_overlaps(a, b) -> bool:
    """Whether two arrays in GPU memory may share an element (their byte ranges meet)."""
    try:
        fa, la = device_span(a)
        fb, lb = device_span(b)
    except AttributeError:      # numba's CUDA simulator: its device arrays wrap host arrays
        ha, hb = getattr(a, "_ary", None), getattr(b, "_ary", None)
        return ha is not None and hb is not None and overlaps(ha, hb)
    return fa <= lb and fb <= la and fa <= la and fb <= lb
