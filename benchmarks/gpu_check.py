"""The CUDA target on a real GPU, in one run (a few minutes on one GPU):

1. every entry of the expression table (tests/test_table.py) on target="cuda" against the
   reference interpreter and the CPU code, and the gradient equations of every differentiable
   entry against the CPU vjp;
2. timings (CUDA events, warm, median of many runs) of the local convolution
   `out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]` forward and gradient at
   x (128,128,32,64), W (128,128,3,3,32,64) float32 against torch's unfold + einsum formulation
   (forward, and its autograd backward), after checking both agree; and a 4096x4096 float32
   matmul against torch.matmul.

    python benchmarks/gpu_check.py            # everything
    python benchmarks/gpu_check.py --table    # part 1 only (also runs on NUMBA_ENABLE_CUDASIM=1)
    python benchmarks/gpu_check.py --timing   # part 2 only

Needs numba-cuda (extra "cuda") and, for part 2, a CUDA build of torch.
"""
import os
import statistics
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from tullio_py import TullioError, kernel, tullio  # noqa: E402

CONV = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"
MATMUL = "C[i,k] := A[i,j] * B[j,k]"


def quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **kw)


# ----------------------------------------------------------------------------- 1. the table
def table_check() -> bool:
    from test_table import TABLE, _assert_same, _expected
    t0 = time.perf_counter()
    bad, fwd, grads = [], 0, 0
    for n, t in enumerate(TABLE):
        arrays, expected, ranges, eq = _expected(n)
        copy = lambda: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
        try:
            got = quiet(tullio, t.expr, **{**t.opts, "target": "cuda"}, **copy())
            cpu = quiet(tullio, t.expr, **{**t.opts, "target": "python"}, **copy())
            _assert_same(np.asarray(got), expected)
            _assert_same(np.asarray(got), np.asarray(cpu))
            fwd += 1
        except Exception as e:          # report every failure, not only the first
            bad.append(f"forward  {t.id}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        if eq.assign != ":=" or t.opts.get("ranges") or expected.dtype.kind != "f":
            continue
        k = kernel(t.expr, **{**t.opts, "target": "python"})
        dout = np.random.default_rng(n).standard_normal(expected.shape).astype(expected.dtype)
        try:
            want = quiet(k.vjp, dout, **arrays)
        except (TullioError, NotImplementedError):
            continue
        out = quiet(k, **arrays)
        try:
            for name, eqs in k.gradient_equations.items():
                if name not in want:
                    continue
                ns = {**arrays, eq.output: out, "d" + eq.output: dout,
                      "d" + name: np.zeros(np.shape(arrays[name]), want[name].dtype)}
                for text in eqs:
                    gk = kernel(text, target="cuda")
                    e = gk.equation
                    names = list(e.arrays) + list(e.params) + ([e.output] if e.assign != ":=" else [])
                    ns[e.output] = quiet(gk, **{w: ns[w] for w in names})
                tol = 1e-5 if want[name].dtype == np.float32 else 1e-10
                np.testing.assert_allclose(ns["d" + name], want[name], rtol=tol, atol=tol)
                grads += 1
        except Exception as e:
            bad.append(f"gradient {t.id}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    print(f"table on target='cuda': {fwd}/{len(TABLE)} forward entries and {grads} gradients agree "
          f"with the reference and the CPU code ({time.perf_counter() - t0:.0f} s, compiles included)")
    for b in bad:
        print("  FAIL", b)
    return not bad


# ----------------------------------------------------------------------------- 2. timings
def cuda_time(fn, reps=20, warm=3) -> float:
    """Median milliseconds of fn() between CUDA events on torch's current stream."""
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def torch_local_conv(x, W):
    """The same contraction with torch: patches of x and the matching weights by unfold (views),
    then one batched einsum over (s, t)."""
    import torch
    P = x.unfold(0, 3, 1).unfold(1, 3, 1)                       # s t c1 b i j
    Wd = W.unfold(0, 3, 1).unfold(1, 3, 1)                      # s t i j c1 c2 i' j'
    Wd = torch.diagonal(torch.diagonal(Wd, dim1=2, dim2=6), dim1=2, dim2=5)   # s t c1 c2 i j
    return torch.einsum("stcbij,stcdij->stdb", P, Wd)


def timings():
    import torch
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(128, 128, 32, 64, device=dev, generator=g)
    W = torch.randn(128, 128, 3, 3, 32, 64, device=dev, generator=g) / 17
    k = kernel(CONV)
    out = k(x=x, W=W)
    xr, Wr = x.clone().requires_grad_(), W.clone().requires_grad_()
    ref = torch_local_conv(xr, Wr)
    dout = torch.randn(ref.shape, device=dev, generator=g)
    dx_ref, dW_ref = torch.autograd.grad(ref, (xr, Wr), dout, retain_graph=True)
    print(f"forward agrees with torch: max |diff| = {(out - ref).abs().max().item():.2e} "
          f"(max |out| {ref.abs().max().item():.1f})")

    def gradient():                           # Kernel.vjp on the device
        return k.vjp(dout, x=x, W=W)
    gr = gradient()
    xt, Wt = x.clone().requires_grad_(), W.clone().requires_grad_()
    auto = dict(zip(("x", "W"), torch.autograd.grad(k(x=xt, W=Wt), (xt, Wt), dout)))
    for name, want in (("x", dx_ref), ("W", dW_ref)):
        err = (gr[name] - want).abs().max().item()
        err_auto = (auto[name] - want).abs().max().item()
        print(f"gradient of {name} agrees with torch autograd: max |diff| = {err:.2e} (vjp), "
              f"{err_auto:.2e} (through torch autograd) (max |grad| {want.abs().max().item():.1f})")

    rows = [("local conv forward", cuda_time(lambda: k(x=x, W=W)),
             cuda_time(lambda: torch_local_conv(x, W))),
            ("local conv gradient (dx, dW)", cuda_time(gradient, reps=10),
             cuda_time(lambda: torch.autograd.grad(ref, (xr, Wr), dout, retain_graph=True), reps=10))]
    A = torch.randn(4096, 4096, device=dev, generator=g)
    B = torch.randn(4096, 4096, device=dev, generator=g)
    km = kernel(MATMUL)
    C = km(A=A, B=B)
    print(f"matmul agrees with torch.matmul: max |diff| = {(C - A @ B).abs().max().item():.2e}")
    rows.append(("matmul 4096x4096", cuda_time(lambda: km(A=A, B=B), reps=10),
                 cuda_time(lambda: torch.matmul(A, B), reps=10)))
    print(f"\n{'float32, median of warm runs':32s} {'tullio_py ms':>13s} {'torch ms':>10s} {'ratio':>7s}")
    for name, ours, theirs in rows:
        print(f"{name:32s} {ours:13.3f} {theirs:10.3f} {ours / theirs:7.2f}")
    print(f"gradient / forward (tullio_py): {rows[1][1] / rows[0][1]:.2f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    ok = True
    if "--timing" not in sys.argv:
        ok = table_check()
    if "--table" not in sys.argv:
        timings()
    print(f"total {time.perf_counter() - t0:.0f} s")
    sys.exit(0 if ok else 1)
