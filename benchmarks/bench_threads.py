"""tullio_py kernels inside a torch training step: 1 and 2 threads, each numba threading layer,
on an idle machine and next to another multi-threaded process.

    python benchmarks/bench_threads.py [--repeat 30] [--layers tbb,omp,workqueue]

The step: token mixing by attention written as two tullio_py expressions (blas=False, so the
compiled loops run, not BLAS), torch's Linear layers and softmax around them (torch's own thread
pool), forward + backward.  torch.set_num_threads(t) sets the thread count; tullio_py's torch
frontend gives its kernels the same count.  Each configuration runs in a fresh process whose
NUMBA_THREADING_LAYER picks the layer ("omp", tullio_py's own choice when torch is imported
first, runs the kernels on torch's OpenMP pool); "passive" rows add OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep at once instead of
spinning after a parallel region).  "kernels" rows time the same two kernels and their vjps on
numpy arrays without any torch op, which separates numba's pool from torch's.  "loaded": a
second process runs a 2-thread numpy matmul loop on the same cores during the measurement.
"fixed" rows set TULLIO_LOAD_AWARE=0: the kernels use the thread count they are given even
where other runnable threads take the CPUs (cpu_load.py), as before that limit existed.
Reported: median times and their ratio to the same row without that process ("idle" is the
machine as it is: other work on it shows in the load average printed first).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

B, T, D = 8, 128, 32


def worker(threads: int, repeat: int, mode: str) -> dict:
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    from tullio_py import jit, kernel
    scores = kernel("S[b,i,j] := Q[b,i,d] * K[b,j,d]", blas=False)
    mix = kernel("O[b,i,d] := P[b,i,j] * V[b,j,d]", blas=False)
    torch.manual_seed(0)
    qkv, proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
    x = torch.randn(B, T, D)
    rng = np.random.default_rng(0)
    q, p = rng.standard_normal((B, T, D), np.float32), rng.random((B, T, T), np.float32)

    def kernels_only():         # the same kernels and gradients on numpy arrays, no torch op
        with jit.thread_budget(threads):
            s, o = scores(Q=q, K=q), mix(P=p, V=q)
            scores.vjp(s, Q=q, K=q)
            mix.vjp(o, P=p, V=q)

    def torch_step():
        q, k, v = qkv(x).split(D, dim=-1)
        p = torch.softmax(scores(Q=q, K=k) / D ** 0.5, dim=-1)
        out = proj(mix(P=p, V=v))
        out.square().mean().backward()
        for m in (qkv, proj):
            for w in m.parameters():
                w.grad = None

    step = torch_step if mode == "step" else kernels_only
    for _ in range(3):
        step()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"median_s": times[len(times) // 2], "p90_s": times[int(len(times) * 0.9)],
            "layer": jit.threading_layer()}


def _load():
    """A 2-thread numpy matmul loop until killed: another multi-threaded process."""
    import numpy as np
    a = np.random.rand(600, 600)
    while True:
        a = a @ a
        a /= np.abs(a).max()


def run(layer: str, threads: int, loaded: bool, passive: bool, repeat: int, mode: str,
        fixed: bool = False) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_THREADING_LAYER=layer)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if fixed:
        env["TULLIO_LOAD_AWARE"] = "0"
    load = None
    if loaded:
        load = subprocess.Popen([sys.executable, __file__, "--load"],
                                env=dict(os.environ, OPENBLAS_NUM_THREADS="2",
                                         OMP_NUM_THREADS="2", MKL_NUM_THREADS="2"))
        time.sleep(1.0)
    try:
        r = subprocess.run([sys.executable, __file__, "--worker", str(threads), str(repeat), mode],
                           capture_output=True, text=True, env=env, check=True, timeout=600)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--layers", default="tbb,omp,workqueue")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.load:
        _load()
        return
    if a.worker:
        print(json.dumps(worker(int(a.worker[0]), int(a.worker[1]), a.worker[2])))
        return
    run("tbb", 1, False, False, 1, "step")          # compile once (the disk cache)
    configs = ([(layer, False, False) for layer in a.layers.split(",")]
               + [("tbb", True, False), ("tbb", False, True)])
    print(f"attention (B={B}, T={T}, D={D}) forward+backward: 'step' inside torch, 'kernels' the "
          f"tullio_py kernels and vjps alone; median of {a.repeat}; loadavg "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'layer':<16}{'threads':>8}{'mode':>9}{'idle ms':>10}{'loaded ms':>11}"
          f"{'loaded/idle':>13}")
    for layer, passive, fixed in configs:
        for threads in (1, 2):
            for mode in ("step", "kernels"):
                idle = run(layer, threads, False, passive, a.repeat, mode, fixed)
                busy = run(layer, threads, True, passive, a.repeat, mode, fixed)
                name = (idle["layer"] + (" passive" if passive else "")
                        + (" fixed" if fixed else ""))
                print(f"{name:<16}{threads:>8}{mode:>9}{idle['median_s'] * 1e3:10.2f}"
                      f"{busy['median_s'] * 1e3:11.2f}"
                      f"{busy['median_s'] / idle['median_s']:13.2f}", flush=True)
    print(f"loadavg at the end {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
