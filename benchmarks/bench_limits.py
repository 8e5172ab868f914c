"""How close each statement of the benchmark layers, and each of its gradient statements run on
its own, gets to the machine's limit: `Kernel.explain` per statement, float32 numpy arrays.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_limits.py [--threads 2]

For every statement (the forward statements of bench_layers.py and bench_suite.py, and every
statement of `Kernel.gradient_kernels()`, the gradient equations tullio_py prints): the path
that runs (BLAS, BLAS over strided views, generated loops and their form), the measured time,
and the fraction of the machine's limit max(FLOPs / sgemm peak, bytes / copy bandwidth) / time,
with the peak and bandwidth on the threads the statements run on (`--threads`: one core's limit
for one thread) that `explain.limits(refresh=True)` measures at the start (the stored limits
are the best measured so far: run this on a quiet machine).  Statements under 25 % are
marked.  Gradient statements are timed one at a time here; `Kernel.vjp` may fuse them into one
nest.  Writes benchmarks/results/bench_limits.json (bench_limits_<tag>.json with --tag).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

B, H, T, D = 8, 8, 128, 64
SCALARS = {"scale": 1.0 / D ** 0.5, "inv_n": 1.0 / 512, "eps": 1e-5}

# (layer, statement, {array: shape}); shapes as in bench_layers.py and bench_suite.py
STATEMENTS = [
    ("conv1d", "y[b,o,i] := x[b,c,i+j] * w[o,c,j]", {"x": (32, 64, 260), "w": (64, 64, 5)}),
    ("conv2d_nchw", "y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]",
     {"x": (16, 32, 34, 34), "w": (64, 32, 3, 3)}),
    ("conv2d_nhwc", "y[b,h,v,o] := x[b,h+i,v+j,c] * w[i,j,c,o]",
     {"x": (16, 34, 34, 32), "w": (3, 3, 32, 64)}),
    ("depthwise_conv1d", "y[b,c,i] := x[b,c,i+j] * w[c,j]", {"x": (32, 64, 260), "w": (64, 5)}),
    ("causal_attention", "s[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d] * scale",
     {"q": (B, H, T, D), "k": (B, H, T, D)}),
    ("causal_attention", "(max) m[b,h,i] := s[b,h,i,j] * (j <= i)", {"s": (B, H, T, T)}),
    ("causal_attention", "e[b,h,i,j] := exp(s[b,h,i,j] - m[b,h,i]) * (j <= i)",
     {"s": (B, H, T, T), "m": (B, H, T)}),
    ("causal_attention", "z[b,h,i] := e[b,h,i,j]", {"e": (B, H, T, T)}),
    ("causal_attention", "p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]", {"e": (B, H, T, T), "z": (B, H, T)}),
    ("causal_attention", "o[b,h,i,d] := p[b,h,i,j] * v[b,h,j,d]",
     {"p": (B, H, T, T), "v": (B, H, T, D)}),
    ("layer_norm", "mu[i] := x[i,j] * inv_n", {"x": (4096, 512)}),
    ("layer_norm", "var[i] := (x[i,j] - mu[i])**2 * inv_n", {"x": (4096, 512), "mu": (4096,)}),
    ("layer_norm", "y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]",
     {"x": (4096, 512), "mu": (4096,), "var": (4096,), "g": (512,), "bb": (512,)}),
    ("locally_connected2d", "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s,t,i,j,c1,c2]",
     {"x": (32, 32, 8, 16), "W": (30, 30, 3, 3, 8, 16)}),
    ("max_pool2d", "(max) y[b,c,h,v] := x[b,c,2h+i,2v+j]", {"x": (16, 32, 64, 64)}),
    ("softmax", "(max) m[i] := x[i,j]", {"x": (4096, 512)}),
    ("softmax", "e[i,j] := exp(x[i,j] - m[i])", {"x": (4096, 512), "m": (4096,)}),
    ("softmax", "z[i] := e[i,j]", {"e": (4096, 512)}),
    ("softmax", "y[i,j] := e[i,j] / z[i]", {"e": (4096, 512), "z": (4096,)}),
    ("suite local conv", "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
     {"x": (32, 32, 8, 16), "W": (32, 32, 3, 3, 8, 16)}),
    ("suite matmul 512 blas=False", "C[i,k] := A[i,j] * B[j,k]", {"A": (512, 512), "B": (512, 512)}),
    ("suite row max", "(max) Mx[i] := M[i,j]", {"M": (2000, 2000)}),
]
RANGES = {"(max) y[b,c,h,v] := x[b,c,2h+i,2v+j]": {"i": 2, "j": 2}}
OPTIONS = {"C[i,k] := A[i,j] * B[j,k]": {"blas": False}}


def measure(threads: int) -> list[dict]:
    import numpy as np

    from tullio_py import kernel
    from tullio_py.explain import limits

    peak, bw = limits(refresh=True, threads=threads)   # again now: can only raise the stored
    print(f"machine limits on {threads} thread{'s' * (threads > 1)}: {peak / 1e9:.0f} GFLOP/s "
          f"sgemm, {bw / 1e9:.1f} GB/s copy (the best measured, explain.limits)")
    rng = np.random.default_rng(0)
    rows = []
    for layer, text, shapes in STATEMENTS:
        k = kernel(text, ranges=RANGES.get(text, {}), threads=threads, **OPTIONS.get(text, {}))
        arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        if "var" in arrays:
            arrays["var"] = np.abs(arrays["var"]) + 0.5
        arrays.update({n: v for n, v in SCALARS.items() if n in k.equation.params})
        rows.append(_row(layer, "forward", text, k, arrays))
        out = k(**arrays)
        cot = rng.standard_normal(out.shape).astype(np.float32)
        if k.equation.reducer != "+":       # (max): its gradient is not a statement of its own
            continue
        for name, kernels in k.gradient_kernels().items():
            if name not in shapes:
                continue
            for g in kernels:
                ga = {n: v for n, v in arrays.items()}
                ga["d" + k.equation.output] = cot
                ga[k.equation.output] = out      # a gradient may read the forward's output
                ga[g.equation.output] = np.zeros(shapes[name], np.float32)
                ga = {n: v for n, v in ga.items()
                      if n in g.equation.arrays or n in g.equation.params or n == g.equation.output}
                rows.append(_row(layer, f"gradient of {name}", g.text, g, ga))
    return rows, {"peak_flops": peak, "bandwidth": bw}


def _row(layer, role, text, k, arrays):
    e = k.explain(**arrays)
    row = {"layer": layer, "role": role, "statement": text, "path": e.path, "detail": e.detail,
           "ms": e.seconds * 1e3, "flops": e.flops, "bytes": e.bytes, "fraction": e.fraction}
    mark = "  <25%" if e.fraction < 0.25 else ""
    print(f"{layer:22s} {role:14s} {e.fraction:6.1%} {e.seconds * 1e3:8.3f} ms  {e.path:10s} "
          f"{text}{mark}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="", help="write bench_limits_<tag>.json")
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(v, str(args.threads))
    sys.path.insert(0, os.path.join(HERE, ".."))
    rows, machine = measure(args.threads)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"bench_limits{'_' + args.tag if args.tag else ''}.json")
    with open(path, "w") as f:
        json.dump({"threads": args.threads, "load_average": os.getloadavg(), **machine,
                   "rows": rows}, f,
                  indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
