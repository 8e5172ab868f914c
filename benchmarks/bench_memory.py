"""Where a layer's memory comes from, measured: forward+backward steps that accumulate into
`.grad` (micro-batches: `.grad` is kept between steps) and steps on fresh leaves (`.grad`
starts empty), tullio_py's torch frontend against torch's own layer, with the page faults
each step takes (resource.getrusage's minor faults) and where the results start (the
address modulo 64: 0 is a cache line).

    python benchmarks/bench_memory.py [--threads 1 2] [--repeat 30] [--tag NAME]

Each configuration runs in a fresh process (the memory a process was given before shapes
what glibc hands out next).  Reported per layer, mode and thread count: median milliseconds
of the forward and of the backward, the median page faults of each, tullio_py / torch.
Writes benchmarks/results/bench_memory[_TAG].json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LAYERS = ("softmax", "layer_norm", "conv2d_nchw")


def worker(layer: str, mode: str, threads: int, repeat: int) -> dict:
    import resource
    import time

    import numpy as np
    import torch
    torch.set_num_threads(threads)
    from tullio_py import kernel
    F = torch.nn.functional
    torch.manual_seed(0)
    if layer == "softmax":
        k = kernel("""(max) m[i] := x[i,j]
                      e[i,j] := exp(x[i,j] - m[i])
                      z[i] := e[i,j]
                      y[i,j] := e[i,j] / z[i]""", nograd=("m",))
        inputs = {"x": torch.randn(4096, 512)}
        ours = lambda a: k(x=a["x"])                                     # noqa: E731
        theirs = lambda a: torch.softmax(a["x"], -1)                     # noqa: E731
    elif layer == "layer_norm":
        k = kernel("""mu[i] := x[i,j] * inv_n
                      var[i] := (x[i,j] - mu[i])**2 * inv_n
                      y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]""")
        inputs = {"x": torch.randn(4096, 512), "g": torch.randn(512), "b": torch.randn(512)}
        ours = lambda a: k(x=a["x"], inv_n=1 / 512, eps=1e-5, g=a["g"], bb=a["b"])  # noqa: E731
        theirs = lambda a: F.layer_norm(a["x"], (512,), a["g"], a["b"])  # noqa: E731
    else:
        k = kernel("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]")
        inputs = {"x": torch.randn(16, 32, 34, 34), "w": torch.randn(64, 32, 3, 3)}
        ours = lambda a: k(x=a["x"], w=a["w"])                           # noqa: E731
        theirs = lambda a: F.conv2d(a["x"], a["w"])                      # noqa: E731

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    out = {}
    for name, fn in (("tullio_py", ours), ("torch", theirs)):
        leaves = {n: v.clone().requires_grad_() for n, v in inputs.items()}
        g = None
        rows = []
        for step in range(repeat + 3):
            if mode == "fresh":
                leaves = {n: v.clone().requires_grad_() for n, v in inputs.items()}
            f0 = faults()
            t0 = time.perf_counter()
            y = fn(leaves)
            t1 = time.perf_counter()
            f1 = faults()
            if g is None:
                g = torch.randn_like(y)
            y.backward(g)
            t2 = time.perf_counter()
            f2 = faults()
            if step >= 3:
                rows.append((t1 - t0, t2 - t1, f1 - f0, f2 - f1,
                             y.data_ptr() % 64, leaves["x"].grad.data_ptr() % 64))
            del y
        a = np.array(rows)
        out[name] = {"fwd_ms": float(np.median(a[:, 0]) * 1e3),
                     "bwd_ms": float(np.median(a[:, 1]) * 1e3),
                     "fwd_faults": float(np.median(a[:, 2])),
                     "bwd_faults": float(np.median(a[:, 3])),
                     "result_mod64": sorted({int(v) for v in a[:, 4]}),
                     "grad_mod64": sorted({int(v) for v in a[:, 5]})}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--tag", default="")
    ap.add_argument("--worker", nargs=3)
    args = ap.parse_args()
    if args.worker:
        layer, mode, threads = args.worker
        print(json.dumps(worker(layer, mode, int(threads), args.repeat)))
        return
    report = {"load_average": os.getloadavg(), "results": {}}
    print(f"{'layer':12s} {'mode':11s} thr  {'ours fwd/bwd ms':>17s} {'torch fwd/bwd ms':>17s}"
          f"  ratio  faults ours f/b  torch f/b  result/grad mod 64")
    for layer in LAYERS:
        for mode in ("accumulate", "fresh"):
            for t in args.threads:
                r = json.loads(subprocess.run(
                    [sys.executable, __file__, "--repeat", str(args.repeat),
                     "--worker", layer, mode, str(t)],
                    capture_output=True, text=True, check=True).stdout.splitlines()[-1])
                report["results"][f"{layer} {mode} {t}"] = r
                o, th = r["tullio_py"], r["torch"]
                ratio = (o["fwd_ms"] + o["bwd_ms"]) / (th["fwd_ms"] + th["bwd_ms"])
                print(f"{layer:12s} {mode:11s} {t:3d}  {o['fwd_ms']:7.2f} / {o['bwd_ms']:6.2f}"
                      f"  {th['fwd_ms']:7.2f} / {th['bwd_ms']:6.2f}  {ratio:5.2f}"
                      f"  {o['fwd_faults']:6.0f} / {o['bwd_faults']:5.0f}"
                      f"  {th['fwd_faults']:4.0f} / {th['bwd_faults']:4.0f}"
                      f"  {o['result_mod64']} {o['grad_mod64']}")
    name = "bench_memory" + (f"_{args.tag}" if args.tag else "") + ".json"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
