"""LocallyConnected2d (one tullio_py expression) against the unfold formulations in torch:
forward + backward time and peak memory, float32, 2 threads.

    python benchmarks/bench_torch.py [--repeat 7]

Shapes: batch 16, 8 -> 16 channels, 32x32 input, 3x3 window (30x30 output), weight per output
position.  Every measurement runs in a fresh subprocess.  Memory: tracemalloc does not see
torch's allocations, so the peak is the process's resident set: after building the inputs and
one warm-up step on a batch of 1 (which loads the compiled kernels), the peak counter (VmHWM)
is reset through /proc/self/clear_refs, one full forward+backward runs, and the peak above the
resident size at the reset is reported.  Time: median of --repeat forward+backward steps after
two warm-up steps.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

B, C1, C2, N, K = 16, 8, 16, 32, 3
M = N - K + 1
METHODS = ("tullio_py", "unfold+einsum", "unfold+bmm")


def _layer(method: str, torch):
    F = torch.nn.functional
    from tullio_py.nn import LocallyConnected2d
    torch.manual_seed(0)
    lc = LocallyConnected2d(C1, C2, N, K, bias=False)
    if method == "tullio_py":
        return lc, [lc.weight]
    # each formulation holds the weights in its own fastest layout: (positions, c1*kh*kw, c2)
    W = torch.nn.Parameter(lc.weight.detach().permute(0, 1, 4, 2, 3, 5)
                           .reshape(M * M, C1 * K * K, C2).clone())
    if method == "unfold+einsum":
        def f(x):
            return torch.einsum("bkl,lko->bol", F.unfold(x, K), W).reshape(-1, C2, M, M)
    else:       # the same contraction as a batched matmul over output positions
        def f(x):
            cols = F.unfold(x, K).permute(2, 0, 1)                  # (l, b, k)
            out = torch.bmm(cols, W)                                # (l, b, o)
            return out.permute(1, 2, 0).reshape(-1, C2, M, M)
    return f, [W]


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def worker(method: str, mode: str, repeat: int) -> dict:
    import time
    import torch
    torch.set_num_threads(2)
    layer, params = _layer(method, torch)
    x = torch.randn(B, C1, N, N, requires_grad=True)
    g = torch.randn(B, C2, M, M)

    def step(xb, gb):
        out = layer(xb)
        out.backward(gb)
        for p in [xb, *params]:
            p.grad = None

    step(x[:1].detach().requires_grad_(), g[:1])        # loads the compiled kernels
    if mode == "mem":
        base = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                 # reset the peak (VmHWM) to now
        step(x, g)
        return {"peak_bytes": _status("VmHWM") - base}
    step(x, g)
    step(x, g)
    times, fwd = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = layer(x)
        t1 = time.perf_counter()
        out.backward(g)
        t2 = time.perf_counter()
        x.grad = None
        for p in params:
            p.grad = None
        times.append(t2 - t0)
        fwd.append(t1 - t0)
    times.sort()
    fwd.sort()
    return {"fwd_bwd_s": times[len(times) // 2], "fwd_s": fwd[len(fwd) // 2]}


def run(method: str, mode: str, repeat: int) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, __file__, "--worker", method, mode, str(repeat)],
                       capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], int(a.worker[2]))))
        return
    run("tullio_py", "time", 1)                     # compile once (numba's disk cache)
    rows = {}
    for m in METHODS:
        rows[m] = {**run(m, "time", a.repeat), **run(m, "mem", 1)}
    print(f"LocallyConnected2d forward+backward: x ({B},{C1},{N},{N}) -> ({B},{C2},{M},{M}), "
          f"{K}x{K}, float32, 2 threads (median of {a.repeat}; peak RSS above the inputs)")
    print(f"{'method':<16}{'fwd ms':>9}{'fwd+bwd ms':>12}{'peak MiB':>10}{'time x':>8}{'mem x':>7}")
    t0 = rows["tullio_py"]
    for m, r in rows.items():
        print(f"{m:<16}{r['fwd_s'] * 1e3:9.1f}{r['fwd_bwd_s'] * 1e3:12.1f}"
              f"{r['peak_bytes'] / 2**20:10.1f}{r['fwd_bwd_s'] / t0['fwd_bwd_s']:8.1f}"
              f"{r['peak_bytes'] / max(t0['peak_bytes'], 1):7.1f}")


if __name__ == "__main__":
    main()
