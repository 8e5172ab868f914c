"""Hand-written numba kernels: the same-backend ceiling the benchmarks compare tullio_py with
(the best loops written by hand for each workload, checked against numpy before they are timed).
Also the torch competitor of the local convolution (unfold + gather + einsum, and its autograd).
Shared by bench_suite.py and bench_grad.py."""
import numpy as np


def hand_kernels():
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def mm(a, b, c):
        n, k = a.shape
        m = b.shape[1]
        for i in prange(n):
            for j in range(m):
                c[i, j] = 0.0
            for p in range(k):
                aip = a[i, p]
                for j in range(m):
                    c[i, j] += aip * b[p, j]

    @njit(parallel=True, fastmath=True)
    def lc_fwd(x, W, out):
        SO, TO, C2, B = out.shape
        C1 = x.shape[2]
        for s in prange(SO):
            for t in range(TO):
                for d in range(C2):
                    for b in range(B):
                        out[s, t, d, b] = 0.0
                for i in range(3):
                    for j in range(3):
                        for c in range(C1):
                            for d in range(C2):
                                w = W[s + i, t + j, i, j, c, d]
                                for b in range(B):
                                    out[s, t, d, b] += x[s + i, t + j, c, b] * w

    @njit(parallel=True, fastmath=True)
    def lc_grad(x, W, g, dx, dW):
        S, T, C1, B = x.shape
        SO, TO, C2, _ = g.shape
        for p in prange(S):
            for q in range(T):
                for c in range(C1):
                    for b in range(B):
                        dx[p, q, c, b] = 0.0
                for i in range(3):
                    for j in range(3):
                        s = p - i
                        t = q - j
                        inside = 0 <= s < SO and 0 <= t < TO
                        for c in range(C1):
                            for d in range(C2):
                                if inside:
                                    w = W[p, q, i, j, c, d]
                                    acc = np.float32(0.0)
                                    for b in range(B):
                                        gb = g[s, t, d, b]
                                        dx[p, q, c, b] += gb * w
                                        acc += gb * x[p, q, c, b]
                                    dW[p, q, i, j, c, d] = acc
                                else:
                                    dW[p, q, i, j, c, d] = 0.0

    @njit(parallel=True, fastmath=True)
    def rowmax(m, out):
        n = m.shape[1]
        L = 16
        jmax = (n // L) * L
        for i in prange(m.shape[0]):
            acc = m[i, :L].copy()
            for j0 in range(L, jmax, L):
                for l in range(L):
                    v = m[i, j0 + l]
                    acc[l] = v if v > acc[l] else acc[l]
            r = acc.max()
            for j in range(jmax, n):
                r = m[i, j] if m[i, j] > r else r
            out[i] = r

    @njit(fastmath=True)
    def mm4(a, b, c):
        for i in range(4):
            for k in range(4):
                acc = np.float32(0)
                for j in range(4):
                    acc += a[i, j] * b[j, k]
                c[i, k] = acc
    return mm, lc_fwd, lc_grad, rowmax, mm4


def torch_local_conv(x, W, dout, K=3):
    """(forward, forward+backward) of the local convolution written the usual torch way."""
    import torch
    SO = x.shape[0] - K + 1
    si, ti, ii, jj = np.meshgrid(np.arange(SO), np.arange(SO), np.arange(K), np.arange(K),
                                 indexing="ij")
    SI, TI, II, JJ = (torch.from_numpy(v) for v in (si, ti, ii, jj))
    xt0, Wt0, dt = torch.from_numpy(x), torch.from_numpy(W), torch.from_numpy(dout)

    def fwd(xt=xt0, Wt=Wt0):
        xw = xt.unfold(0, K, 1).unfold(1, K, 1)               # [s,t,c1,b,i,j]
        return torch.einsum("stcbij,stijcd->stdb", xw, Wt[SI + II, TI + JJ, II, JJ])

    def fwd_bwd():
        xt = xt0.clone().requires_grad_()
        Wt = Wt0.clone().requires_grad_()
        fwd(xt, Wt).backward(dt)
        return xt.grad, Wt.grad
    return fwd, fwd_bwd
