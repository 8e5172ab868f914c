"""Padded reads through blas_shift.py: `dx[b,c,p] += dy[b,o,pad(p-j)] * w[o,c,j]`, the gather
form of a convolution's input gradient as tullio_py prints it, runs as shifted contractions
over the tuples whose padded reads fall inside their arrays (the others read the pad value 0
and add nothing).

Each pad(...) slot keeps its longest index free (`p`, the clipped index) and fixes the
others (`j`); for each value of the fixed indices the clipped index's range is cut to the
positions the slot reads inside its array (p in [j, j + len(dy))), and the statement without
pad() runs over those ranges as an ordinary blas_shift plan (its own plan per sub-range,
chosen by the cost model; the pad statement goes to BLAS only when every sub-range does).
Where every padded read stays inside its array over the whole ranges, one sub-range is all.
The sub-ranges add into the output: a `:=` output is made zeroed, an `=` output has its
covered elements zeroed first.  A pad value other than 0 (`pad=`) keeps the loops.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from . import memory
from .blas import pooled_gemm, provider_slowdown
from .blas_shift_cost import c_order
from .blas_shift_run import run
from .memo import Memo
from .ranges import affine_bounds, output_shape
from .signature import CallSignature

# most sub-ranges (values of the fixed indices) of one call
MAX_PARTS = 64


@dataclass(frozen=True)
class PaddedPlan:
    """The sub-ranges of a padded statement and the blas_shift plan of each."""
    parts: tuple          # ((ranges {index: range}, Plan), ...)
    fixed: tuple          # indices fixed per sub-range
    cost: float           # the model's seconds, all sub-ranges

    # what explain shows, from the first sub-range's plan
    @property
    def loop(self):
        return self.fixed + self.parts[0][1].loop

    @property
    def steps(self):
        return (len(self.parts),) + self.parts[0][1].steps

    @property
    def im2col(self):
        return self.parts[0][1].im2col

    @property
    def scatter(self):
        return self.parts[0][1].scatter

    @property
    def res_shape(self):
        return self.parts[0][1].res_shape

    split = 0


class Padded:
    """A statement whose reads have pad(...) slots: `inner` is the blas_shift.Shifted of the
    same statement with the slots' inner indices and `+=` (or `-=`); `slots`: (read number,
    dimension, inner Affine) of each pad slot."""

    def __init__(self, eq, inner, slots: tuple):
        self.eq, self.inner, self.slots = eq, inner, slots
        self.reads = inner.reads
        self.plans = Memo("blas_shift.padded", 64)   # call signature -> PaddedPlan or None

    def plan(self, arrays: dict, rng: dict, out_shape, out_strides, dtype, loop_threads=1,
             blocked=None):
        key = CallSignature.of(arrays, rng, dtype, out_shape,
                               (loop_threads, tuple(out_strides), pooled_gemm(),
                                provider_slowdown()),
                               self.inner.read_names)
        try:
            return self.plans[key]
        except KeyError:
            p = self.plans[key] = self._choose(arrays, rng, out_shape, out_strides, dtype,
                                               loop_threads, blocked)
            return p

    def _choose(self, arrays, rng, out_shape, out_strides, dtype, loop_threads, blocked):
        if self.eq.assign in (":=", "=") and not self.inner.full:
            return None         # the covered elements are zeroed as a block
        subs = sub_ranges(self.slots, [arrays[a.array].shape for a in self.reads], rng)
        if subs is None:
            return None
        fixed, ranges = subs
        parts = []
        for r in ranges:
            p = self.inner.plan(arrays, r, out_shape, out_strides, dtype, loop_threads, blocked)
            if p is None:
                return None
            parts.append((r, p))
        if not parts:
            return None
        return PaddedPlan(tuple(parts), fixed, sum(p.cost for _, p in parts))

    def call(self, arrays: dict, rng: dict, out, dtype, pad=0, loop_threads=1, blocked=None,
             threads=None):
        """Like blas_shift.Shifted.call: the output, or None when the loops should run it."""
        if pad != 0:
            return None
        eq = self.eq
        fresh = out is None
        if fresh:
            shape = tuple(output_shape(eq, rng))
            strides = tuple(np.dtype(dtype).itemsize * s for s in c_order(shape))
        else:
            shape, strides, dtype = out.shape, out.strides, out.dtype
        p = self.plan(arrays, rng, shape, strides, dtype, loop_threads, blocked)
        if p is None:
            return None
        if fresh:
            out = memory.zeros(shape, dtype)
        elif any(np.may_share_memory(out, arrays[a.array]) for a in self.reads):
            return None
        elif eq.assign in (":=", "="):
            out[tuple(slice(rng[s.names[0]].start, rng[s.names[0]].stop, rng[s.names[0]].step)
                      for s in eq.lhs.indices)] = 0
        for r, sub in p.parts:
            run(sub, self.inner, arrays, out, False, False, loop_threads, threads)
        return out


def sub_ranges(slots, shapes, rng: dict):
    """(fixed indices, [ranges of each sub-range]) covering every tuple whose padded reads
    fall inside their arrays, or None (a clipped index also fixed by another slot, or too
    many sub-ranges)."""
    if any(r.step != 1 for r in rng.values()):
        return None
    iv = {n: (r.start, r.stop) for n, r in rng.items()}
    inside = True
    for k, d, a in slots:
        b = affine_bounds(a, iv)
        if b is None:
            return (), []            # an empty range: nothing to run
        inside = inside and 0 <= b[0] and b[1] < shapes[k][d]
    if inside:
        return (), [dict(rng)]
    clip, fixed = {}, []
    for k, d, a in slots:
        free = max(a.names, key=lambda n: len(rng[n]))
        clip.setdefault(free, []).append((a, shapes[k][d]))
        fixed += [n for n in a.names if n != free and n not in fixed]
    if set(fixed) & set(clip) or \
            int(np.prod([len(rng[n]) for n in fixed])) > MAX_PARTS:
        return None
    out = []
    for values in product(*(rng[n] for n in fixed)):
        at = dict(zip(fixed, values))
        r = dict(rng)
        r.update({n: range(v, v + 1) for n, v in at.items()})
        for n, limits in clip.items():
            r[n] = _clipped(rng[n], n, limits, at)
        if all(len(x) for x in r.values()):
            out.append(r)
    return tuple(fixed), out


def _clipped(r: range, n: str, limits, at: dict) -> range:
    """The values of r (step 1) at which every slot (a, length) reads a position in
    [0, length), the slot's other indices at the values `at`."""
    lo, hi = r.start, r.stop - 1
    for a, length in limits:
        c = a.coef(n)
        off = a.const + sum(k * at[m] for m, k in a.terms if m != n)
        if c > 0:           # 0 <= c * v + off <= length - 1
            lo, hi = max(lo, -(off // c)), min(hi, (length - 1 - off) // c)
        else:
            lo, hi = max(lo, -((length - 1 - off) // -c)), min(hi, off // -c)
    return range(lo, max(lo, hi + 1))
