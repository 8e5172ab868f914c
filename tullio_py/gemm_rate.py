"""How fast a frontend's gemm and numpy's run on this machine, measured once.

A frontend may run the products of a call on its own BLAS (blas.gemm_provider: torch's, so
that its threads and the kernels' share one pool).  How fast that BLAS is against numpy's is a
fact of the machine, not of the code: on an AMD Zen 5 (2 cores, AVX-512) torch 2.13's MKL sgemm
ran 88-94 GFLOP/s on one thread where numpy's OpenBLAS 0.3.31 ran 140-210 (the shapes of
`SHAPES`, and 512^3), and a conv1d's forward and backward through torch's gemm took 11.5 ms
against 9.5 ms through numpy's; on an Intel machine MKL ran 275 GFLOP/s on 2 threads.  So the
rate of each is measured here (numpy's on one thread, a frontend's on its own thread setting),
float32, on the products of a convolution (a batch element's im2col gemm and the weight
gradient's), and kept in memory and in the cache directory: the frontend's choices
(frontends/torch.py: `torch_blas`, `torch_slowdown`) are the same for every call on this
machine, and cost one measurement (about 20 ms) per machine and thread count, not per process.

    rate("numpy", numpy_gemm), rate("torch 2.13.0 on 2 threads", gemm)  ->  flop/s

The stored rate is the best measured so far (a measurement on a loaded machine comes out low,
and `refresh=True` can only raise it), keyed by the provider's name and the CPU's model name,
so a cache directory carried to another machine measures again.  A measurement taken while
other threads were runnable (cpu_load.py's count, read before and after it) is stored as
provisional: each new process measures again, keeping the larger, until one measurement
found the machine quiet.  A first measurement of torch's gemm on 2 threads taken while a
test suite ran beside it stored 5 GFLOP/s (a quiet one: 172); the cost model then priced
torch's gemm 20x too slow and a conv2d NCHW weight gradient ran as loops, its forward and
backward 76 ms instead of 12 ms in every later process.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from . import blas_threads, cache, cpu_load, memo

# (m, k, n) of the measured products: conv1d's per-batch im2col gemm (64 outputs, 64 x 5
# taps, 256 positions) and a weight gradient's (64 x 8320 x 64).
SHAPES = ((64, 320, 256), (64, 8320, 64))
REPEAT = 7
_RATES = memo.Memo("gemm_rate.rates", 8)


@functools.cache
def _cpu() -> str:
    """The CPU's model name, family and model (a stored rate belongs to one kind of machine:
    an AMD Zen 4 and a Zen 5 may both call themselves "AMD EPYC")."""
    got = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in got:
                    got[key] = value.strip()
                if not line.strip() and got:
                    break
    except OSError:
        pass
    if got:
        return " / ".join(got[k] for k in ("model name", "cpu family", "model") if k in got)
    import platform
    return platform.processor() or platform.machine()


def _time(gemm, a, b, out) -> float:
    """Seconds of the fastest of REPEAT calls (after one to warm up)."""
    gemm(a, b, out)
    best = float("inf")
    for _ in range(REPEAT):
        t = time.perf_counter()
        gemm(a, b, out)
        best = min(best, time.perf_counter() - t)
    return best


def measure(gemm) -> float:
    """flop/s of `gemm(a, b, out)` (out = a @ b, float32 C-contiguous) over SHAPES, on the
    calling thread's settings."""
    rng = np.random.default_rng(0)
    flops = seconds = 0.0
    for m, k, n in SHAPES:
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        out = np.empty((m, n), np.float32)
        flops += 2.0 * m * n * k
        seconds += _time(gemm, a, b, out)
    return flops / seconds


def numpy_gemm(a, b, out):
    """np.matmul on this thread alone (where OpenBLAS lets it be set: blas_threads.py)."""
    if blas_threads.available():
        blas_threads.single(np.matmul, a, b, out)
    else:
        np.matmul(a, b, out=out)


def rate(name: str, gemm, refresh: bool = False, threads: int = 1) -> float:
    """The best measured flop/s of `gemm` (named `name`, running on `threads` threads), from
    memory, else the cache directory where a quiet measurement is stored, else measured now
    (the larger of it and a provisional stored one) and stored."""
    key = ("gemm rate", name, _cpu(), 2)      # (2: stored as (flop/s, quiet))
    got = _RATES.get(key)
    if got is not None and not refresh:
        return got
    stored = cache.load_pickle(key)
    if not (isinstance(stored, tuple) and len(stored) == 2):
        stored = None
    if stored is None or refresh or not stored[1]:
        calm = quiet(threads)
        new = measure(gemm)
        calm = calm and quiet(threads)
        got = new if stored is None else max(stored[0], new)
        cache.store_pickle(key, (got, calm or (stored is not None and stored[1])))
    else:
        got = stored[0]
    _RATES[key] = got
    return got


def quiet(threads: int = 1, text: str | None = None) -> bool:
    """Whether a measurement on `threads` threads has its CPUs to itself now: the runnable
    threads of the machine (/proc/loadavg, or `text` in its format), less the caller and the
    threads - 1 workers of its own pool, leave `threads` CPUs free.  True where the count
    cannot be read (nothing better is known)."""
    running = (cpu_load.Load(interval=0).read() if text is None   # (a reading of now)
               else cpu_load.parse_running(text))
    if running is None:
        return True
    others = running - 1 - (threads - 1)
    return others <= cpu_load.machine.cpus - threads
