"""Pure contractions -> BLAS through numpy.

A statement whose right-hand side is a product of array reads at bare indices (times scalar
parameters or constants), summed over the indices missing on the left, is exactly what
`np.einsum(optimize=True)` hands to BLAS (tensordot/matmul).  Generated loops reach a fraction
of BLAS speed on large contractions, so such statements dispatch there when the work is large;
the option `blas=False` keeps the generated loops.  Gradients of a contraction are contractions
too (`dA[i,j] += dC[i,k] * B[j,k]`), so gradient equations run through `tullio` dispatch alike.

Two reads whose indices split into batch (both reads and the left), m (first read and the
left), k (both reads, summed) and n (second read and the left) are one batched matrix product
(`Matmul`): `s[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d]` is q[b,h] @ k[b,h].T for every (b,h).  It
runs as one `np.matmul` over transposed views, written straight into a C-ordered output in
the left-hand order (einsum would return a transposed result, which makes every later
statement reading it stride through memory), with the scale factors applied in place.  A
frontend may supply its own batched gemm for the duration of its calls (`gemm_provider`):
torch's, on torch's threads, for calls with torch tensors (blas_shift.py's steps use it too).

Not dispatched: functions, masks, shifts, gathers, pads, other reductions, finalisers, `*=`,
`ranges=`, integer arrays (numpy's einsum has no integer BLAS), an output also read on the right,
a left index that no factor uses (a broadcast), or factors that all read every index (summed
elementwise products, with no element read twice: the loops' one pass is the fastest).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from . import memory
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
    matmul: Matmul | None = None   # two operands as one (batched) matrix product


@dataclass(frozen=True)
class Matmul:
    """out[batch..., m..., n...] = A[batch..., m..., k...] @ B[batch..., k..., n...]: each
    permutation takes an array's axes (the output's: left-hand order) to that order; `groups`
    = (batch, m, k, n) counts (m, k or n may hold several indices: merged by a reshape)."""
    a: tuple[int, ...]
    b: tuple[int, ...]
    out: tuple[int, ...]
    groups: tuple[int, int, int, int]


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
    if left and all({s.names[0] for s in a.indices} == used for a in reads):
        # every factor reads every index: sums of elementwise products, each element read
        # once (s[j] := A[i,j] * B[i,j]: a batch of dot products, which np.matmul ran over
        # strided views in 24 ms at 4096x512 float32, one pass of the loops 0.3 ms)
        return None
    letters = {}
    for n in eq.indices:
        letters[n] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(letters)]
        if len(letters) > 52:
            return None
    spec = (",".join("".join(letters[s.names[0]] for s in a.indices) for a in reads)
            + "->" + "".join(letters[n] for n in left))
    mm = _matmul(reads, left)
    return Contraction(spec, tuple(a.array for a in reads), tuple(scale), eq.indices,
                       None if mm is not None else _tensordot(reads, left), mm)


def _matmul(reads, left) -> Matmul | None:
    """The batched matrix product form of two reads, when every index is batch, m, k or n."""
    if len(reads) != 2:
        return None
    a, b = ([s.names[0] for s in r.indices] for r in reads)
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    batch = [n for n in left if n in a and n in b]
    m = [n for n in left if n in a and n not in b]
    n_ = [n for n in left if n in b and n not in a]
    k = [n for n in a if n in b and n not in left]
    if not k or set(a) != set(batch + m + k) or set(b) != set(batch + k + n_):
        return None
    return Matmul(tuple(a.index(x) for x in batch + m + k), tuple(b.index(x) for x in batch + k + n_),
                  tuple(left.index(x) for x in batch + m + n_),
                  (len(batch), len(m), len(k), len(n_)))


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


def covers(eq: Equation, rng: dict, arrays: dict, out_shape) -> bool:
    """Every bare index runs over exactly the whole extent of each dimension it indexes."""
    for acc in [eq.lhs] + eq.accesses():
        shape = out_shape if acc.array == eq.output else np.shape(arrays[acc.array])
        for d, s in enumerate(acc.indices):
            r = rng.get(s.names[0]) if isinstance(s, Affine) and s.is_bare else None
            if r is None or r.step != 1 or r.start != 0 or r.stop != shape[d]:
                return False
    return True


def run(c: Contraction, eq: Equation, arrays: dict, dtype, out=None):
    """Evaluate the contraction with numpy; returns the new array (`:=` without `out`) or the
    updated `out` (a `:=` given an output, as run_with_ranges gives one, overwrites it like `=`)."""
    if c.matmul is not None:
        return _run_matmul(c, eq, arrays, dtype, out)
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


# ----------------------------------------------------------------------------- batched gemm
gemms = threading.local()     # .f, .copy, .views: the provider of this Python thread's calls


class gemm_provider:
    """`with gemm_provider(f, copy):` batched matrix products of the contractions called from
    this Python thread go first to `f(a, b, out, alpha, beta)`, which computes
    out = alpha * (a @ b) + beta * out for numpy arrays a (..., M, K), b (..., K, N) and a
    view out (..., M, N) (beta 0: out is overwritten) and returns True, or returns False to
    leave the call to numpy; blas_shift.py's operand copies (im2col) go first to
    `copy(dst, src, add)` (dst[...] = src, or with `add` dst += src: a product taken into
    an output that is no matmul result; same shapes and dtype; False: numpy's).  A
    provider runs them on the frontend's own thread pool (torch's): blas_shift.py then runs
    its steps on the calling thread and starts no threads of its own.  `views(x)`: whether the
    frontend takes array x as it is; a caller that checked every array it slices its
    operands from with it (and that no output shares memory with a read) passes
    `checked=True` to `f` and `copy`, which then skip those checks on every step (a
    convolution's forward and gradients make about 200 such calls, at 4-7 us of checks each).
    `slow`: how much longer a product takes on the provider's gemm than the cost model counts
    (numpy's gemm on each of the pool's threads), measured by the frontend: blas_shift.py
    prices the pool's gemms with it."""
    __slots__ = ("f", "copy", "views", "slow", "old")

    def __init__(self, f, copy=None, views=None, slow=1.0):
        self.f, self.copy, self.views, self.slow = f, copy, views, slow

    def __enter__(self):
        self.old = (getattr(gemms, "f", None), getattr(gemms, "copy", None),
                    getattr(gemms, "views", None), getattr(gemms, "slow", 1.0))
        gemms.f, gemms.copy, gemms.views, gemms.slow = self.f, self.copy, self.views, self.slow
        return self

    def __exit__(self, *exc):
        gemms.f, gemms.copy, gemms.views, gemms.slow = self.old


def provider_slowdown() -> float:
    """The seconds of a product on the provider's gemm over the cost model's (numpy's gemm
    on each of the pool's threads): `slow`, measured by the frontend (gemm_rate.py); 1.0
    without a provider."""
    return getattr(gemms, "slow", 1.0) if pooled_gemm() else 1.0


def pooled_gemm() -> bool:
    """Whether a frontend's gemm (gemm_provider) takes this Python thread's products: then
    blas_shift.py's steps run one after another on the calling thread, on the frontend's own
    pool (blas_shift_run.run), rather than on Python threads."""
    return getattr(gemms, "f", None) is not None


def _merge(x: np.ndarray, lead: int, first: int):
    """x (lead axes, then two groups: `first` axes and the rest) as lead + 2 axes."""
    s = x.shape
    return x.reshape(s[:lead] + (int(np.prod(s[lead:lead + first])),
                                 int(np.prod(s[lead + first:]))))


def _out_view(o: np.ndarray, mm: Matmul):
    """The output (left-hand order) as (batch..., M, N) without copying, or None."""
    nb, nm, _, _ = mm.groups
    v = o.transpose(mm.out)
    r = v.reshape(v.shape[:nb] + (int(np.prod(v.shape[nb:nb + nm])),
                                  int(np.prod(v.shape[nb + nm:]))))
    return r if o.size == 0 or np.may_share_memory(r, o) else None   # (reshape copied)


def _scale(c: Contraction, arrays: dict):
    """The product of the scale factors as one Python number, or None when one is not a
    plain real or complex number."""
    alpha = 1
    for s in c.scale:
        v = arrays[s] if isinstance(s, str) else s
        v = v.item() if isinstance(v, np.ndarray | np.generic) else v
        if not isinstance(v, int | float | complex) or isinstance(v, bool):
            return None
        alpha = alpha * v
    return alpha


def _run_matmul(c: Contraction, eq: Equation, arrays: dict, dtype, out):
    mm = c.matmul
    nb, nm, nk, _ = mm.groups
    at, bt = arrays[c.operands[0]].transpose(mm.a), arrays[c.operands[1]].transpose(mm.b)
    a, b = _merge(at, nb, nm), _merge(bt, nb, nk)
    if out is None:                 # C-ordered in the left-hand order
        by_axis = at.shape[:nb + nm] + bt.shape[nb + nk:]
        out = memory.empty(tuple(by_axis[k] for k in np.argsort(mm.out)), dtype)
        assign = "="
    else:
        assign = "=" if eq.assign == ":=" else eq.assign
    view = _out_view(out, mm) if out.flags.writeable else None
    if view is not None and view.ndim >= 2 and view.strides[-1] != view.itemsize \
            and view.strides[-2] == view.itemsize:
        # a column-major result (dv[b,h,j,d] += do[b,h,i,d] * p[b,h,i,j]): out^T = b^T a^T,
        # so the gemm writes rows (torch's batched gemm into a transposed output took 100x)
        a, b, view = b.swapaxes(-1, -2), a.swapaxes(-1, -2), view.swapaxes(-1, -2)
    f = getattr(gemms, "f", None)
    if f is not None and view is not None:
        alpha = _scale(c, arrays)
        if (alpha is not None and (not isinstance(alpha, complex) or out.dtype.kind == "c")
                and f(a, b, view, -alpha if assign == "-=" else alpha, int(assign != "="))):
            return out
    if assign == "=" and view is not None and np.can_cast(np.result_type(a, b), out.dtype,
                                                          "same_kind"):
        np.matmul(a, b, out=view)
        for s in c.scale:
            np.multiply(out, arrays[s] if isinstance(s, str) else s, out=out)
        return out
    res = np.matmul(a, b)
    for s in c.scale:
        res = res * (arrays[s] if isinstance(s, str) else s)
    target = view if view is not None else out.transpose(mm.out)
    res = res.reshape(target.shape)
    if assign == "=":
        target[...] = res
    elif assign == "+=":
        target += res
    else:
        target -= res
    return out
