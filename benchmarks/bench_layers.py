"""Everyday layers written in tullio_py (torch frontend) against torch, float32.

    python benchmarks/bench_layers.py [--quick] [--threads 1 2] [--tag NAME] [--only conv1d ...]

Competitors: tullio_py's torch frontend, torch, and jax.jit (XLA, when jax is installed) for the
layers XLA has an op for.  Workloads: conv1d, conv2d (NCHW and NHWC), depthwise conv1d, causal attention (B8 T128 H8
D64, a chain of six statements; against einsum + masked softmax and against scaled_dot_product_attention), layer norm
4096x512 (a chain of three statements), LocallyConnected2d (batch 16, 8->16, 32x32, 3x3; against unfold
+ einsum), 2x2 max-pool, embedding-bag (sum), softmax (a chain of four statements).  Each forward (no grad) and forward +
backward (torch autograd; tullio_py's backward is its vjp).

Each thread count runs in a fresh subprocess with OPENBLAS/OMP/NUMBA threads and
torch.set_num_threads set to it, jax's competitors in a second one (XLA's threads in the same
process slowed torch and tullio_py alike).  Before timing, every competitor's output and
gradients are checked against a float64 torch reference.  Times: median over interleaved rounds (each round
runs every competitor once, so background load hits them alike), after warm-up calls that
compile the kernels.  Writes benchmarks/results/bench_layers[_TAG].json and .png.

To compare two versions of tullio_py in the same conditions, run the script twice with
PYTHONPATH pointing at each checkout and different --tag values.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


# ----------------------------------------------------------------------------- workloads
def workloads(torch, quick: bool, with_jax: bool = True):
    """name -> (make inputs, {competitor: function of the inputs -> output}); jax's
    competitors only `with_jax`."""
    import numpy as np

    from tullio_py import kernel
    F = torch.nn.functional

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    W = {}

    # --- convolutions
    conv1 = kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]")
    W["conv1d"] = (lambda: {"x": rand(32, 64, 260), "w": rand(64, 64, 5)},
                   {"torch": lambda a: F.conv1d(a["x"], a["w"]),
                    "tullio_py": lambda a: conv1(x=a["x"], w=a["w"])})
    conv2 = kernel("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]")
    W["conv2d_nchw"] = (lambda: {"x": rand(16, 32, 34, 34), "w": rand(64, 32, 3, 3)},
                        {"torch": lambda a: F.conv2d(a["x"], a["w"]),
                         "tullio_py": lambda a: conv2(x=a["x"], w=a["w"])})
    conv2l = kernel("y[b,h,v,o] := x[b,h+i,v+j,c] * w[i,j,c,o]")
    W["conv2d_nhwc"] = (
        lambda: {"x": rand(16, 34, 34, 32), "w": rand(3, 3, 32, 64)},
        {"torch": lambda a: F.conv2d(a["x"].permute(0, 3, 1, 2),
                                     a["w"].permute(3, 2, 0, 1)).permute(0, 2, 3, 1),
         "tullio_py": lambda a: conv2l(x=a["x"], w=a["w"])})
    dw = kernel("y[b,c,i] := x[b,c,i+j] * w[c,j]")
    W["depthwise_conv1d"] = (lambda: {"x": rand(32, 64, 260), "w": rand(64, 5)},
                             {"torch": lambda a: F.conv1d(a["x"], a["w"][:, None, :], groups=64),
                              "tullio_py": lambda a: dw(x=a["x"], w=a["w"])})

    # --- causal attention, (batch, heads, time, dim)
    B, H, T, D = 8, 8, 128, 64
    scale = 1.0 / D ** 0.5
    # one chain: the softmax's four statements run as one pass over blocks of rows, forward
    # and backward; any m gives the same softmax, so the gradient holds it constant (nograd)
    att = kernel("""s[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d] * scale
                    (max) m[b,h,i] := s[b,h,i,j] * (j <= i)
                    e[b,h,i,j] := exp(s[b,h,i,j] - m[b,h,i]) * (j <= i)
                    z[b,h,i] := e[b,h,i,j]
                    p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]
                    o[b,h,i,d] := p[b,h,i,j] * v[b,h,j,d]""", nograd=("m",))

    def att_tullio(a):
        return att(q=a["q"], k=a["k"], v=a["v"], scale=scale)

    def att_torch(a):
        s = torch.einsum("bhid,bhjd->bhij", a["q"], a["k"]) * scale
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        return torch.einsum("bhij,bhjd->bhid", s.masked_fill(mask, float("-inf")).softmax(-1),
                            a["v"])
    W["causal_attention"] = (
        lambda: {"q": rand(B, H, T, D), "k": rand(B, H, T, D), "v": rand(B, H, T, D)},
        {"torch": att_torch,
         "torch_sdpa": lambda a: F.scaled_dot_product_attention(a["q"], a["k"], a["v"],
                                                                is_causal=True),
         "tullio_py": att_tullio})

    # --- layer norm: a chain of three statements (one kernel; rows of x in blocks)
    n_feat = 512
    ln = kernel("""mu[i] := x[i,j] * inv_n
                   var[i] := (x[i,j] - mu[i])**2 * inv_n
                   y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]""")

    def ln_tullio(a):
        return ln(x=a["x"], inv_n=1.0 / n_feat, eps=1e-5, g=a["g"], bb=a["b"])
    W["layer_norm"] = (lambda: {"x": rand(4096, n_feat), "g": rand(n_feat), "b": rand(n_feat)},
                       {"torch": lambda a: F.layer_norm(a["x"], (n_feat,), a["g"], a["b"]),
                        "tullio_py": ln_tullio})

    # --- LocallyConnected2d: batch 16, 8 -> 16 channels, 32x32, 3x3.  Each holds the weights
    # in the layout its layer keeps (torch's: (positions, c1*kh*kw, c2), the fastest for
    # unfold + einsum; tullio_py.nn's: (oh, ow, kh, kw, c1, c2)).
    from tullio_py.nn import EXPRESSION
    lc = kernel(EXPRESSION)
    C1, C2, N, K = 8, 16, 32, 3
    M = N - K + 1

    def lc_tullio(a):
        xs = a["x"].permute(2, 3, 1, 0).contiguous()
        return lc(x=xs, W=a["W"]).permute(3, 2, 0, 1)

    def lc_torch(a):
        Wu = a["W"].reshape(M * M, C1 * K * K, C2)
        return torch.einsum("bkl,lko->bol", F.unfold(a["x"], K), Wu).reshape(-1, C2, M, M)
    W["locally_connected2d"] = (
        lambda: {"x": rand(16, C1, N, N), "W": rand(M, M, C1, K, K, C2) / 9},
        {"torch_unfold_einsum": lc_torch,
         "tullio_py": Laid(lc_tullio, to={"W": lambda w: w.permute(0, 1, 3, 4, 2, 5)},
                           back={"W": lambda d: d.permute(0, 1, 4, 2, 3, 5)})})

    # --- max-pool 2x2, stride 2
    mp = kernel("(max) y[b,c,h,v] := x[b,c,2h+i,2v+j]", ranges={"i": 2, "j": 2})
    def distinct(*shape):      # no ties in float32 (k / 2**21, all different): a tie's
        n = int(np.prod(shape))  # gradient goes to whichever element a library picks
        return (torch.randperm(n, dtype=torch.float64) / n).reshape(shape)
    W["max_pool2d"] = (lambda: {"x": distinct(16, 32, 64, 64)},
                       {"torch": lambda a: F.max_pool2d(a["x"], 2),
                        "tullio_py": lambda a: mp(x=a["x"])})

    # --- embedding bag (sum of 16 rows per bag)
    eb = kernel("y[b,d] := E[J[b,k], d]")
    Jn = np.random.default_rng(0).integers(0, 10000, (512, 16))
    Jt = torch.from_numpy(Jn)
    W["embedding_bag"] = (lambda: {"E": rand(10000, 64)},
                          {"torch": lambda a: F.embedding_bag(Jt, a["E"], mode="sum"),
                           "tullio_py": lambda a: eb(E=a["E"], J=Jt)})

    # --- softmax over the last axis: a chain of four statements; any m gives the same
    # softmax, so the gradient holds it constant (nograd)
    sm = kernel("""(max) m[i] := x[i,j]
                   e[i,j] := exp(x[i,j] - m[i])
                   z[i] := e[i,j]
                   y[i,j] := e[i,j] / z[i]""", nograd=("m",))

    def sm_tullio(a):
        return sm(x=a["x"])
    W["softmax"] = (lambda: {"x": rand(4096, 512)},
                    {"torch": lambda a: torch.softmax(a["x"], -1), "tullio_py": sm_tullio})
    if with_jax:
        _add_jax(W, n_feat, (B, H, T, D), scale)
    return W


class Laid:
    """A competitor that holds some inputs in a layout of its own, as a layer holds its weights:
    `to[name]` converts the shared input once, outside the timing (a C-contiguous copy), and
    `back[name]` converts the gradient of the converted input back for the check."""

    def __init__(self, fn, to: dict, back: dict):
        self.fn, self.to, self.back = fn, to, back

    def inputs(self, inputs: dict) -> dict:
        return {n: self.to[n](v).contiguous() if n in self.to else v for n, v in inputs.items()}

    def grads(self, got):
        y, grads = got
        return y, {n: self.back[n](g) if n in self.back else g for n, g in grads.items()}


class JaxLayer:
    """A competitor written in jax.numpy: forward and forward+backward (jax.vjp) each compiled
    by jax.jit; inputs arrive as torch tensors and are copied to jax arrays once, outside the
    timing."""

    def __init__(self, fn):
        self.fn = fn


def _add_jax(W, n_feat, bhtd, scale):
    """jax.jit versions of the layers XLA has an op for (skipped when jax is not installed)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return
    lax = jax.lax

    def conv(x, w, spec, groups=1):
        return lax.conv_general_dilated(x, w, (1,) * (x.ndim - 2), "VALID",
                                        dimension_numbers=spec, feature_group_count=groups)
    jx = {
        "conv1d": lambda a: conv(a["x"], a["w"], ("NCH", "OIH", "NCH")),
        "conv2d_nchw": lambda a: conv(a["x"], a["w"], ("NCHW", "OIHW", "NCHW")),
        "conv2d_nhwc": lambda a: conv(a["x"], a["w"], ("NHWC", "HWIO", "NHWC")),
        "depthwise_conv1d": lambda a: conv(a["x"], a["w"][:, None, :], ("NCH", "OIH", "NCH"),
                                           groups=a["w"].shape[0]),
        "layer_norm": lambda a: ((a["x"] - a["x"].mean(-1, keepdims=True))
                                 * lax.rsqrt(a["x"].var(-1, keepdims=True) + 1e-5)
                                 * a["g"] + a["b"]),
        "softmax": lambda a: jax.nn.softmax(a["x"], -1),
        "max_pool2d": lambda a: lax.reduce_window(a["x"], -jnp.inf, lax.max, (1, 1, 2, 2),
                                                  (1, 1, 2, 2), "VALID"),
        "causal_attention": lambda a: jax.nn.dot_product_attention(
            *(jnp.swapaxes(a[n], 1, 2) for n in "qkv"), scale=scale,
            is_causal=True).swapaxes(1, 2),
    }
    for name, fn in jx.items():
        if name in W:
            W[name][1]["jax"] = JaxLayer(fn)


def _jax_calls(layer, inputs, g):
    """(forward, forward+backward) callables on jax copies of the inputs; each waits for its
    result.  The forward+backward returns (output, {name: gradient}) like _fwd_bwd."""
    import jax
    import jax.numpy as jnp
    arrays = {n: jnp.asarray(v.detach().numpy()) for n, v in inputs.items()}
    diff = {n: v for n, v in arrays.items() if jnp.issubdtype(v.dtype, jnp.floating)}
    rest = {n: v for n, v in arrays.items() if n not in diff}
    fwd = jax.jit(lambda d: layer.fn({**d, **rest}))

    def both(d, g):
        y, back = jax.vjp(lambda d: layer.fn({**d, **rest}), d)
        return y, back(g)[0]
    fb = jax.jit(both)
    jg = jnp.asarray(g.numpy())
    return (lambda: jax.block_until_ready(fwd(diff)),
            lambda: jax.block_until_ready(fb(diff, jg)))


# ----------------------------------------------------------------------------- one process
def run_worker(threads: int, quick: bool, only, which: str = "main") -> dict:
    """Times of the competitors of every workload on `threads` threads: `which` "main" all
    but jax's, "jax" only jax's (a process of its own: XLA's pool of CPU threads, idle between
    its calls, kept torch's layer norm at 2.4-3.1 ms instead of 0.6 ms in the same process, and
    tullio_py's load-aware thread count, which counts it, on one thread for half its calls)."""
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    rounds = 3 if quick else 9
    out = {}
    for name, (make, comps) in workloads(torch, quick, which != "main").items():
        if only and name not in only:
            continue
        ref_fn = comps["torch"] if "torch" in comps else comps[next(iter(comps))]
        if which == "jax":
            comps = {c: f for c, f in comps.items() if isinstance(f, JaxLayer)}
            if not comps:
                continue
        ref_in = make()
        ref = _fwd_bwd(ref_fn, ref_in, torch, seed=1)
        inputs = {n: v.float() for n, v in ref_in.items()}
        res = {}
        g = _cotangent(ref[0], torch, seed=1).float()
        jax_calls, laid = {}, {}
        for comp, fn in comps.items():
            if isinstance(fn, JaxLayer):
                jax_calls[comp] = f, fb = _jax_calls(fn, inputs, g)
                f()                                          # warm-up (compiles) and check
                y, grads = fb()
                got = (torch.from_numpy(np.asarray(y)), {n: torch.from_numpy(np.asarray(v))
                                                         for n, v in grads.items()})
            elif isinstance(fn, Laid):
                laid[comp] = fn.inputs(inputs)
                got = fn.grads(_fwd_bwd(fn.fn, laid[comp], torch, seed=1))
            else:
                got = _fwd_bwd(fn, inputs, torch, seed=1)   # warm-up (compiles) and check
            _check(name, comp, got, ref, torch)
            res[comp] = {"fwd": [], "fwd_bwd": []}
        for _ in range(rounds):
            for comp, fn in comps.items():
                if comp in jax_calls:
                    for mode, call in zip(("fwd", "fwd_bwd"), jax_calls[comp]):
                        t = time.perf_counter()
                        call()
                        res[comp][mode].append(time.perf_counter() - t)
                    continue
                call, args = (fn.fn, laid[comp]) if comp in laid else (fn, inputs)
                res[comp]["fwd"].append(_time_fwd(call, args, torch))
                res[comp]["fwd_bwd"].append(_time_fwd_bwd(call, args, g, torch))
        out[name] = {c: {k: float(np.median(v)) * 1e3 for k, v in r.items()}
                     for c, r in res.items()}
        print(f"[{threads} thread{'s' if threads > 1 else ''}] {name}: " + ", ".join(
            f"{c} {r['fwd']:.2f}/{r['fwd_bwd']:.2f} ms" for c, r in out[name].items()),
            file=sys.stderr, flush=True)
    return out


def _cotangent(y, torch, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(y.shape, dtype=torch.float64, generator=gen)


def _fwd_bwd(fn, inputs, torch, seed):
    """(output, {name: gradient}) with gradients of sum(output * cotangent)."""
    leaves = {n: v.detach().clone().requires_grad_(v.is_floating_point())
              for n, v in inputs.items()}
    y = fn(leaves)
    y.backward(_cotangent(y, torch, seed).to(y.dtype))
    return y.detach(), {n: v.grad for n, v in leaves.items() if v.grad is not None}


def _check(name, comp, got, ref, torch):
    y, grads = got
    ry, rgrads = ref
    pairs = [("output", y, ry)] + [(f"d{n}", grads.get(n), g) for n, g in rgrads.items()]
    for what, a, b in pairs:
        if a is None:
            raise AssertionError(f"{name}/{comp}: no gradient {what}")
        a = a.double().contiguous()
        err = float((a - b).abs().max() / (b.abs().max() + 1e-30))
        if err > 2e-3:
            raise AssertionError(f"{name}/{comp}: {what} differs from the float64 reference "
                                 f"by {err:.2e} (relative to its largest element)")


def _time_fwd(fn, inputs, torch):
    with torch.no_grad():
        t = time.perf_counter()
        fn(inputs)
        return time.perf_counter() - t


def _time_fwd_bwd(fn, inputs, g, torch):
    leaves = {n: v.detach().requires_grad_(v.is_floating_point()) for n, v in inputs.items()}
    t = time.perf_counter()
    fn(leaves).backward(g)
    return time.perf_counter() - t


# ----------------------------------------------------------------------------- driver
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 rounds instead of 9")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tag", default="")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--set", choices=("main", "jax"), default="main", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        json.dump(run_worker(args.worker, args.quick, args.only, args.set), sys.stdout)
        return
    import tullio_py
    report = {"tullio_py": os.path.dirname(tullio_py.__file__), "quick": args.quick,
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "only": args.only, "load_average_start": os.getloadavg(), "threads": {}}
    for n in args.threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n),
                   MKL_NUM_THREADS=str(n), NUMBA_NUM_THREADS=str(n))
        if n == 1:          # XLA's CPU client: one thread for its Eigen pool and its ops
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                                " intra_op_parallelism_threads=1").strip()
        per = {}
        for which in ("main", "jax"):       # jax in a process of its own (run_worker)
            cmd = [sys.executable, __file__, "--worker", str(n), "--set", which]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--only", *args.only] if args.only else []
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            sys.stderr.write(done.stderr)
            if done.returncode:
                raise SystemExit(done.returncode)
            for name, comps in json.loads(done.stdout).items():
                per.setdefault(name, {}).update(comps)
        report["threads"][str(n)] = per
    report["load_average_end"] = os.getloadavg()
    table(report)
    os.makedirs(RESULTS, exist_ok=True)
    stem = os.path.join(RESULTS, "bench_layers" + (f"_{args.tag}" if args.tag else ""))
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    plot(report, stem + ".png")
    print(f"wrote {stem}.json and .png")


def table(report):
    print(f"tullio_py from {report['tullio_py']}; load average {report['load_average_start']}"
          " (other jobs share the machine)")
    print(f"{'workload':22s} {'thr':>3s} {'competitor':22s} {'fwd ms':>9s} {'f+b ms':>9s}"
          f" {'tullio/it fwd':>13s} {'f+b':>6s}")
    for n, per in report["threads"].items():
        for name, comps in per.items():
            t = comps["tullio_py"]
            for c, r in comps.items():
                print(f"{name:22s} {n:>3s} {c:22s} {r['fwd']:9.2f} {r['fwd_bwd']:9.2f} "
                      f"{t['fwd'] / r['fwd']:13.2f} {t['fwd_bwd'] / r['fwd_bwd']:6.2f}")


def plot(report, path):
    """The report's figure (plot_results.layers_figure, the one the benchmarks notebook shows)
    saved to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    from plot_results import layers_figure      # (beside this script)
    layers_figure(report).savefig(path, dpi=110)


if __name__ == "__main__":
    main()
