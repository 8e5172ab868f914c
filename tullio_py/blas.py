"""Pure contractions -> BLAS through numpy.

A statement whose right-hand side is a product of array reads at bare indices (times scalar
parameters or constants), summed over the indices missing on the left, is exactly what
`np.einsum(optimize=True)` hands to BLAS (tensordot/matmul).  Generated loops reach a fraction
of BLAS speed on large contractions, so such statements dispatch there when the work is large;
the option `blas=False` keeps the generated loops.  Gradients of a contraction are contractions
too (`dA[i,j] += dC[i,k] * B[j,k]`), so gradient equations run through `tullio` dispatch alike.

Not dispatched: functions, masks, shifts, gathers, pads, other reductions, finalisers, `*=`,
`ranges=`, integer arrays (numpy's einsum has no integer BLAS), an output also read on the right,
or a left index that no factor uses (a broadcast).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Access, Affine, Binary, Const, Equation, Param

# Below this many multiply-adds the generated loop beats einsum's fixed cost (~20-50 us for
# path finding and dispatch), measured with benchmarks/bench_suite.py on the 2-core machine.
MIN_WORK = 1 << 16


@dataclass(frozen=True)
class Contraction:
    spec: str                   # einsum subscripts, e.g. "ij,jk->ik"
    operands: tuple[str, ...]   # array names in operand order
    scale: tuple                # Param names and constants multiplying the product
    indices: tuple[str, ...]    # every index (the work is the product of their extents)
    tensordot: tuple | None = None   # (axes, permutation): two operands without a batch index


def factors(e) -> list:
    if isinstance(e, Binary) and e.op == "*":
        return factors(e.left) + factors(e.right)
    return [e]


def contraction(eq: Equation) -> Contraction | None:
    """The einsum form of `eq` if it is a pure contraction, else None."""
    if eq.reducer != "+" or eq.finaliser or eq.assign not in (":=", "=", "+=", "-="):
        return None
    if not eq.reduction_indices:
        return None
    lhs = eq.lhs.indices
    if not all(isinstance(s, Affine) and s.is_bare for s in lhs):
        return None
    left = [s.names[0] for s in lhs]
    if len(set(left)) != len(left):
        return None
    reads, scale = [], []
    for f in factors(eq.rhs):
        if isinstance(f, Access) and f.indices and all(isinstance(s, Affine) and s.is_bare
                                                       for s in f.indices):
            reads.append(f)
        elif isinstance(f, Param) or (isinstance(f, Const) and not isinstance(f.value, bool)):
            scale.append(f.name if isinstance(f, Param) else f.value)
        else:
            return None
    if len(reads) < 2 or any(a.array == eq.output for a in reads):
        return None
    used = {s.names[0] for a in reads for s in a.indices}
    if not set(left) <= used:
        return None
    letters = {}
    for n in eq.indices:
        letters[n] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(letters)]
        if len(letters) > 52:
            return None
    spec = (",".join("".join(letters[s.names[0]] for s in a.indices) for a in reads)
            + "->" + "".join(letters[n] for n in left))
    return Contraction(spec, tuple(a.array for a in reads), tuple(scale), eq.indices,
                       _tensordot(reads, left))


def _tensordot(reads, left):
    """np.tensordot's axes and the permutation to the left-hand order, when the product is one
    matrix multiplication (tensordot returns BLAS's result without einsum's extra copy)."""
    if len(reads) != 2:
        return None
    a, b = ([s.names[0] for s in r.indices] for r in reads)
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    shared = [n for n in a if n in b]
    free = [n for n in a if n not in b] + [n for n in b if n not in a]
    if any(n in left for n in shared) or sorted(free) != sorted(left):
        return None
    axes = ([a.index(n) for n in shared], [b.index(n) for n in shared])
    return axes, tuple(free.index(n) for n in left)


def worth(c: Contraction, ranges: dict, arrays: dict) -> bool:
    """Large enough, and every operand a float/complex array (BLAS types)."""
    work = 1
    for n in c.indices:
        work *= len(ranges[n])
    return work >= MIN_WORK and all(arrays[n].dtype.kind in "fc" for n in c.operands)


def run(c: Contraction, eq: Equation, arrays: dict, dtype, out=None):
    """Evaluate the contraction with numpy; returns the new array (`:=` without `out`) or the
    updated `out` (a `:=` given an output, as run_with_ranges gives one, overwrites it like `=`)."""
    if c.tensordot is not None:
        axes, perm = c.tensordot
        res = np.tensordot(arrays[c.operands[0]], arrays[c.operands[1]], axes=axes)
        res = res.transpose(perm) if perm != tuple(range(len(perm))) else res
    else:
        res = np.einsum(c.spec, *[arrays[n] for n in c.operands], optimize=True)
    for s in c.scale:
        res = res * (arrays[s] if isinstance(s, str) else s)
    if out is None:
        return np.array(res, dtype=dtype) if np.ndim(res) == 0 else np.asarray(res, dtype=dtype)
    if eq.assign in (":=", "="):
        out[...] = res
    elif eq.assign == "+=":
        out += res
    else:
        out -= res
    return out
