"""`Kernel.explain(**arrays)`: what one call runs, how much work it is, and how close to the
machine it gets.

For the given arrays: the path (BLAS for a pure contraction over whole arrays, BLAS over
strided views with its plan, or the generated loops with their order and threading), the
statement's FLOPs (operations of the right-hand side per index tuple) and bytes (arrays read,
output written), the measured time (median of a few calls; in-place outputs are updated on a
copy), and the fraction of the machine's limit reached: the larger of FLOPs / sgemm peak and
bytes / copy bandwidth, over the time.  The limit is that of the threads the call runs on (one
for serial loops, the split loops' count, BLAS's own threads for BLAS): a call on one thread of
a two-core machine is measured against one core, not against both.  The peak and the
bandwidth are measured on that many threads (a float32 1024 matmul with numpy's BLAS set to
that many threads, and a 64 MB copy in as many slabs, one per thread) and stored in the
tullio_py cache directory per thread count; the stored value is the best measured so far
(`limits`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import bind as binding
from . import blas as _blas
from . import blas_shift, cache, jit, memo, relayout
from .relayout import standin
from .ir import Binary, Call, Compare, Unary, walk


@dataclass(frozen=True)
class Explanation:
    path: str             # "blas", "blas_shift" or "loops"
    detail: str           # the plan in words
    threads: str
    flops: int
    bytes: int
    seconds: float
    peak_flops: float     # float32 sgemm flop/s of this machine on limit_threads threads
    bandwidth: float      # copy bytes/s of this machine on limit_threads threads
    limit_threads: int = 1    # the threads the call runs on

    @property
    def fraction(self) -> float:
        """max(flops / peak, bytes / bandwidth) / measured time (1.0: at the machine's limit)."""
        return max(self.flops / self.peak_flops, self.bytes / self.bandwidth) / self.seconds

    def __str__(self):
        return (f"path: {self.path}: {self.detail}\nthreads: {self.threads}\n"
                f"work: {self.flops:.4g} flop, {self.bytes:.4g} bytes\n"
                f"time: {self.seconds * 1e3:.3f} ms ({self.flops / self.seconds / 1e9:.2f} "
                f"GFLOP/s, {self.bytes / self.seconds / 1e9:.2f} GB/s)\n"
                f"machine on {self.limit_threads} thread{'s' * (self.limit_threads > 1)}: "
                f"{self.peak_flops / 1e9:.0f} GFLOP/s sgemm, {self.bandwidth / 1e9:.1f} GB/s "
                f"copy -> {self.fraction:.1%} of the limit")


def explain(k, arrays: dict, repeat: int = 5) -> Explanation:
    eq = k.equation
    b = binding.bind(eq, k.options, dict(arrays))
    path, detail, threads, used = _described(k, b)
    collected, rng, dtype, shape = b.arrays, b.ranges, b.dtype, b.shape
    out = collected.get(eq.output) if eq.assign != ":=" else None
    flops = _flops(eq, rng)
    nbytes = sum(collected[a].nbytes for a in dict.fromkeys(eq.arrays)
                 if isinstance(collected[a], np.ndarray))
    nbytes += int(np.prod(shape)) * dtype.itemsize * (2 if out is not None else 1)
    seconds = _time(k, arrays, repeat)
    peak, bw = limits(threads=used)
    return Explanation(path, detail, threads, int(flops), int(nbytes), seconds, peak, bw, used)


def report_path(k, arrays: dict) -> None:
    """verbose=2: print the path a numpy call of Kernel `k` takes and its threads, in
    explain's words (without running or timing it), once per call signature (`k.described`;
    replayed calls do not come here, BLAS calls do every time)."""
    from .signature import CallSignature
    try:
        b = binding.bind(k.equation, k.options, dict(arrays))
    except Exception:       # (the call itself reports bad arguments)
        return
    key = CallSignature.of(b.arrays, b.ranges, b.dtype, b.shape)
    if key not in k.described:
        k.described.add(key)
        path, detail, threads, _ = _described(k, b)
        print(f"tullio_py: {k.equation}: {path}: {detail}; threads: {threads}")


def _described(k, b):
    """(path, detail, threads in words, thread count) of a call of Kernel `k` bound as `b`."""
    eq = k.equation
    out = b.arrays.get(eq.output) if eq.assign != ":=" else None
    path, detail, shared = _path(k, b.arrays, b.ranges, out, b.shape, b.dtype)
    if shared > 1:
        return path, detail, f"{shared} Python threads, single-threaded gemms", shared
    if path != "loops":
        return path, detail, "BLAS's own threads", jit.max_threads()
    threads, used = _loop_threads(k.threads, "parallel" in detail)
    return path, detail, threads, used


def _loop_threads(option, parallel: bool) -> tuple[str, int]:
    """(in words, count) the threads that generated loops with the `threads` option run on."""
    if not parallel:
        return "1", 1
    from . import schedule
    n = schedule.thread_count(option, jit.max_threads()) or jit.max_threads()
    return f"{n} (numba prange, {jit.pool()})", n


def _flops(eq, rng: dict) -> int:
    """Operations of the right-hand side per index tuple (and the accumulation, where there
    is one), times the index tuples."""
    tuples = 1
    for r in rng.values():
        tuples *= len(r)
    ops = sum(1 for e in walk(eq.rhs) if isinstance(e, (Binary, Unary, Call, Compare)))
    return tuples * (ops + (1 if eq.reduction_indices or eq.assign != ":=" else 0))


def explain_chain(chain, arrays: dict, repeat: int = 5) -> Explanation:
    """`Chain.explain`: how a call of a chain (chain.py) with these numpy arrays runs, step by
    step in run order: a row group as one parallel pass over blocks of rows (the row index,
    the rows a block, the temporaries that live in per-thread buffers of a block), any other
    statement as its own Kernel's path.  FLOPs: the statements' sum.  Bytes: the chain's
    inputs read once and its result written once, and each temporary that reaches memory
    written and read once (those in per-thread buffers count nothing).  The time is a whole
    call's, the limit that of the chain's threads.  Softmax, 4096x512 float32, on two
    threads: `statements 1-4 (m, e, z, y): one parallel pass over blocks of 2 rows of i; m, e,
    z in per-thread buffers`, 10.5 Mflop, 16.8 MB (x read, y written)."""
    spec = chain.spec
    bound, values = chain.bindings(arrays)
    # (a chain with a gather runs its statements one by one: no plan of row groups)
    steps = [None] * len(spec.parts) if chain.gathers else chain.plan(dict(arrays), True)[0]
    words, parallel, local = [], False, set()
    for j, st in enumerate(steps):
        if st is None or st.rows is None:
            k = j if st is None else st.members[0]
            b, kern = bound[k], chain.kernels[k]
            # (a chain's statements are all `:=`: no output passed in)
            path, detail, _ = _path(kern, b.arrays, b.ranges, None, b.shape, b.dtype)
            parallel |= path != "loops" or "parallel" in detail
            words.append(f"statement {k + 1} ({spec.defined[k]}): {detail}")
            continue
        consts = dict(st.rows.consts)
        index = next(n[len("_start_"):] for n in consts
                     if n.startswith("_start_") and not n.endswith("_"))
        first, last = st.members[0] + 1, st.members[-1] + 1
        names = ", ".join(spec.defined[m] for m in st.members)
        kept = ", ".join(st.rows.local)
        local |= set(st.rows.local)
        parallel |= st.rows.source.parallel
        how = "parallel pass" if st.rows.source.parallel else "pass"
        words.append(f"statements {first}-{last} ({names}): one {how} over blocks of "
                     f"{consts['_rows']} rows of {index}"
                     + (f"; {kept} in per-thread buffers" if kept else ""))
    threads, used = _loop_threads(chain.threads, parallel)
    flops = sum(_flops(p.equation, b.ranges) for p, b in zip(spec.parts, bound))
    nbytes = sum(v.nbytes for n, v in arrays.items() if isinstance(v, np.ndarray))
    nbytes += values[spec.result].nbytes
    nbytes += 2 * sum(values[t].nbytes for t in spec.defined
                      if t != spec.result and t not in local)
    seconds = float(np.median(_times(lambda: lambda: chain(**arrays), repeat)))
    peak, bw = limits(threads=used)
    return Explanation("chain", "; ".join(words), threads, int(flops), int(nbytes), seconds,
                       peak, bw, used)


def _path(k, arrays, rng, out, shape, dtype):
    if k.blas_plan is not None and _blas.worth(k.blas_plan, rng, arrays):
        return "blas", f"pure contraction over whole arrays: einsum {k.blas_plan.spec}", 1
    if k.shift_plan is not None:
        strides = out.strides if out is not None else tuple(
            np.empty(shape, dtype).strides)
        from .frontends.numpy import loops_blocked, shift_groups, shift_threads
        p = k.shift_plan.plan(arrays, rng, shape, strides, dtype, shift_groups(),
                              loops_blocked(k, arrays, rng, dtype, shape))
        if p is not None:
            how = (f"loop over {', '.join(p.loop)} ({int(np.prod(p.steps))} steps) of "
                   if p.loop else "one ")
            kind = ("gemm over a zero-padded im2col copy (gather form)" if getattr(
                p, "gather", False) else "gemm after an im2col copy" if p.im2col else
                "np.matmul over strided views")
            col2im = (f", added into the output for each {', '.join(p.scatter)} (col2im)"
                      if p.scatter else ", summed over the steps, then added into the output"
                      " once" if getattr(p, "accumulate", False) else "")
            n = blas_shift.step_threads(p, shift_groups(), shift_threads(k))
            shared = f"; steps of {p.loop[0]} shared by {n} threads" if n > 1 else ""
            return "blas_shift", (f"{how}{kind}, result {p.res_shape}{col2im}{shared}; "
                                  f"model {p.cost * 1e3:.3f} ms"), n
    from .frontends.numpy import relaid
    moved, copies = relaid(k, arrays, rng, out if out is not None else standin(shape, dtype)), ""
    if moved is not None:
        axes, eq, rng = moved
        shape = relayout.target_shape(axes, k.equation.output, shape)
        k, arrays = k.kernel_for(eq), relayout.copies(arrays, axes, run=False)
        copies = "".join(f" on {relayout.Copy.of(a).describe(n)}" for n, a in axes.items())
        copies = f"{copies} (relayout.py: {eq})"
    plan, _, _ = k.plan_for(arrays, rng, dtype, shape)
    order = ", ".join(f"{l.index}{' (parallel)' if l.parallel else ''}" for l in plan.loops)
    jam = (f"; register-blocked: {plan.jam[1]} values of {plan.jam[0]} at once, tiles of "
           f"{plan.jam[2]}" if plan.jam else "")
    return "loops", f"generated loops{copies}, order {order} (outer to inner){jam}", 1


def _times(f, n: int) -> list[float]:
    """Seconds of n calls of f() after one warm-up call; f returns what it wants timed (a
    zero-argument function), so setup stays outside the timing."""
    f()()
    ts = []
    for _ in range(n):
        run = f()
        t = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t)
    return ts


def _time(k, arrays: dict, repeat: int) -> float:
    eq = k.equation

    def call():
        a = dict(arrays)
        if eq.assign != ":=":       # an in-place statement runs on a fresh copy each time
            a[eq.output] = np.array(arrays[eq.output], copy=True)
        return lambda: k(**a)
    return float(np.median(_times(call, repeat)))


_LIMITS = memo.Memo("explain.limits", 16)     # thread count -> limits


def limits(refresh: bool = False, threads: int | None = None) -> tuple[float, float]:
    """(sgemm flop/s, copy bytes/s) of this machine on `threads` threads (None: numba's
    count, all of them by default): the best measured so far, cached in memory and on disk
    per thread count.

    A measurement taken while other processes share the cores comes out low (on a 2-core
    machine at load 8, 63 GFLOP/s instead of 360), and every fraction computed from it comes
    out high, above 100 %.  A limit is the most the machine can do, so the stored value is the
    maximum over measurements: `refresh=True` (benchmarks/bench_limits.py does this) measures
    again and can only raise it.
    """
    n = max(1, int(threads or jit.max_threads()))
    key = ("machine limits", 2, n)
    got = _LIMITS.get(key)
    if got is not None and not refresh:
        return got
    stored = cache.load_pickle(key)
    if stored is None or refresh:
        new = _measure(n)
        got = new if stored is None else (max(stored[0], new[0]), max(stored[1], new[1]))
        cache.store_pickle(key, got)
    else:
        got = stored
    _LIMITS[key] = got
    return got


def _measure(threads: int) -> tuple[float, float]:
    """sgemm flop/s with numpy's BLAS on `threads` threads (OpenBLAS's setting, blas_threads.py;
    where it cannot be set, on BLAS's own count), and the bytes/s of a 64 MB copy made in
    `threads` slabs at once (numpy's copy releases the GIL)."""
    from . import blas_threads
    rng = np.random.default_rng(0)
    a = rng.random((1024, 1024), dtype=np.float32)
    b = rng.random((8 << 20,))        # 64 MB
    c = np.empty_like(b)
    cut = [len(b) * k // threads for k in range(threads + 1)]
    slabs = [lambda lo=lo, hi=hi: np.copyto(c[lo:hi], b[lo:hi]) for lo, hi in zip(cut, cut[1:])]
    with blas_threads.gemm_threads(threads):
        peak = 2 * 1024 ** 3 / min(_times(lambda: lambda: a @ a, 5))
    if threads == 1:
        bw = 2 * b.nbytes / min(_times(lambda: slabs[0], 5))
        return float(peak), float(bw)
    from concurrent.futures import ThreadPoolExecutor, wait
    with ThreadPoolExecutor(threads - 1) as pool:       # this thread copies the first slab
        def copy():
            futures = [pool.submit(f) for f in slabs[1:]]
            slabs[0]()
            wait(futures)
        bw = 2 * b.nbytes / min(_times(lambda: copy, 5))
    return float(peak), float(bw)
