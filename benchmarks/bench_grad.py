"""Gradient of the local convolution: tullio_py vjp (dx and dW) against its own forward, a
hand-written numba gather-form gradient, and torch autograd of unfold + einsum.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_grad.py

x (32,32,8,16), W (32,32,3,3,8,16), float32, 2 threads.  Prints medians and ratios.
"""
import time

import numpy as np

from hand_kernels import hand_kernels, torch_local_conv

S, C1, C2, B, K = 32, 8, 16, 16, 3
SO = S - K + 1
EXPR = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"


def median_time(f, repeat=30, warm=3):
    for _ in range(warm):
        f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def numba_reference():
    import numba as nb
    nb.set_num_threads(2)
    _, lc_fwd, lc_grad, _, _ = hand_kernels()
    return lc_fwd, lc_grad


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((S, S, C1, B), dtype=np.float32)
    W = rng.standard_normal((S, S, K, K, C1, C2), dtype=np.float32)
    dout = rng.standard_normal((SO, SO, C2, B), dtype=np.float32)
    from tullio_py import kernel
    k = kernel(EXPR, threads=2)
    out = k(x=x, W=W)
    g = k.vjp(dout, x=x, W=W)
    rows = []
    t_fwd = median_time(lambda: k(x=x, W=W))
    t_grad = median_time(lambda: k.vjp(dout, x=x, W=W))
    t_dx = median_time(lambda: k.vjp(dout, x=x, W=W) if False else
                       kernel(EXPR, threads=2, nograd=("W",)).vjp(dout, x=x, W=W))
    t_dW = median_time(lambda: kernel(EXPR, threads=2, nograd=("x",)).vjp(dout, x=x, W=W))
    rows += [("tullio_py forward", t_fwd), ("tullio_py vjp (dx and dW)", t_grad),
             ("tullio_py vjp dx only", t_dx), ("tullio_py vjp dW only", t_dW)]

    lc_fwd, lc_grad = numba_reference()
    o = np.empty_like(out)
    dx, dW = np.empty_like(x), np.empty_like(W)
    lc_fwd(x, W, o)
    lc_grad(x, W, dout, dx, dW)
    scale = lambda a: max(float(np.abs(a).max()), 1e-30)  # noqa: E731
    for name, a, b in (("out", out, o), ("dx", g["x"], dx), ("dW", g["W"], dW)):
        err = float(np.abs(a - b).max()) / scale(b)
        assert err < 1e-4, (name, err)
    rows += [("numba hand-written forward", median_time(lambda: lc_fwd(x, W, o))),
             ("numba hand-written gradient (gather form)", median_time(lambda: lc_grad(x, W, dout, dx, dW)))]

    import torch
    torch.set_num_threads(2)
    fwd, fwd_bwd = torch_local_conv(x, W, dout, K)
    gx, gW = fwd_bwd()
    for name, a, b in (("torch dx", g["x"], gx.numpy()), ("torch dW", g["W"], gW.numpy())):
        assert float(np.abs(a - b).max()) / scale(b) < 1e-4, name
    with torch.no_grad():
        rows.append(("torch forward (unfold+gather+einsum)", median_time(fwd)))
    rows.append(("torch autograd forward+backward", median_time(fwd_bwd)))

    print(f"local convolution x{x.shape} W{W.shape} float32, 2 threads; medians")
    print(f"{'':44s} {'ms':>8s} {'/ tullio fwd':>13s}")
    for name, t in rows:
        print(f"{name:44s} {t * 1e3:8.3f} {t / t_fwd:13.2f}")
    d = dict(rows)
    print(f"\ntullio gradient / tullio forward:              {t_grad / t_fwd:6.2f}")
    print(f"tullio gradient / numba hand-written gradient: "
          f"{t_grad / d['numba hand-written gradient (gather form)']:6.2f}")
    print(f"torch fwd+bwd / tullio gradient:               "
          f"{d['torch autograd forward+backward'] / t_grad:6.2f}")


def maxpool():
    """(max) gradient: the first maximal tuple is found again in the backward pass (one extra
    pass over the window, no argmax array kept by the forward)."""
    from tullio_py import kernel
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4096, 64, 16), dtype=np.float32)
    k = kernel("(max) y[i,c,b] := x[2i+k,c,b]", threads=2, ranges={"k": 2})
    y = k(x=x)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    t_f = median_time(lambda: k(x=x), repeat=15)
    t_g = median_time(lambda: k.vjp(dy, x=x, y=y), repeat=15)
    t_g2 = median_time(lambda: k.vjp(dy, x=x), repeat=15)
    print(f"\nmax-pool (max) y[i,c,b] := x[2i+k,c,b], x{x.shape} float32, 2 threads; medians")
    print(f"forward {t_f * 1e3:.3f} ms; vjp given y {t_g * 1e3:.3f} ms ({t_g / t_f:.2f}x); "
          f"vjp recomputing y {t_g2 * 1e3:.3f} ms ({t_g2 / t_f:.2f}x)")


if __name__ == "__main__":
    main()
    maxpool()
