"""Measure the constants of blas_shift.py's cost model on this machine (float32).

    python benchmarks/blas_shift_costs.py [--threads N]      # default 1
    python benchmarks/blas_shift_costs.py --validate         # the model's choice vs measured

- PEAK, H, T_CALL: least-squares fit of  t = T_CALL + 2mnk/PEAK * (1 + H/m + H/n + H/k)  to
  np.matmul times over a grid of (m, n, k), weighted by 1/t (relative error);
- T_STEP: one step of blas_shift.run's loop on 1x1 matrices (view indexing, transpose,
  reshape, matmul call, accumulation), minus T_CALL;
- BW: bytes of a contiguous float32 view copied per second (copy of a 16 MB array);
- BW_CACHE: the same for a 256 KB array copied again and again (it stays in the cache);
- PENALTY: how much slower a copy whose contiguous runs are 4 elements long is;
- LOOP_RATE: flop/s of the generated loops (blas=False) on a conv1d and a conv2d;
- TRANS_B: the extra time of a gemm whose right operand is a transposed view (`trans_b`).

Prints the values to paste into blas_shift_cost.py; medians of several runs.  The numbers depend on
what else runs on the machine: say so next to them.
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--validate", action="store_true",
                    help="instead: time every candidate plan of a few layers against the model")
args = parser.parse_args()
for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[v] = str(args.threads)
os.environ["TULLIO_LOAD_AWARE"] = "0"       # constants of exactly --threads threads (cpu_load.py)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np


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
                t = median_time(lambda a=a, b=b: np.matmul(a, b), 9)
                rows.append((1.0, m * n * k, n * k + m * k + m * n))
                ts.append(t)
    A = np.array(rows) / np.array(ts)[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones(len(ts)), rcond=None)
    t_call, a, ah = coef
    peak, h = 2.0 / a, ah / a
    pred = (np.array(rows) @ coef) / np.array(ts)
    return t_call, peak, h, float(np.median(np.abs(pred - 1)))


def trans_b(rng):
    """TRANS_B: a gemm whose right operand is a transposed view (its columns contiguous: BLAS's
    "T" for B) takes 1 + TRANS_B/m times the time of the same product with both in C order
    (OpenBLAS packs a transposed B more slowly; the cost grows with B against the m rows of
    A that share its packing).  The median of m * (t_T / t_N - 1) over a grid."""
    fits = []
    for m in (32, 64, 128, 320):
        for n in (64, 288, 1024):
            for k in (256, 1024):
                a = rng.random((m, k), dtype=np.float32)
                b = rng.random((k, n), dtype=np.float32)
                bt = np.ascontiguousarray(b.T).T
                out = np.empty((m, n), np.float32)
                t_n = median_time(lambda a=a, b=b, out=out: np.matmul(a, b, out=out), 9)
                t_t = median_time(lambda a=a, b=bt, out=out: np.matmul(a, b, out=out), 9)
                fits.append(m * (t_t / t_n - 1))
    return float(np.median(fits))


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
    s = a[:256, :256]
    d = np.empty_like(s)

    def small():
        for _ in range(50):
            np.copyto(d, s)
    cached = 50 * s.nbytes / median_time(small)
    return bw, bw / short, cached


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
        rates.append(flops / median_time(lambda k=k, arrays=arrays: k(**arrays), 5))
    return max(rates)


def validate():
    """For conv1d/conv2d forward and gradient statements: every candidate plan (one per set of
    looped indices, each with its cheapest arrangement) timed, next to the model's cost."""
    from tullio_py import blas_shift, blas_shift_cost, kernel
    rng = np.random.default_rng(0)
    cases = [
        ("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", {"x": (32, 64, 260), "w": (64, 64, 5)}, None),
        ("dx[b,c,i+j] += dy[b,o,i] * w[o,c,j]", {"dy": (32, 64, 256), "w": (64, 64, 5)},
         (32, 64, 260)),
        ("dw[o,c,j] += dy[b,o,i] * x[b,c,i+j]", {"dy": (32, 64, 256), "x": (32, 64, 260)},
         (64, 64, 5)),
        ("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]",
         {"x": (16, 32, 34, 34), "w": (64, 32, 3, 3)}, None),
        ("y[b,h,v,o] := x[b,h+i,v+j,c] * w[i,j,c,o]",
         {"x": (16, 34, 34, 32), "w": (3, 3, 32, 64)}, None),
        ("dw[o,c,i,j] += dy[b,o,h,v] * x[b,c,h+i,v+j]",
         {"dy": (16, 64, 32, 32), "x": (16, 32, 34, 34)}, (64, 32, 3, 3)),
        ("dx[b,c,h+i,v+j] += dy[b,o,h,v] * w[o,c,i,j]",
         {"dy": (16, 64, 32, 32), "w": (64, 32, 3, 3)}, (16, 32, 34, 34)),
        ("dx[b,h+i,v+j,c] += dy[b,h,v,o] * w[i,j,c,o]",
         {"dy": (16, 32, 32, 64), "w": (3, 3, 32, 64)}, (16, 34, 34, 32)),
        ("dw[i,j,c,o] += dy[b,h,v,o] * x[b,h+i,v+j,c]",
         {"dy": (16, 32, 32, 64), "x": (16, 34, 34, 32)}, (3, 3, 32, 64)),
        ("y[b,c,i] := x[b,c,i+j] * w[c,j]", {"x": (32, 64, 260), "w": (64, 5)}, None),
        ("dw[c,j] += dy[b,c,i] * x[b,c,i+j]", {"dy": (32, 64, 256), "x": (32, 64, 260)},
         (64, 5)),
    ]
    agree = 0
    for expr, shapes, out_shape in cases:
        k = kernel(expr)
        arrays = {n: rng.random(s, dtype=np.float32) for n, s in shapes.items()}
        eq = k.equation
        if out_shape is None:
            from tullio_py.ranges import output_shape
            rngs = k.ranges(**arrays)
            out_shape = tuple(output_shape(eq, rngs))
        out = np.zeros(out_shape, np.float32)
        rngs = k.ranges(**arrays, **({eq.output: out} if eq.assign != ":=" else {}))
        plans = blas_shift.candidates(k._shift, arrays, rngs, out.shape, out.strides, out.dtype)
        rows = []
        least = min(p.cost for p in plans)
        for p in plans:
            if p.cost > 6 * least:      # far off: not worth timing
                continue
            t = median_time(lambda p=p, k=k, arrays=arrays, out=out:
                           blas_shift.run(p, k._shift, arrays, out, False, p.write), 5)
            rows.append((p.cost, t, p))
        chosen = min(rows, key=lambda r: r[0])
        fastest = min(rows, key=lambda r: r[1])
        agree += chosen is fastest
        loops = kernel(expr, blas=False, threads=args.threads)
        t_loops = median_time(lambda: loops(**arrays, **({eq.output: out.copy()}
                                                         if eq.assign != ":=" else {})), 5)
        print(f"{expr}   (loops, blas=False: {t_loops * 1e3:.3f} ms; model "
              f"{2e3 * np.prod([len(r) for r in rngs.values()]) / blas_shift_cost.LOOP_RATE:.3f} ms)")
        for cost, t, p in sorted(rows, key=lambda r: r[1]):
            mark = "*" if r_is(p, chosen[2]) else " "
            print(f"  {mark} loop over {p.loop or '()'}: model {cost * 1e3:8.3f} ms, "
                  f"measured {t * 1e3:8.3f} ms  {'im2col' if p.im2col else ''}")
        print(f"  chosen/fastest measured: {chosen[1] / fastest[1]:.2f}")
    print(f"the model picked the fastest plan in {agree} of {len(cases)} cases "
          f"(load average {os.getloadavg()})")


def r_is(a, b):
    return a is b


def main():
    if args.validate:
        return validate()
    rng = np.random.default_rng(0)
    t_call, peak, h, err = fit_gemm(rng)
    t_step = step_time(rng) - t_call
    bw, penalty, bw_cache = copy_costs(rng)
    lr = loop_rate(rng)
    tb = trans_b(rng)
    print(f"threads={args.threads}  load average {os.getloadavg()}")
    print(f"PEAK = {peak:.3g}      # flop/s (gemm fit, median relative error {err:.0%})")
    print(f"H = {h:.3g}")
    print(f"T_CALL = {t_call:.3g}")
    print(f"T_STEP = {t_step:.3g}")
    print(f"BW = {bw:.3g}")
    print(f"BW_CACHE = {bw_cache:.3g}")
    print(f"PENALTY = {penalty:.3g}")
    print(f"LOOP_RATE = {lr:.3g}")
    print(f"TRANS_B = {tb:.3g}")


if __name__ == "__main__":
    main()
