"""Equation -> Plan: loop order, which loop runs on threads, and guards (masks that restrict the
iteration, turned into clipped loop bounds by code generation).

Thread safety: an index is safe to split across threads when distinct values of it write
distinct output elements, i.e. it appears bare in some left-hand position.  Reduction indices and
indices that appear inside a shifted or gathered left-hand position are never split.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Access, Affine, Binary, Compare, Const, Equation, IndexValue, Param, Unary, Wrapped

# Below this many (iterations x body cost) a kernel runs on one thread: starting threads costs
# more than the work.
# Measured on the 2-core development machine (benchmarks/threshold.py): a numba prange loop costs
# ~2 us to start; a trivial body runs ~0.2-1 ns per iteration, so threads pay from ~16-32 K.
PARALLEL_WORK_THRESHOLD = 1 << 15
CHUNKS = 16      # blocks of a split reduction or scatter: fixed, so results do not depend on
                 # the thread count
SHORT = 16       # a parallel loop shorter than this is fused with the next safe loop
MIN_INNER = 4    # shorter loops are not worth running innermost
BLOCK = 128                 # rows of a reduction block (row form)
BLOCK_MIN_BYTES = 1 << 19   # block only when the streamed arrays exceed this (about L2 / 2)
SHORT_LOOP = 32  # an innermost loop this short gets constant bounds in large kernels
LANES = 8        # independent accumulators of a (max)/(min)/(+) over a contiguous loop


@dataclass(frozen=True)
class Loop:
    index: str
    parallel: bool = False
    reduction: bool = False


@dataclass(frozen=True)
class Linear:
    """sum(coef * symbol) + const, symbols being code (indices, parameters, `x.shape[0]`):
    loop bounds are built from these so the generated code reads `p - _lo_s + 1`, not
    `(0 - (-p)) - (_lo_s) + 1`."""
    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(terms=(), const: int = 0) -> "Linear":
        merged: dict[str, int] = {}
        for name, coef in terms:
            merged[name] = merged.get(name, 0) + coef
        return Linear(tuple((n, c) for n, c in merged.items() if c), const)

    @staticmethod
    def of_affine(a: Affine) -> "Linear":
        return Linear.of(a.terms, a.const)

    def __add__(self, other) -> "Linear":
        if isinstance(other, int):
            return Linear(self.terms, self.const + other)
        return Linear.of(self.terms + other.terms, self.const + other.const)

    def __neg__(self) -> "Linear":
        return Linear(tuple((n, -c) for n, c in self.terms), -self.const)

    def __sub__(self, other) -> "Linear":
        return self + (-other)

    def __str__(self) -> str:
        out = ""
        for name, coef in sorted(self.terms, key=lambda t: t[1] < 0):
            mag = abs(coef)
            term = name if mag == 1 else f"{mag}*{name}"
            out += (f" - {term}" if coef < 0 else f" + {term}") if out else (
                f"-{term}" if coef < 0 else term)
        if self.const:
            out += (f" + {self.const}" if self.const > 0 else f" - {-self.const}") if out else str(self.const)
        return out or "0"


@dataclass(frozen=True)
class Guard:
    """lo <= expr < hi must hold for an iteration to run; lo/hi are code (None: unbounded).
    A guard is applied at the loop of its innermost index.  A guard that involves a reduction
    index restricts the terms of the reduction and must be applied at a reduction loop; only a
    guard on left-hand indices alone may skip writing an element (a mask selecting elements)."""
    expr: Affine
    lo: Linear | None
    hi: Linear | None
    cond: str | None = None       # a general condition (e.g. i != j) checked with `if`


@dataclass(frozen=True)
class Plan:
    equation: Equation
    loops: tuple[Loop, ...]
    guards: tuple[Guard, ...]
    guarded_reads: frozenset      # ids (str of Access) of top-level pad reads turned into guards
    scatter: bool                 # left side keeps a gather or non-unit shift: combine per tuple
    out_dtype: str
    pad_value: object = 0
    fastmath: bool = False
    form: str = "scalar"          # "scalar": reductions innermost into a scalar accumulator;
                                  # "row": a left index innermost, reductions around it
    chunked: str | None = None    # index split into CHUNKS blocks under an outer prange
    partial: str | None = None    # "scalar" / "array": per-chunk partial results, combined after
    collapse: tuple = ()          # two outer safe loops fused into one prange loop
    lanes: int = 0                # lane-split accumulators on the innermost (contiguous) loop
    block: tuple = ()             # (index, size): row form, that reduction loop runs in blocks
                                  # (outermost, serial) so its rows of the streamed array stay
                                  # in cache across all rows of the output
    fixed: tuple = ()             # (index, start, stop): a short innermost loop's bounds, baked
                                  # in as constants so the compiler unrolls and vectorises it
    dtypes: tuple = ()            # (name, dtype) of the arrays and parameters read (dtypes.py):
                                  # the code computes each element as numpy would


def top_factors(e) -> list:
    """The factors of a product at the root of the right-hand side."""
    if isinstance(e, Binary) and e.op == "*":
        return top_factors(e.left) + top_factors(e.right)
    return [e]


def linear(e):
    """(Affine over indices, {param: coef}, const) for + - and constant * of indices, params and
    integer constants; None if e is not of that form."""
    if isinstance(e, IndexValue):
        return Affine(((e.name, 1),)), {}, 0
    if isinstance(e, Param):
        return Affine(), {e.name: 1}, 0
    if isinstance(e, Const) and isinstance(e.value, int):
        return Affine(), {}, e.value
    if isinstance(e, Unary) and e.op == "-":
        inner = linear(e.operand)
        return inner and _scale(inner, -1)
    if isinstance(e, Binary) and e.op in "+-":
        a, b = linear(e.left), linear(e.right)
        if a is None or b is None:
            return None
        return _add(a, _scale(b, 1 if e.op == "+" else -1))
    if isinstance(e, Binary) and e.op == "*":
        a, b = linear(e.left), linear(e.right)
        if a is None or b is None:
            return None
        for x, y in ((a, b), (b, a)):
            if not x[0].terms and not x[1]:
                return _scale(y, x[2])
    return None


def _scale(t, k):
    return t[0].scale(k), {p: c * k for p, c in t[1].items()}, t[2] * k


def _add(a, b):
    params = dict(a[1])
    for p, c in b[1].items():
        params[p] = params.get(p, 0) + c
    return a[0] + b[0], {p: c for p, c in params.items() if c}, a[2] + b[2]




def compare_guards(c: Compare) -> list[Guard] | None:
    """Guards equivalent to an index-only comparison, or None if it is not of that form."""
    out = []
    for op, a, b in zip(c.ops, c.operands, c.operands[1:]):
        la, lb = linear(a), linear(b)
        if la is None or lb is None or op == "!=":
            return None
        diff = _add(la, _scale(lb, -1))            # a - b = idx + params + const
        idx = Affine(diff[0].terms)
        if not idx.terms:
            return None
        neg = _scale(diff, -1)                     # idx  op  -(params + const)
        bound = Linear.of(tuple(neg[1].items()), neg[2])
        if op == "<":
            out.append(Guard(idx, None, bound))
        elif op == "<=":
            out.append(Guard(idx, None, bound + 1))
        elif op == ">":
            out.append(Guard(idx, bound + 1, None))
        elif op == ">=":
            out.append(Guard(idx, bound, None))
        else:
            out.append(Guard(idx, bound, bound + 1))
    return out


def index_only(e) -> bool:
    """An expression of indices, parameters and constants only (no array reads, no calls)."""
    from .ir import walk
    return all(isinstance(n, (IndexValue, Param, Const, Binary, Unary)) for n in walk(e))


def mask_guards(f) -> list[Guard] | None:
    """The guards of a top-level factor that is a comparison of indices, else None."""
    if not isinstance(f, Compare) or not all(index_only(x) for x in f.operands):
        return None
    if not any(isinstance(n, IndexValue) for x in f.operands for n in __import__(
            "tullio_py.ir", fromlist=["walk"]).walk(x)):
        return None
    g = compare_guards(f)
    if g is not None:
        return g
    names = []
    for x in f.operands:
        for n in __import__("tullio_py.ir", fromlist=["walk"]).walk(x):
            if isinstance(n, IndexValue) and n.name not in names:
                names.append(n.name)
    return [Guard(Affine(tuple((n, 1) for n in names)), None, None, str(f))]


def find_guards(eq: Equation, pad_value) -> tuple[list[Guard], set[str], list]:
    """Top-level mask factors become guards (they restrict the iteration).  Under a sum with
    pad value 0, a top-level pad read contributes nothing outside its array, so it becomes a
    guard too and the read needs no check."""
    guards, guarded, rest = [], set(), []
    for f in top_factors(eq.rhs):
        g = mask_guards(f)
        if g is not None:
            guards += g
            continue
        if (isinstance(f, Access) and eq.reducer == "+" and pad_value == 0 and not _scatter(eq)
                and any(isinstance(s, Wrapped) and s.kind == "pad" for s in f.indices)
                and all(not isinstance(s, Wrapped) or (s.kind == "pad" and isinstance(s.inner, Affine))
                        for s in f.indices)):
            reduced = set(eq.reduction_indices)
            pads = [(d, s) for d, s in enumerate(f.indices) if isinstance(s, Wrapped)]
            # A guard on left-hand indices only would skip writing elements that `:=`/`=` must
            # write (as the pad value): those reads keep their per-element check.  Under `+=`
            # and `-=` a skipped element is unchanged, which is what adding 0 gives.
            if eq.assign in ("+=", "-=") or all(reduced & set(s.names) for _, s in pads):
                for d, s in pads:
                    c = s.inner.const
                    guards.append(Guard(Affine(s.inner.terms), Linear((), -c),
                                        Linear(((f"{f.array}.shape[{d}]", 1),), -c)))
                guarded.add(str(f))
        rest.append(f)
    return guards, guarded, rest


def _scatter(eq: Equation) -> bool:
    return any(not isinstance(s, Affine) or (s.terms and not s.is_bare) for s in eq.lhs.indices)


def safe_indices(eq: Equation) -> set[str]:
    """Indices whose distinct values write distinct output elements."""
    unsafe = {n for s in eq.lhs.indices if not (isinstance(s, Affine) and s.is_bare) for n in s.names}
    return {s.names[0] for s in eq.lhs.indices
            if isinstance(s, Affine) and s.is_bare} - unsafe


def body_cost(eq: Equation) -> int:
    from .ir import Call, walk
    cost = 1
    for n in walk(eq.rhs):
        if isinstance(n, Call):
            cost += 10
        elif isinstance(n, Binary) and n.op in ("/", "**"):
            cost += 2
    return cost


def threading(eq: Equation, ranges: dict[str, range], threads, max_threads: int) -> bool:
    """Whether a call with these ranges compiles a parallel loop: enough work (iterations x
    body cost) to pay for starting threads.  `threads=False` or `threads=1` still get the
    parallel loop, run on one thread (numba vectorises the outlined parallel body better than
    the same loop compiled serially: 2.3 vs 4.5 ms on the local convolution)."""
    work = body_cost(eq)
    for n in eq.indices:
        work *= max(len(ranges[n]), 1)
    return work >= PARALLEL_WORK_THRESHOLD


def thread_count(threads, max_threads: int) -> int | None:
    """Threads a parallel kernel runs on: None for all, else the number asked for."""
    if threads is True:
        return None
    if threads is False:
        return 1
    return min(int(threads), max_threads)


def _strides(eq: Equation, ranges, layouts: dict | None, sizes: dict | None) -> dict:
    """For each index: (accesses it steps through with a stride, elements of the arrays it
    steps through contiguously).  `layouts[name]` lists an array's dimensions from the largest
    stride to the smallest (the last is contiguous; empty: none is); arrays without an entry
    are C-ordered."""
    layouts, sizes = layouts or {}, sizes or {}
    out: dict[str, list] = {n: [0, 0] for n in eq.indices}
    seen = set()
    for acc in [eq.lhs] + eq.accesses():
        if not acc.indices or str(acc) in seen:
            continue
        seen.add(str(acc))
        perm = layouts.get(acc.array, tuple(range(len(acc.indices))))
        slot = acc.indices[perm[-1]] if perm else None
        inner = slot.inner if isinstance(slot, Wrapped) else slot
        size = sizes.get(acc.array)
        if size is None:
            size = 1
            for s in acc.indices:
                size *= max(len(ranges[s.names[0]]), 1) if isinstance(s, Affine) and s.is_bare else 1
        for n in {x for s in acc.indices for x in s.names}:
            uses = [d for d, s in enumerate(acc.indices) if n in s.names]
            if (perm and uses == [perm[-1]] and isinstance(inner, Affine)
                    and abs(inner.coef(n)) == 1):
                out[n][1] += size
            else:
                out[n][0] += 1
    return out


def innermost(eq: Equation, ranges: dict[str, range], layouts=None, sizes=None) -> str | None:
    """The index to run innermost: the one with the fewest accesses that step through memory
    with a stride (those that do not use it are hoisted out of the loop; all others must be
    contiguous for the loop to vectorise), then the one touching the most elements
    contiguously.  Short loops (< MIN_INNER) do not qualify; ties go to reduction indices (the
    accumulator stays in a register), then to the later index."""
    st = _strides(eq, ranges, layouts, sizes)
    red = set(eq.reduction_indices)
    best, key = None, None
    for pos, n in enumerate(eq.indices):
        strided, contig = st[n]
        if len(ranges[n]) < MIN_INNER or not contig:
            continue
        k = (-strided, contig, n in red, pos)
        if key is None or k > key:
            best, key = n, k
    return best


def plan(eq: Equation, ranges: dict[str, range], out_dtype: str, threads=True,
         pad_value=0, fastmath=False, layouts=None, sizes=None) -> Plan:
    """Loop order, threading and accumulation form.  `threads` False means serial; anything
    else means split the work when it is large enough (the caller sets the thread count)."""
    scatter = _scatter(eq)
    guards, guarded, _ = find_guards(eq, pad_value)
    left = list(eq.lhs_indices)
    red = [n for n in eq.indices if n not in left]
    best = innermost(eq, ranges, layouts, sizes)
    form, row = "scalar", None
    if scatter:
        order = left + red
        if best is not None:
            order.remove(best)
            order.append(best)
    elif best in left and red:
        # The contiguous index is a left index: run it innermost, each reduction step updating
        # a whole row of the output (or of a small accumulator), reductions outside it.
        form, row = "row", best
        order = [n for n in left if n != best] + red + [best]
    else:
        if best in red:
            red.remove(best)
            red.append(best)
        elif best in left:
            left.remove(best)
            left.append(best)
        order = left + red
    parallel, chunked, partial, collapse = None, None, None, ()
    if threads is True or (threads is not False and isinstance(threads, int) and threads > 1):
        work = body_cost(eq)
        for n in order:
            work *= max(len(ranges[n]), 1)
        if work >= PARALLEL_WORK_THRESHOLD:
            safe = safe_indices(eq)
            cands = [n for n in order if n in safe and n != row and len(ranges[n]) >= 2]
            if cands:
                parallel = max(cands, key=lambda n: len(ranges[n]))
                order.remove(parallel)
                order.insert(0, parallel)
                others = [n for n in cands if n != parallel]
                guarded_idx = {n for g in guards for n in g.expr.names}
                # A short parallel loop leaves threads idle: fuse it with the next safe loop.
                if (len(ranges[parallel]) < SHORT and others and parallel not in guarded_idx
                        and others[0] not in guarded_idx):
                    second = max(others, key=lambda n: len(ranges[n]))
                    if second not in guarded_idx:
                        order.remove(second)
                        order.insert(1, second)
                        collapse = (parallel, second)
            elif row is not None and row in safe and len(ranges[row]) >= 2:
                parallel = chunked = row          # split the row index into blocks
            elif not scatter and not left and red:
                # Full reduction to a scalar: each chunk of the longest reduction loop keeps
                # its own partial result; the partials are combined in order at the end.
                chunked = max(red, key=lambda n: len(ranges[n]))
                partial = "scalar"
            elif scatter and (sizes or {}).get(eq.output, 1 << 62) * CHUNKS <= work:
                # Scatter without a safe index: per-chunk copies of the output, combined after.
                chunked = max(order, key=lambda n: len(ranges[n]))
                partial = "array"
    lanes = 0
    kind = np.dtype(out_dtype).kind
    if (form == "scalar" and not scatter and red and order[-1] == best and best in red
            and ((eq.reducer in ("max", "min") and kind in "fiu")
                 or (eq.reducer == "+" and kind == "f"))):
        lanes = LANES
    loops = tuple(Loop(n, n == parallel, n not in eq.lhs_indices) for n in order)
    fixed = ()
    inner = order[-1] if order else None
    if (inner is not None and threads is not False and form == "scalar" and inner in red
            and len(ranges[inner]) <= SHORT_LOOP and inner != chunked and inner not in collapse):
        # A short innermost reduction loop with constant bounds: the compiler unrolls it
        # (local convolution dW: 2.9 ms instead of 4.3 ms; one compile per distinct short
        # extent, large kernels only).  Row-form loops got slower with it (0.9 -> 1.9 ms).
        fixed = ((inner, ranges[inner].start, ranges[inner].stop),)
        lanes = 0
    block = ()
    if form == "row" and threads is not False and not chunked and not collapse:
        block = _reduction_block(eq, order, ranges, sizes or {})
    return Plan(eq, loops, tuple(guards), frozenset(guarded), scatter, out_dtype, pad_value,
                fastmath, form=form, chunked=chunked, partial=partial, collapse=collapse,
                lanes=lanes, fixed=fixed, block=block)


def _reduction_block(eq: Equation, order: list, ranges: dict, sizes: dict) -> tuple:
    """Cache blocking for the row form: when the array streamed along the first reduction loop
    and the row is larger than the cache, run that loop in blocks of BLOCK outside the output
    loops, so each block of rows is read once per thread instead of once per output row.
    Measured on a 512 float32 matmul with blas=False: 3.4 -> 2.8 ms by hand."""
    red = [n for n in order[:-1] if n not in eq.lhs_indices]
    row = order[-1]
    if not red or eq.finaliser or eq.reducer != "+" or eq.assign == "*=":
        return ()
    if any(a.array == eq.output for a in eq.accesses()):
        return ()
    first = red[0]
    if len(ranges[first]) < 2 * BLOCK:
        return ()
    streamed = [a.array for a in eq.accesses()
                if first in {n for s in a.indices for n in s.names}
                and row in {n for s in a.indices for n in s.names}]
    if sum(sizes.get(a, 0) for a in streamed) * 4 < BLOCK_MIN_BYTES:   # elements x 4 bytes
        return ()
    return (first, BLOCK)
