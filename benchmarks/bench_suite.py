"""Side-by-side benchmark of tullio_py against numpy, torch eager, hand-written numba kernels and
jax (when installed), in one process, float32, 2 threads.

Every competitor's result is checked against a float64 numpy reference before it is timed.
Times are medians of 7 samples (each sample repeats the call for >= 0.05 s).  Prints a table of
medians and ratios, the physical limits (sgemm GFLOP/s of a 2048 matmul, copy GB/s) and each
workload's floor max(FLOPs / peak, bytes / bandwidth), then writes
benchmarks/results/bench_suite.json and benchmarks/results/bench_suite.png.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_suite.py [--quick]
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "2")

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import timeit  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

from hand_kernels import hand_kernels, torch_local_conv  # noqa: E402  (benchmarks/, the script's own folder)

import tullio_py  # noqa: E402
from tullio_py import kernel  # noqa: E402

QUICK = "--quick" in sys.argv
DT = np.float32
THREADS = 2
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
rng = np.random.default_rng(0)
ROWS: dict = {}        # workload -> {competitor: seconds}
CHECKS: dict = {}


def median_time(f, min_sample=0.05, repeat=7):
    f()
    t0 = time.perf_counter()
    f()
    dt = time.perf_counter() - t0
    n = max(1, int(min_sample / max(dt, 1e-7)))
    if QUICK:
        repeat = 3
    return statistics.median(timeit.repeat(f, number=n, repeat=repeat)) / n


def check(workload, name, got, ref, tol=2e-3):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
    CHECKS[f"{workload}/{name}"] = err
    if not err < tol:
        raise AssertionError(f"{workload}/{name}: relative error {err:.2e} against the float64 "
                             "reference")


def record(workload, name, f, ref=None, result=None):
    if ref is not None:
        got = f()
        check(workload, name, got if result is None else result(), ref)
    t = median_time(f)
    ROWS.setdefault(workload, {})[name] = t
    print(f"  {workload:22s} {name:34s} {t * 1e3:10.4f} ms", flush=True)
    return t


# ----------------------------------------------------------------------------- data
N = 512
A = rng.standard_normal((N, N), dtype=DT)
B = rng.standard_normal((N, N), dtype=DT)
S, T, C1, BB, C2, K = 32, 32, 8, 16, 16, 3
x = rng.standard_normal((S, T, C1, BB), dtype=DT)
W = rng.standard_normal((S, T, K, K, C1, C2), dtype=DT)
SO, TO = S - K + 1, T - K + 1
dout = rng.standard_normal((SO, TO, C2, BB), dtype=DT)
M = rng.standard_normal((2000, 2000), dtype=DT)
a4, b4 = rng.standard_normal((4, 4), dtype=DT), rng.standard_normal((4, 4), dtype=DT)
si = np.arange(SO)[:, None, None, None]
ti = np.arange(TO)[None, :, None, None]
ii = np.arange(K)[None, None, :, None]
jj = np.arange(K)[None, None, None, :]

LC = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"
MM = "C[i,k] := A[i,j] * B[j,k]"
MAX = "(max) Mx[i] := M[i,j]"


def np_lc_fwd(x, W):
    xw = sliding_window_view(x, (K, K), axis=(0, 1))
    Weff = W[si + ii, ti + jj, ii, jj]
    return np.einsum("stcbij,stijcd->stdb", xw, Weff, optimize=True)


def np_lc_grad(x, W, dout):
    xw = sliding_window_view(x, (K, K), axis=(0, 1))
    Weff = W[si + ii, ti + jj, ii, jj]
    dxw = np.einsum("stdb,stijcd->stcbij", dout, Weff, optimize=True)
    dWe = np.einsum("stcbij,stdb->stijcd", xw, dout, optimize=True)
    dx = np.zeros_like(x)
    dW = np.zeros_like(W)
    for i in range(K):
        for j in range(K):
            dx[i:i + SO, j:j + TO] += dxw[..., i, j]
            dW[i:i + SO, j:j + TO, i, j] = dWe[:, :, i, j]
    return dx, dW


x64, W64, d64 = x.astype(np.float64), W.astype(np.float64), dout.astype(np.float64)
REF = dict(matmul=A.astype(np.float64) @ B.astype(np.float64), conv=np_lc_fwd(x64, W64),
           max=M.max(1), mm4=a4.astype(np.float64) @ b4)
REF["dx"], REF["dW"] = np_lc_grad(x64, W64, d64)


# ----------------------------------------------------------------------------- limits
def physical():
    n = 1024 if QUICK else 2048
    a = rng.standard_normal((n, n), dtype=DT)
    b = rng.standard_normal((n, n), dtype=DT)
    t = median_time(lambda: a @ b, min_sample=0.0, repeat=5)
    peak = 2 * n ** 3 / t
    big = np.ones(2 ** 24 if QUICK else 2 ** 26, dtype=DT)
    dst = np.empty_like(big)
    t2 = median_time(lambda: np.copyto(dst, big), min_sample=0.0, repeat=5)
    bw = 2 * big.nbytes / t2
    print(f"  sgemm {n}: {peak / 1e9:.1f} GFLOP/s    copy {big.nbytes >> 20} MiB: "
          f"{bw / 1e9:.1f} GB/s (read+write)", flush=True)
    return peak, bw


def floors(peak, bw):
    b4 = 4
    conv_flops = 2 * SO * TO * C2 * BB * K * K * C1
    conv_bytes = (x.size + W.size + SO * TO * C2 * BB) * b4
    return {
        "matmul": max(2 * N ** 3 / peak, 3 * N * N * b4 / bw),
        "conv": max(conv_flops / peak, conv_bytes / bw),
        "conv_grad": max(2 * conv_flops / peak, (conv_bytes + x.size * b4 + W.size * b4) / bw),
        "max": max(M.size / peak, M.nbytes / bw),
        "mm4": max(2 * 64 / peak, 48 * b4 / bw),
    }


# ----------------------------------------------------------------------------- competitors
def run_numpy():
    record("matmul 512", "numpy A@B", lambda: A @ B, REF["matmul"])
    record("local conv fwd", "numpy einsum on windows", lambda: np_lc_fwd(x, W), REF["conv"])
    record("local conv grad", "numpy hand-derived", lambda: np_lc_grad(x, W, dout),
           None)
    g = np_lc_grad(x, W, dout)
    check("local conv grad", "numpy dx", g[0], REF["dx"])
    check("local conv grad", "numpy dW", g[1], REF["dW"])
    record("row max 2000x2000", "numpy M.max(1)", lambda: M.max(1), REF["max"])
    record("matmul 4x4", "numpy A@B", lambda: a4 @ b4, REF["mm4"])


def run_torch():
    import torch
    torch.set_num_threads(THREADS)
    tA, tB = torch.from_numpy(A), torch.from_numpy(B)
    record("matmul 512", "torch einsum", lambda: torch.einsum("ij,jk->ik", tA, tB),
           REF["matmul"], lambda: torch.einsum("ij,jk->ik", tA, tB).numpy())
    fwd, fwd_bwd = torch_local_conv(x, W, dout, K)
    with torch.no_grad():
        record("local conv fwd", "torch unfold+einsum", fwd, REF["conv"],
               lambda: fwd().numpy())

    gx, gW = fwd_bwd()
    check("local conv grad", "torch dx", gx.numpy(), REF["dx"])
    check("local conv grad", "torch dW", gW.numpy(), REF["dW"])
    record("local conv grad", "torch autograd fwd+bwd", fwd_bwd)
    tM = torch.from_numpy(M)
    record("row max 2000x2000", "torch amax", lambda: torch.amax(tM, 1), REF["max"],
           lambda: torch.amax(tM, 1).numpy())
    t4a, t4b = torch.from_numpy(a4), torch.from_numpy(b4)
    record("matmul 4x4", "torch A@B", lambda: t4a @ t4b, REF["mm4"], lambda: (t4a @ t4b).numpy())


def run_jax():
    """XLA through jax.jit (CPU): the same workloads written with jax.numpy, compiled before
    timing; every timed call waits for its result (block_until_ready)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("  jax: not installed, skipped", flush=True)
        return
    jA, jB, jM = jnp.asarray(A), jnp.asarray(B), jnp.asarray(M)
    jx, jW, jd = jnp.asarray(x), jnp.asarray(W), jnp.asarray(dout)
    ja4, jb4 = jnp.asarray(a4), jnp.asarray(b4)
    s_i, t_i, i_i, j_i = (jnp.asarray(v) for v in (si, ti, ii, jj))

    def lc_fwd(x, W):             # windows of x and the matching weights, one einsum (as numpy)
        xw = jnp.stack([jnp.stack([x[i:i + SO, j:j + TO] for j in range(K)], -1)
                        for i in range(K)], -2)                   # (s, t, c1, b, i, j)
        Weff = W[s_i + i_i, t_i + j_i, i_i, j_i]                  # (s, t, i, j, c1, c2)
        return jnp.einsum("stcbij,stijcd->stdb", xw, Weff)

    def lc_fwd_shifts(x, W):      # one batched contraction per window offset, summed
        return sum(jnp.einsum("stcb,stcd->stdb", x[i:i + SO, j:j + TO],
                              W[i:i + SO, j:j + TO, i, j]) for i in range(K) for j in range(K))

    def lc_grad(x, W, g):
        _, back = jax.vjp(lc_fwd, x, W)
        return back(g)

    def timed(f, *args):
        f = jax.jit(f)
        return lambda: jax.block_until_ready(f(*args))

    record("matmul 512", "jax.jit einsum", timed(lambda a, b: jnp.einsum("ij,jk->ik", a, b),
                                                 jA, jB), REF["matmul"])
    record("local conv fwd", "jax.jit windows+einsum", timed(lc_fwd, jx, jW), REF["conv"])
    record("local conv fwd", "jax.jit shifted einsums", timed(lc_fwd_shifts, jx, jW),
           REF["conv"])
    grad = timed(lc_grad, jx, jW, jd)
    gx, gW = grad()
    check("local conv grad", "jax dx", gx, REF["dx"])
    check("local conv grad", "jax dW", gW, REF["dW"])
    record("local conv grad", "jax.jit vjp", grad)
    record("row max 2000x2000", "jax.jit max", timed(lambda m: jnp.max(m, 1), jM), REF["max"])
    record("matmul 4x4", "jax.jit A@B", timed(lambda a, b: a @ b, ja4, jb4), REF["mm4"])


def run_numba():
    import numba
    numba.set_num_threads(THREADS)
    mm, lc_fwd, lc_grad, rowmax, mm4 = hand_kernels()
    C = np.empty_like(A)
    o = np.empty(REF["conv"].shape, DT)
    dx, dW = np.empty_like(x), np.empty_like(W)
    mx = np.empty(2000, DT)
    c4 = np.empty((4, 4), DT)
    record("matmul 512", "numba hand (i-p-j prange)", lambda: mm(A, B, C), REF["matmul"],
           lambda: C)
    record("local conv fwd", "numba hand (b innermost)", lambda: lc_fwd(x, W, o), REF["conv"],
           lambda: o)
    lc_grad(x, W, dout, dx, dW)
    check("local conv grad", "numba dx", dx, REF["dx"])
    check("local conv grad", "numba dW", dW, REF["dW"])
    record("local conv grad", "numba hand (gather form)", lambda: lc_grad(x, W, dout, dx, dW))
    record("row max 2000x2000", "numba hand (16 lanes)", lambda: rowmax(M, mx), REF["max"],
           lambda: mx)
    record("matmul 4x4", "numba hand", lambda: mm4(a4, b4, c4), REF["mm4"], lambda: c4)
    numba.set_num_threads(1)
    record("local conv fwd", "numba hand, 1 thread", lambda: lc_fwd(x, W, o))
    numba.set_num_threads(THREADS)


def run_tullio():
    import numba
    numba.set_num_threads(THREADS)
    k_on, k_off = kernel(MM), kernel(MM, blas=False)
    record("matmul 512", "tullio_py (BLAS dispatch)", lambda: k_on(A=A, B=B), REF["matmul"])
    record("matmul 512", "tullio_py (blas=False)", lambda: k_off(A=A, B=B), REF["matmul"])
    lc, lc1 = kernel(LC), kernel(LC, threads=1)
    record("local conv fwd", "tullio_py", lambda: lc(x=x, W=W), REF["conv"])
    record("local conv fwd", "tullio_py, 1 thread", lambda: lc1(x=x, W=W), REF["conv"])
    if hasattr(lc, "vjp"):
        g = lc.vjp(dout, x=x, W=W)
        check("local conv grad", "tullio_py dx", g["x"], REF["dx"])
        check("local conv grad", "tullio_py dW", g["W"], REF["dW"])
        record("local conv grad", "tullio_py vjp", lambda: lc.vjp(dout, x=x, W=W))
        record("local conv grad", "tullio_py vjp, 1 thread", lambda: lc1.vjp(dout, x=x, W=W))
    else:
        print("  local conv grad: tullio_py gradient pending (no Kernel.vjp)", flush=True)
        ROWS.setdefault("local conv grad", {})["tullio_py vjp"] = None
    km = kernel(MAX)
    record("row max 2000x2000", "tullio_py", lambda: km(M=M), REF["max"])
    k4 = kernel(MM)
    record("matmul 4x4", "tullio_py", lambda: k4(A=a4, B=b4), REF["mm4"])


# ----------------------------------------------------------------------------- report
def blas_info():
    try:
        from threadpoolctl import threadpool_info
        return [{k: v for k, v in d.items() if k in ("internal_api", "version", "architecture",
                                                      "num_threads", "threading_layer")}
                for d in threadpool_info()]
    except ImportError:
        return "threadpoolctl not installed"


def targets(rows):
    def get(w, n):
        return rows.get(w, {}).get(n)
    out = {}
    tf, nf = get("local conv fwd", "tullio_py"), get("local conv fwd", "numpy einsum on windows")
    hf = get("local conv fwd", "numba hand (b innermost)")
    tg = get("local conv grad", "tullio_py vjp")
    out["conv fwd faster than numpy"] = (tf < nf, f"{tf / nf:.2f}x numpy")
    out["conv fwd within 1.1x of hand numba"] = (tf <= 1.1 * hf, f"{tf / hf:.2f}x")
    if tg:
        out["conv grad within 2x of forward"] = (tg <= 2 * tf, f"{tg / tf:.2f}x")
        tg1 = get("local conv grad", "tullio_py vjp, 1 thread")
        out["2 threads vs 1 >= 1.7x (grad)"] = (tg1 / tg >= 1.7, f"{tg1 / tg:.2f}x")
    else:
        out["conv grad within 2x of forward"] = (None, "pending")
    tf1 = get("local conv fwd", "tullio_py, 1 thread")
    out["2 threads vs 1 >= 1.7x (fwd)"] = (tf1 / tf >= 1.7, f"{tf1 / tf:.2f}x")
    nm = get("matmul 512", "numpy A@B")
    on, off = get("matmul 512", "tullio_py (BLAS dispatch)"), get("matmul 512", "tullio_py (blas=False)")
    out["matmul with BLAS within 1.1x numpy"] = (on <= 1.1 * nm, f"{on / nm:.2f}x")
    out["matmul blas=False at least half numpy"] = (off <= 2 * nm, f"{off / nm:.2f}x")
    tm, tt = get("row max 2000x2000", "tullio_py"), get("row max 2000x2000", "torch amax")
    out["row max within 1.5x torch.amax"] = (tm <= 1.5 * tt, f"{tm / tt:.2f}x")
    return out


def main():
    # numba's pool starts here, through tullio_py, so the hand-written numba kernels run on the
    # threading layer tullio_py chooses (numba alone would pick its own before tullio_py runs)
    from tullio_py import jit
    layer = jit.threading_layer()
    print(f"tullio_py {tullio_py.__version__}, numpy {np.__version__}, {THREADS} threads, "
          f"float32{' (quick)' if QUICK else ''}, numba threading layer {layer}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print("== physical limits", flush=True)
    peak, bw = physical()
    for name, fn in (("numpy", run_numpy), ("torch", run_torch), ("jax", run_jax),
                     ("numba", run_numba), ("tullio_py", run_tullio)):
        print(f"== {name}", flush=True)
        try:
            fn()
        except ImportError as e:
            print(f"  {name}: skipped ({e})", flush=True)
    fl = floors(peak, bw)
    fl_by = {"matmul 512": fl["matmul"], "local conv fwd": fl["conv"],
             "local conv grad": fl["conv_grad"], "row max 2000x2000": fl["max"],
             "matmul 4x4": fl["mm4"]}
    print("\n| workload | competitor | median ms | vs tullio_py | vs floor |")
    print("|---|---|---|---|---|")
    for w, comp in ROWS.items():
        tt = comp.get("tullio_py") or comp.get("tullio_py vjp") or comp.get(
            "tullio_py (BLAS dispatch)")
        for n, t in comp.items():
            if t is None:
                print(f"| {w} | {n} | pending | | |")
                continue
            rel = f"{t / tt:.2f}" if tt else ""
            print(f"| {w} | {n} | {t * 1e3:.4f} | {rel} | {t / fl_by[w]:.1f}x |")
        print(f"| {w} | floor max(FLOPs/peak, bytes/bw) | {fl_by[w] * 1e3:.4f} | | 1.0x |")
    tg = targets(ROWS)
    print("\nTargets:")
    for k, (ok, what) in tg.items():
        print(f"  [{'met' if ok else 'pending' if ok is None else 'NOT met'}] {k}: {what}")
    os.makedirs(RESULTS, exist_ok=True)
    data = dict(times_s=ROWS, floors_s=fl_by, peak_gflops=peak / 1e9, copy_gbs=bw / 1e9,
                checks_rel_err=CHECKS, targets={k: [v[0], v[1]] for k, v in tg.items()},
                blas=blas_info(), threads=THREADS, dtype="float32", quick=QUICK,
                numba_threading_layer=layer,
                load_average=os.getloadavg(),     # other work on the machine skews every row
                env={k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                                     "OMP_NUM_THREADS")})
    with open(os.path.join(RESULTS, "bench_suite.json"), "w") as f:
        json.dump(data, f, indent=1)
    plot(ROWS, fl_by)
    print(f"\nwrote {os.path.join(RESULTS, 'bench_suite.json')} and bench_suite.png")


def plot(rows, fl):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ws = list(rows)
    fig, axes = plt.subplots(1, len(ws), figsize=(4 * len(ws), 4.5))
    for ax, w in zip(np.atleast_1d(axes), ws):
        names = [n for n, t in rows[w].items() if t is not None] + ["floor"]
        vals = [rows[w][n] * 1e3 for n in names[:-1]] + [fl[w] * 1e3]
        colors = ["tab:red" if n.startswith("tullio") else "tab:gray" if n == "floor"
                  else "tab:blue" for n in names]
        ax.barh(range(len(names)), vals, color=colors)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=7)
        ax.set_xscale("log")
        ax.set_title(w, fontsize=9)
        ax.set_xlabel("median ms (log)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "bench_suite.png"), dpi=110)


if __name__ == "__main__":
    main()
