"""exp in a generated CPU loop: the softmax statement e[i,j] := exp(x[i,j] - m[i]) against
numpy's np.exp(x - m[:, None]) and the division statement next to it in a softmax.

    python benchmarks/bench_vecmath.py [--threads 1 2] [--rounds 30]

4096 x 512, float32 and float64.  Each thread count runs in a fresh subprocess with NUMBA and
BLAS threads set to it.  Outputs are checked against float64 numpy first; times are medians
and minima over interleaved rounds (each round calls every competitor once): on a shared
machine the minimum is the steadier of the two.  To compare two versions
of tullio_py, run it with PYTHONPATH pointing at each checkout.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def worker(threads: int, rounds: int):
    import numpy as np

    from tullio_py import kernel
    exp = kernel("e[i,j] := exp(x[i,j] - m[i])", threads=threads)
    div = kernel("y[i,j] := e[i,j] / z[i]", threads=threads)
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal((4096, 512)) * 4).astype(dtype)
        m = x.max(axis=1)
        e = np.exp(x - m[:, None])
        z = e.sum(axis=1)
        want = np.exp((x - m[:, None]).astype(np.float64))     # of the rounded difference
        got = exp(x=x, m=m)
        rtol = 4 * np.finfo(dtype).eps
        np.testing.assert_allclose(got, want, rtol=rtol)
        np.testing.assert_allclose(div(e=e, z=z), e / z[:, None], rtol=rtol)
        runs = {"tullio exp": lambda: exp(x=x, m=m), "np.exp(x - m)": lambda: np.exp(x - m[:, None]),
                "tullio e / z": lambda: div(e=e, z=z)}
        times = {k: [] for k in runs}
        for _ in range(rounds):
            for k, f in runs.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        for k in runs:
            print(f"threads {threads} {np.dtype(dtype).name:8s} {k:14s} median "
                  f"{med[k] * 1e3:7.2f} ms ({med[k] / med['np.exp(x - m)']:5.2f}x np.exp), min "
                  f"{low[k] * 1e3:7.2f} ms ({low[k] / low['np.exp(x - m)']:5.2f}x)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--worker", type=int)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.rounds)
        return
    for n in a.threads:
        env = {**os.environ, **{k: str(n) for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                                                    "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
        subprocess.run([sys.executable, __file__, "--worker", str(n), "--rounds", str(a.rounds)],
                       env=env, check=True)


if __name__ == "__main__":
    main()
