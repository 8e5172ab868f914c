"""Row-group block sizes side by side: layer norm and softmax (4096x512 float32, chains of
three and four statements), forward and forward+vjp, each with its own chain planned for each
block size (chain.BLOCK_BYTES / chain_grad.BLOCK_BYTES; groups with column sums keep
SUMS_BLOCK_BYTES), all in one process, calls interleaved, median of the rounds.

    python benchmarks/bench_blocks.py --threads 1 --kb 1024 32 16 8

Prints milliseconds per call and each size's time over the first size's.  Unset
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the command (they are not read here, but keep runs
comparable with the other benchmarks).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

LN = ("mu[i] := x[i,j] * inv_n; var[i] := (x[i,j] - mu[i])**2 * inv_n; "
      "y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]")
SM = "(max) m[i] := x[i,j]; e[i,j] := exp(x[i,j] - m[i]); z[i] := e[i,j]; y[i,j] := e[i,j] / z[i]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kb", type=int, nargs="+", default=[1024, 16])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--shape", type=int, nargs=2, default=[4096, 512])
    a = ap.parse_args()
    from tullio_py import chain as chain_mod, chain_grad, kernel
    r = np.random.default_rng(0)
    R, C = a.shape
    x = r.standard_normal((R, C)).astype(np.float32)
    dy = r.standard_normal((R, C)).astype(np.float32)
    args = dict(x=x, g=r.standard_normal(C).astype(np.float32),
                bb=r.standard_normal(C).astype(np.float32), inv_n=1 / C, eps=1e-5)
    calls = []
    for kb in a.kb:
        chain_mod.BLOCK_BYTES = chain_grad.BLOCK_BYTES = kb << 10
        ln = chain_mod.Chain(LN, kernel(LN, threads=a.threads).options)
        sm = chain_mod.Chain(SM, kernel(SM, threads=a.threads, nograd=("m",)).options)
        calls += [(("layer norm fwd", kb), lambda ln=ln: ln(**args)),
                  (("softmax fwd", kb), lambda sm=sm: sm(x=x)),
                  (("layer norm fwd+vjp", kb), lambda ln=ln: ln.vjp(dy, **args)),
                  (("softmax fwd+vjp", kb), lambda sm=sm: sm.vjp(dy, x=x))]
        for _, f in calls[-4:]:     # planned now, with this block size
            f()
    times = {k: [] for k, _ in calls}
    for _ in range(a.rounds):
        for k, f in calls:
            f()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(f"{a.threads} thread(s), {R}x{C} float32, median of {a.rounds} interleaved rounds")
    for name in dict.fromkeys(k[0] for k in med):
        first = med[(name, a.kb[0])]
        row = "  ".join(f"{kb} kB {med[(name, kb)]:.3f} ms ({med[(name, kb)] / first:.2f})"
                        for kb in a.kb)
        print(f"{name:20s} {row}")


if __name__ == "__main__":
    main()
