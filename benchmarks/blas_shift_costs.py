"""Measure the constants of blas_shift.py's cost model on this machine (float32).

    python benchmarks/blas_shift_costs.py [--threads N]      # default 1

- PEAK, H, T_CALL: least-squares fit of  t = T_CALL + 2mnk/PEAK * (1 + H/m + H/n + H/k)  to
  np.matmul times over a grid of (m, n, k), weighted by 1/t (relative error);
- T_STEP: one step of blas_shift.run's loop on 1x1 matrices (view indexing, transpose,
  reshape, matmul call, accumulation), minus T_CALL;
- BW: bytes of a contiguous float32 view copied per second (copy of a 16 MB array);
- PENALTY: how much slower a copy whose contiguous runs are 4 elements long is;
- LOOP_RATE: flop/s of the generated loops (blas=False) on a conv1d and a conv2d.

Prints the values to paste into blas_shift.py; medians of several runs.  The numbers depend on
what else runs on the machine: say so next to them.
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[v] = str(args.threads)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402


def median_time(f, n=7):
    f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def fit_gemm(rng):
    rows, ts = [], []
    for m in (4, 16, 64, 256):
        for n in (4, 16, 64, 256, 1024):
            for k in (4, 16, 64, 256):
                a = rng.random((m, k), dtype=np.float32)
                b = rng.random((k, n), dtype=np.float32)
                t = median_time(lambda: np.matmul(a, b), 9)
                rows.append((1.0, m * n * k, n * k + m * k + m * n))
                ts.append(t)
    A = np.array(rows) / np.array(ts)[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones(len(ts)), rcond=None)
    t_call, a, ah = coef
    peak, h = 2.0 / a, ah / a
    pred = (np.array(rows) @ coef) / np.array(ts)
    return t_call, peak, h, float(np.median(np.abs(pred - 1)))


def step_time(rng):
    """The body of blas_shift.run's loop, operation for operation, on 1x1 matrices."""
    from numpy.lib.stride_tricks import as_strided
    x = rng.random((200, 1, 1), dtype=np.float32)
    w = rng.random((200, 1, 1), dtype=np.float32)
    out = np.zeros((200, 1, 1), np.float32)
    masters = (as_strided(x, (200, 1, 1), x.strides), as_strided(w, (200, 1, 1), w.strides))
    mo = as_strided(out, (200, 1, 1), out.strides)

    def loop():
        for s in range(200):
            xs = []
            for i in (0, 1):
                v = masters[i][tuple(s for _ in (0,))]
                xs.append(v.transpose(1, 0).reshape(1, 1))
            r = np.matmul(xs[0], xs[1]).reshape(1, 1)
            t = mo[tuple(s for _ in (0,))].transpose(0, 1)
            np.add(t, r, out=t, casting="unsafe")
    return median_time(loop) / 200


def copy_costs(rng):
    a = rng.random((2048, 2048), dtype=np.float32)
    b = np.empty_like(a)
    bw = a.nbytes / median_time(lambda: np.copyto(b, a))
    v = a.reshape(2048, 512, 4).transpose(1, 0, 2)      # runs of 4 elements
    c = np.empty(v.shape, np.float32)
    short = a.nbytes / median_time(lambda: np.copyto(c, v))
    return bw, bw / short


def loop_rate(rng):
    from tullio_py import kernel
    rates = []
    for expr, shapes, flops in (
            ("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", {"x": (32, 64, 260), "w": (64, 64, 5)},
             2 * 32 * 64 * 256 * 64 * 5),
            ("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]",
             {"x": (8, 32, 34, 34), "w": (32, 32, 3, 3)}, 2 * 8 * 32 * 32 * 32 * 32 * 9)):
        k = kernel(expr, blas=False, threads=args.threads)
        arrays = {n: rng.random(s, dtype=np.float32) for n, s in shapes.items()}
        rates.append(flops / median_time(lambda: k(**arrays), 5))
    return max(rates)


def main():
    rng = np.random.default_rng(0)
    t_call, peak, h, err = fit_gemm(rng)
    t_step = step_time(rng) - t_call
    bw, penalty = copy_costs(rng)
    lr = loop_rate(rng)
    print(f"threads={args.threads}  load average {os.getloadavg()}")
    print(f"PEAK = {peak:.3g}      # flop/s (gemm fit, median relative error {err:.0%})")
    print(f"H = {h:.3g}")
    print(f"T_CALL = {t_call:.3g}")
    print(f"T_STEP = {t_step:.3g}")
    print(f"BW = {bw:.3g}")
    print(f"PENALTY = {penalty:.3g}")
    print(f"LOOP_RATE = {lr:.3g}")


if __name__ == "__main__":
    main()
