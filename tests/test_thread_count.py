"""A kernel's result does not depend on its thread count, bit for bit, on every path a call
may take: the generated loops (fixed blocks of a split reduction), and BLAS over strided
views (blas_shift.py), whose plan, and whose groups of batch steps, are chosen for the
machine's thread count whatever `threads` a call asks for.  Each statement is checked on
1, 2 and all threads, forward and gradients, repeated calls included, and against the loops
(blas=False) to rounding."""
import numpy as np
import pytest

from tullio_py import Kernel, blas_shift, jit, kernel, threads

R = np.random.default_rng(5)

# (statement, input shapes, shape of a given output (in-place statements) or None); large
# enough that the loops split across threads and that BLAS over strided views is chosen for
# some thread counts: with a plan chosen per thread count the shifted-output conv1d ran a
# loop over j on one thread and a loop over b with col2im on two, and dW's batch steps were
# summed into one zeroed copy per thread.
CASES = {
    "shift1d": ("y[i+j] += x[i] * h[j]", {"x": (20000,), "h": (64,)}, (20063,)),
    "shift_batched": ("y[b,i+j] += x[b,i] * h[j]", {"x": (64, 2000), "h": (32,)}, (64, 2031)),
    "full_conv1d": ("y[b,o,i+j] += x[b,c,i] * w[o,c,j]", {"x": (16, 32, 500), "w": (32, 32, 5)},
                    (16, 32, 504)),
    "conv1d": ("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", {"x": (16, 32, 500), "w": (32, 32, 5)}, None),
}


@pytest.mark.skipif(jit.max_threads() < 2, reason="one thread only: nothing to compare")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_thread_count_changes_no_bit(case, dtype):
    expr, shapes, out_shape = CASES[case]
    arrays = {n: R.standard_normal(s).astype(dtype) for n, s in shapes.items()}
    out = None if out_shape is None else R.standard_normal(out_shape).astype(dtype)
    given = {} if out is None else {Kernel(expr).equation.output: out}
    results = {}
    for threads in (1, 2, True):
        k = kernel(expr, threads=threads)
        for rep in range(2):
            y = k(**arrays, **{n: v.copy() for n, v in given.items()})
            dy = np.linspace(-1, 1, y.size, dtype=dtype).reshape(y.shape)
            results[repr(threads), rep] = (y, k.vjp(dy, **arrays, **given))   # (True == 1)
    y1, g1 = results["1", 0]
    for key, (y, g) in results.items():
        np.testing.assert_array_equal(y, y1, err_msg=f"threads, call {key}")
        for n in g1:
            np.testing.assert_array_equal(g[n], g1[n], err_msg=f"d{n}, threads, call {key}")
    loops = kernel(expr, blas=False)
    want = loops(**arrays, **{n: v.copy() for n, v in given.items()})
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(y1, want, **tol)
    dy = np.linspace(-1, 1, want.size, dtype=dtype).reshape(want.shape)
    for n, g in loops.vjp(dy, **arrays, **given).items():
        np.testing.assert_allclose(g1[n], g, **tol)


@pytest.mark.skipif(not blas_shift.blas_threads.available() or jit.max_threads() < 2,
                    reason="gemms cannot be made single-threaded, or one thread only")
def test_step_groups_do_not_follow_the_threads():
    """dW of a conv1d sums its batch steps in groups, each into its own zeroed copy: the same
    groups on one thread as on several (the plan's split 2), so the same bits."""
    k = Kernel("dw[o,c,j] += dy[b,o,i] * x[b,c,i+j]", threads=1)
    arrays = {"dy": R.standard_normal((16, 32, 496)), "x": R.standard_normal((16, 32, 500))}
    out = np.zeros((32, 32, 5))
    rng = k.ranges(**arrays, dw=out)
    plans = [p for p in blas_shift.candidates(k._shift, arrays, rng, out.shape, out.strides,
                                              out.dtype) if p.split == 2]
    assert plans
    for p in plans:
        got = {n: out.copy() for n in (1, 2, 3)}
        for n, o in got.items():
            blas_shift.run(p, k._shift, arrays, o, False, p.write, 3, n)
        np.testing.assert_array_equal(got[1], got[3])
        np.testing.assert_array_equal(got[2], got[3])
        assert blas_shift.step_groups(p, 3) == 3


def _openblas_threads():
    """numpy's OpenBLAS thread count as the calling thread sees it, or None."""
    import ctypes
    import os
    with open("/proc/self/maps") as f:
        paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.rsplit("/", 1)[-1].lower()
                        and ln.split()[-1].startswith("/")})
    for path in paths:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        for name in ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn()
    return None


@pytest.mark.skipif(not blas_shift.blas_threads.available() or _openblas_threads() in (None, 1),
                    reason="no OpenBLAS with several threads to set")
def test_every_step_sees_one_gemm_thread():
    """blas_threads.run: every task, on the calling thread or the pool, runs while gemms are on
    one thread, however the threads finish (tasks of unequal length, repeated), and the count
    is restored afterwards.  Restoring it in each worker let a finished worker lift it under a
    running one."""
    import time
    before = _openblas_threads()
    seen = []

    def task(k):
        def go():
            time.sleep(0.002 * (k % 3))
            seen.append(_openblas_threads())
        return go
    for _ in range(10):
        blas_shift.blas_threads.run([task(k) for k in range(6)], 3)
    assert seen and set(seen) == {1}, seen
    assert _openblas_threads() == before


@pytest.mark.skipif(jit.max_threads() < 2, reason="one thread only: nothing to compare")
def test_torch_runs_the_steps_on_its_own_pool(monkeypatch):
    """Under the torch frontend, blas_shift's steps (a conv1d forward and both gradients) run
    in order on the calling thread, their gemms and copies on torch's pool, whatever
    torch.get_num_threads(): no Python worker threads beside torch's (blas_threads.run is
    never called).  At one thread count the results repeat bit for bit; between counts
    they agree to rounding (torch's BLAS may split a long sum, dW's, over its threads), and
    with numpy's."""
    torch = pytest.importorskip("torch")
    from tullio_py.frontends import torch as frontend
    expr, shapes, _ = CASES["conv1d"]
    k = kernel(expr)
    x, w = (R.standard_normal(shapes[n]) for n in ("x", "w"))
    gemm, gemms = frontend.torch_gemm, []
    monkeypatch.setattr(frontend, "torch_gemm", lambda *a, **k: gemms.append(1) or gemm(*a, **k))
    monkeypatch.setattr(blas_shift.blas_threads, "run", None)       # a call would raise
    # (torch's BLAS taken whatever this machine measures: gemm_rate.py, test_gemm_rate.py)
    monkeypatch.setattr(frontend, "_TORCH_BLAS", {1: (2.0, 1.0), 2: (2.0, 1.0)})
    # numpy's reference: x's windows (b, c, i, j)
    xw = np.lib.stride_tricks.sliding_window_view(x, w.shape[2], axis=2)
    want_y = np.einsum("bcij,ocj->boi", xw, w)
    dy = np.linspace(-1, 1, want_y.size).reshape(want_y.shape)
    want_dx = np.zeros_like(x)
    for j in range(w.shape[2]):
        want_dx[:, :, j:j + dy.shape[2]] += np.einsum("boi,oc->bci", dy, w[:, :, j])
    want = (want_y, want_dx, np.einsum("boi,bcij->ocj", dy, xw))
    before, got = torch.get_num_threads(), {}
    try:
        for threads in (2, 1, 2, 1):
            torch.set_num_threads(threads)
            xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
            y = k(x=xt, w=wt)
            y.backward(torch.from_numpy(dy))
            got.setdefault(threads, []).append((y.detach(), xt.grad, wt.grad))
    finally:
        torch.set_num_threads(before)
    assert gemms
    for threads, (first, again) in got.items():
        for a, b in zip(first, again):
            assert torch.equal(a, b), threads
        for a, b in zip(first, want):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not blas_shift.blas_threads.available() or _openblas_threads() in (None, 1),
                    reason="no OpenBLAS with several threads to set")
def test_numpys_blas_runs_on_one_thread_under_torch(monkeypatch):
    """What the torch frontend still leaves to numpy's BLAS (an einsum of three operands)
    runs with OpenBLAS on the calling thread alone: while torch has several threads (its
    workers and OpenBLAS's would spin against each other) and while it has one (the budget
    is one thread; this assertion was OpenBLAS's own count before torch's one-thread calls
    could go to numpy's BLAS, gemm_rate.py); the result is numpy's, and the count is restored
    after the call."""
    torch = pytest.importorskip("torch")
    k = kernel("y[i,l] := A[i,j] * B[j,k] * C[k,l]")
    A, B, C = (R.standard_normal((40, 40)) for _ in range(3))
    seen, einsum = [], np.einsum
    monkeypatch.setattr(np, "einsum", lambda *a, **kw: (seen.append(_openblas_threads()),
                                                         einsum(*a, **kw))[1])
    before, outside = torch.get_num_threads(), _openblas_threads()
    try:
        for threads, want in ((2, 1), (1, 1)):
            torch.set_num_threads(threads)
            seen.clear()
            y = k(A=torch.from_numpy(A), B=torch.from_numpy(B), C=torch.from_numpy(C))
            np.testing.assert_allclose(y.numpy(), A @ B @ C, rtol=1e-10, atol=1e-10)
            assert seen == [want], (threads, seen)
    finally:
        torch.set_num_threads(before)
    assert _openblas_threads() == outside


@pytest.mark.skipif(jit.max_threads() < 2, reason="one thread only: nothing to share")
def test_a_caller_entering_while_another_runs_gets_its_share():
    """Where each Python thread brings its own team (numba's omp layer), a caller that enters a
    parallel kernel while another Python thread is inside one runs on half the CPUs; a caller
    alone on all of them."""
    import threading
    import numba
    jit.threading_layer()                    # the pool runs
    seen, inside, release = {}, threading.Event(), threading.Event()

    def first():
        seen["first"] = numba.get_num_threads()
        inside.set()
        assert release.wait(30)

    def second():
        seen["second"] = numba.get_num_threads()

    t = threading.Thread(target=threads._call_sharing, args=(first, (), None))
    t.start()
    assert inside.wait(30)
    threads._call_sharing(second, (), None)
    release.set()
    t.join()
    assert seen == {"first": jit.max_threads(), "second": jit.max_threads() // 2}
    assert threads._inside == 0
