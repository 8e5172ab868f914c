"""Schedules: threaded vs serial, loop order from memory layout, never splitting an unsafe index,
and every generated form (scalar accumulator, row accumulator, lanes, chunked partials,
collapsed loops) against the reference interpreter and numpy.

The work threshold for threads is lowered to 0 here so that small arrays (fast to compile and
check) take the threaded code paths.
"""
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference import evaluate  # noqa: E402

from tullio_py import blas, jam, kernel, schedule  # noqa: E402
from tullio_py.parse import parse  # noqa: E402


@pytest.fixture(autouse=True)
def always_threads(monkeypatch):
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)


def rnd(*shape, seed=0, order="C", dtype=np.float64):
    a = np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(dtype)
    return np.asfortranarray(a) if order == "F" else a


def F(a):
    return np.asfortranarray(a)


# (expression, arrays builder, options, form expected with threads: (form, chunked, partial))
TABLE = [
    ("C[i,k] := A[i,j] * B[j,k]", lambda: dict(A=rnd(9, 7), B=rnd(7, 11)), {}, "row"),
    ("C[i,k] := A[i,j] * B[j,k]", lambda: dict(A=F(rnd(9, 7)), B=F(rnd(7, 11))), {}, "row"),
    ("C[i,k] += A[i,j] * B[j,k]", lambda: dict(A=rnd(9, 7), B=rnd(7, 11), C=rnd(9, 11)), {},
     "row"),
    ("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
     lambda: dict(x=rnd(7, 6, 3, 5), W=rnd(7, 6, 3, 3, 3, 4)), {}, "row"),
    ("(max) M[i] := A[i,j]", lambda: dict(A=rnd(5, 37)), {}, "scalar"),
    ("(max) M[i] := A[i,j]", lambda: dict(A=F(rnd(37, 6))), {}, "row"),
    ("(min) M[i] := A[i,j] + 1", lambda: dict(A=rnd(4, 21)), {}, "scalar"),
    ("(min) M[i] := A[i,j] * (j <= i + 9)", lambda: dict(A=rnd(6, 21)), {}, "scalar"),
    ("n[i] := A[i,j]**2 |> sqrt", lambda: dict(A=F(rnd(12, 5))), {}, "row"),
    ("n[i] = A[i,j]**2 |> sqrt", lambda: dict(A=F(rnd(12, 5)), n=rnd(12)), {}, "row"),
    ("C[i] := A[i,j] * (j <= i)", lambda: dict(A=F(rnd(10, 10))), {}, "row"),
    ("C[i] := A[i,j] * (j <= i)", lambda: dict(A=rnd(10, 10)), {}, "scalar"),
    ("y[i] := x[pad(i+k-1, 1, 1)] * h[k]", lambda: dict(x=rnd(30), h=rnd(5)), {}, "row"),
    ("y[i+j] := x[i] * h[j]", lambda: dict(x=rnd(30), h=rnd(5)), {}, "row"),
    ("s := A[i] * B[i]", lambda: dict(A=rnd(100), B=rnd(100, seed=1)), {}, "scalar"),
    ("(max) s := A[i,j]", lambda: dict(A=rnd(40, 30)), {}, "scalar"),
    ("s += A[i,j] * B[j]", lambda: dict(A=rnd(20, 30), B=rnd(30), s=np.array(1.5)), {},
     "scalar"),
    ("H[J[i]] += 1", lambda: dict(J=np.random.default_rng(3).integers(0, 4, 200),
                                  H=np.zeros(4, np.int64)), {}, "scalar"),
    ("y[J[i]] += x[i]", lambda: dict(J=np.random.default_rng(3).integers(0, 5, 300),
                                     x=rnd(300), y=rnd(5)), {}, "scalar"),
    ("y[J[i], k] += x[i, k]", lambda: dict(J=np.random.default_rng(4).integers(0, 5, 50),
                                           x=rnd(50, 6), y=rnd(5, 6)), {}, "scalar"),
    ("C[a,i] := A[a,i,j] * B[j]", lambda: dict(A=rnd(3, 40, 5), B=rnd(5)), {}, "scalar"),
    ("C[i,j] = C[i,j] * 2 + A[j,i]", lambda: dict(A=rnd(12, 12), C=rnd(12, 12, seed=5)), {},
     "scalar"),
    ("P[i] *= A[i,j]", lambda: dict(A=F(rnd(9, 4)), P=rnd(9)), {}, "row"),
    # a column sum: the row j split into blocks across threads, each block's loop vectorised
    ("g[j] += dy[i,j] * (x[i,j] - mu[i])",
     lambda: dict(dy=rnd(37, 23), x=rnd(37, 46)[:, 1::2], mu=rnd(37), g=rnd(23)), {}, "row"),
]
IDS = [f"{e} {'F' if any(isinstance(v, np.ndarray) and v.ndim > 1 and v.flags.f_contiguous and not v.flags.c_contiguous for v in b().values()) else ''}" for e, b, _, _ in TABLE]


def _call(expr, arrays, **opts):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = kernel(expr, blas=False, **opts)
        arrays = {n: (v.copy(order="K") if isinstance(v, np.ndarray) else v)
                  for n, v in arrays.items()}
        return k, np.asarray(k(**arrays))


@pytest.mark.parametrize("expr,build,opts,form", TABLE, ids=IDS)
def test_threaded_equals_serial_and_reference(expr, build, opts, form):
    arrays = build()
    k_par, par = _call(expr, arrays, threads=True, **opts)
    k_ser, ser = _call(expr, arrays, threads=False, **opts)
    np.testing.assert_allclose(par, ser, rtol=1e-12, atol=1e-12)
    eq = parse(expr)
    rng = kernel(expr, blas=False, threads=False).ranges(
        **{n: v for n, v in arrays.items() if n != eq.output or eq.assign != ":="})
    out = arrays.get(eq.output)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = evaluate(eq, arrays, rng, None if out is None else out.copy())
    np.testing.assert_allclose(par, ref, rtol=1e-10, atol=1e-10)
    plan = k_par._last.plan
    assert plan.form == form, k_par.forward_code
    assert plan.chunked or any(l.parallel for l in plan.loops) or plan.collapse, \
        k_par.forward_code
    # the same plan on 1 and on 2 threads gives the same bits (jit.call may lower the count
    # of a call when the machine is loaded: cpu_load.py)
    from tullio_py import jit
    for n in (1, 2):
        with warnings.catch_warnings(), jit.thread_budget(n):
            warnings.simplefilter("ignore")
            again = np.asarray(k_par(**{a: v.copy(order="K") if isinstance(v, np.ndarray)
                                        else v for a, v in arrays.items()}))
        assert np.array_equal(again, par), (n, k_par.forward_code)
    # threads=False may compile the parallel loop, but it runs on one thread
    assert _threads_used(k_ser, arrays) == [1] or not k_ser._last.source.parallel


def _threads_used(k, arrays):
    """The thread counts a call asks numba for (by watching threads.set_threads)."""
    from tullio_py import threads
    seen, real = [], threads.set_threads
    threads.set_threads = lambda n: (seen.append(n), real(n))[1]
    try:
        k._calls.entries.clear()       # go through the full call path, not a stored entry
        k(**{n: v for n, v in arrays.items() if n != k.equation.output or k.equation.assign != ":="})
    finally:
        threads.set_threads = real
    return [n for n in seen if n is not None]


def test_partials_for_scalar_and_scatter():
    _, _ = _call("s := A[i] * B[i]", dict(A=rnd(100), B=rnd(100)), threads=True)
    k = kernel("s := A[i] * B[i]", blas=False, threads=True)
    assert k._last.plan.partial == "scalar" and "_part[_c]" in k.forward_code
    J = np.random.default_rng(3).integers(0, 4, 200)
    _, H = _call("H[J[i]] += 1", dict(J=J, H=np.zeros(4, np.int64)), threads=True)
    assert np.array_equal(H, np.bincount(J, minlength=4))
    k = kernel("H[J[i]] += 1", blas=False, threads=True)
    assert k._last.plan.partial == "array"


def test_threads_n_and_false_honoured():
    A, B = rnd(30, 20), rnd(20, 25)
    for threads in (False, 1, 2, True):
        k, C = _call("C[i,k] := A[i,j] * B[j,k]", dict(A=A, B=B), threads=threads)
        np.testing.assert_allclose(C, A @ B, rtol=1e-12)
        used = _threads_used(k, dict(A=A, B=B))
        if k._last.source.parallel:
            want = [] if threads is True else [1] if threads in (False, 1) else [2]
            assert used == want, (threads, used)


# ----------------------------------------------------------------------------- safety
SAFETY = [
    "y[i+j] := x[i] * h[j]",
    "y[J[i]] += x[i]",
    "y[J[i], k] += x[i, k]",
    "y[2i+j] += x[i] * h[j]",
    "C[i,k] := A[i,j] * B[j,k]",
    "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
    "s := A[i] * B[i]",
    "A[i,i] := B[i,j]",
    "dE[J[b,k], d] += dy[b,d]",
]


@pytest.mark.parametrize("expr", SAFETY)
@pytest.mark.parametrize("order", ["C", "F"])
def test_never_parallel_over_unsafe_index(expr, order):
    eq = parse(expr)
    rng = {n: range(0, 40) for n in eq.indices}
    layouts = {a: (tuple(range(3)) if order == "C" else (2, 1, 0)) for a in eq.arrays}
    lhs = eq.lhs.indices
    unsafe = set(eq.reduction_indices) | {n for s in lhs if not (hasattr(s, "is_bare")
                                                                 and s.is_bare) for n in s.names}
    for threads in (True, 2):
        p = schedule.plan(eq, rng, "float64", threads=threads, layouts=None)
        for loop in p.loops:
            if loop.parallel:
                assert loop.index not in unsafe, (expr, p.loops)
        for n in p.collapse:
            assert n not in unsafe
        if p.chunked in unsafe:
            assert p.partial is not None        # only with per-chunk partial results


def test_loop_order_follows_layout():
    eq = parse("C[i,k] := A[i,j] * B[j,k]")
    rng = {n: range(64) for n in "ijk"}
    c = schedule.plan(eq, rng, "float32", threads=False)
    assert [l.index for l in c.loops][-1] == "k" and c.form == "row"
    f = schedule.plan(eq, rng, "float32", threads=False,
                      layouts={"A": (1, 0), "B": (1, 0), "C": (1, 0)})
    assert [l.index for l in f.loops][-1] == "i" and f.form == "row"
    eq = parse("(max) M[i] := A[i,j]")
    assert schedule.plan(eq, rng, "float32").loops[-1].index == "j"
    assert schedule.plan(eq, rng, "float32").lanes
    assert schedule.plan(eq, rng, "float32", layouts={"A": (1, 0)}).loops[-1].index == "i"
    # The local convolution: the batch index b is contiguous in x and out; W is read once per
    # (s,t,i,j,c1,c2) and hoisted out of the b loop.
    eq = parse("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]")
    rng = dict(s=range(30), t=range(30), c2=range(16), b=range(16), i=range(3), j=range(3),
               c1=range(8))
    p = schedule.plan(eq, rng, "float32", threads=True)
    assert p.loops[-1].index == "b" and p.loops[0].parallel and p.form == "row"


def test_layout_of_actual_arrays_used():
    A, B = rnd(16, 16), rnd(16, 16)
    for order, inner in (("C", "k"), ("F", "i")):
        a, b, c = (F(A), F(B), F(0 * A)) if order == "F" else (A, B, 0 * A)
        k, C = _call("C[i,k] += A[i,j] * B[j,k]", dict(A=a, B=b, C=c), threads=False)
        np.testing.assert_allclose(C, A @ B, rtol=1e-12)
        assert k._last.plan.loops[-1].index == inner


def test_hoisted_read_and_row_code():
    x, W = rnd(6, 6, 2, 8), rnd(6, 6, 3, 3, 2, 3)
    k, out = _call("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
                   dict(x=x, W=W), threads=False)
    code = k.forward_code
    # user names end in _ in the code (the read of W hoisted once per jammed value of t)
    assert "_h0_0 = W_[" in code and "* _h0_0" in code


# ----------------------------------------------------------------------------- BLAS dispatch
def test_blas_dispatch_and_off():
    A, B = rnd(64, 48, dtype=np.float32), rnd(48, 40, dtype=np.float32)
    on = kernel("C[i,k] := A[i,j] * B[j,k]")
    off = kernel("C[i,k] := A[i,j] * B[j,k]", blas=False)
    c_on, c_off = on(A=A, B=B), off(A=A, B=B)
    ref = A.astype(np.float64) @ B
    np.testing.assert_allclose(c_on, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(c_off, ref, rtol=1e-4, atol=1e-4)
    assert c_on.dtype == np.float32 and on._blas is not None and off._blas is None
    assert off._last is not None                  # the loops ran
    C = np.ones((64, 40))
    kernel("C[i,k] += 2.0 * A[i,j] * B[j,k]")(A=A.astype(float), B=B.astype(float), C=C)
    np.testing.assert_allclose(C, 1 + 2 * ref, rtol=1e-4)


@pytest.mark.parametrize("expr,ok", [
    ("C[i,k] := A[i,j] * B[j,k]", True),
    ("C[i,k] := A[i,j] * B[j,k] * alpha", True),
    ("s := A[i] * B[i]", True),
    ("C[i,k] := A[i,j] * B[j+1,k]", False),
    ("C[i,k] := exp(A[i,j]) * B[j,k]", False),
    ("C[i,k] := A[i,j] * B[j,k] * (i <= k)", False),
    ("(max) C[i,k] := A[i,j] * B[j,k]", False),
    ("C[i,k] := A[i,j] + B[j,k]", False),
    ("C[i,k] := A[i,k]", False),
    ("C[i,k] := A[i,j] * B[J[j],k]", False),
])
def test_contraction_detection(expr, ok):
    assert (blas.contraction(parse(expr)) is not None) == ok


def test_gradient_threaded_equals_serial():
    kp = kernel("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]", threads=True)
    ks = kernel("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]", threads=False)
    if not hasattr(kp, "vjp"):
        pytest.skip("no gradients")
    x, W = rnd(7, 6, 2, 5), rnd(7, 6, 3, 3, 2, 3)
    d = rnd(5, 4, 3, 5, seed=9)
    gp, gs = kp.vjp(d, x=x, W=W), ks.vjp(d, x=x, W=W)
    for n in ("x", "W"):
        np.testing.assert_allclose(gp[n], gs[n], rtol=1e-12, atol=1e-12)
    # against the adjoint identity <d, J dx> = <vjp(d), dx> with a finite difference
    eps = 1e-6
    dx = rnd(*x.shape, seed=11)
    f = lambda xx: kp(x=xx, W=W)  # noqa: E731
    fd = np.sum(d * (f(x + eps * dx) - f(x - eps * dx))) / (2 * eps)
    assert abs(fd - np.sum(gp["x"] * dx)) < 1e-6 * max(1, abs(fd))


# ----------------------------------------------------------------------------- cache blocking
@pytest.mark.parametrize("expr,assign", [
    ("C[i,k] := A[i,j] * B[j,k]", ":="),
    ("C[i,k] = A[i,j] * B[j,k] * (j <= i + 100)", "="),
    ("C[i,k] -= 2.0 * A[i,j] * B[j,k]", "-="),
])
def test_blocked_reduction_matches_numpy(expr, assign, monkeypatch):
    monkeypatch.setattr(jam, "JAM_LANES", ())     # no register blocking (test_blocking.py)
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((40, 600)), rng.standard_normal((600, 300))
    C0 = rng.standard_normal((40, 300))
    k = kernel(expr, blas=False)
    arrays = dict(A=A, B=B) if assign == ":=" else dict(A=A, B=B, C=C0.copy())
    got = k(**arrays)
    assert k._last.plan.block, k.forward_code          # the blocked form is the one tested
    if assign == ":=":
        want = A @ B
    elif assign == "=":
        mask = np.arange(600)[None, :] <= np.arange(40)[:, None] + 100
        want = (A * mask) @ B
    else:
        want = C0 - 2.0 * A @ B
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_masked_indices_are_not_split():
    """The indices of a mask `(j <= i)` do unequal work per value (j's clipped loop grows with
    i): the unmasked b and h are split instead (both short: fused), the loop order kept; odd
    sizes and a strided input against the reference; the same plan for the same signature."""
    expr = "e[b,h,i,j] := exp(s[b,h,i,j] - m[b,h,i]) * (j <= i)"
    arrays = dict(s=rnd(5, 3, 21, 24)[:, :, :, 1:22], m=rnd(5, 3, 21))
    k, got = _call(expr, arrays, threads=True)
    plan = k._last.plan
    assert [lp.index for lp in plan.loops] == ["b", "h", "i", "j"] and plan.collapse == ("b", "h")
    rng = k.ranges(**arrays)
    np.testing.assert_allclose(got, evaluate(parse(expr), arrays, rng, None), rtol=1e-12,
                               atol=1e-12)
    again = [k._plan_for(arrays, rng, np.dtype(np.float64), got.shape)[:2] for _ in range(2)]
    assert again[0] == again[1] and again[0][0] == plan


# ----------------------------------------------------------------------------- thread split
# (expression, shapes, (split index, index fused with it), loop order): schedule.split_choice
SPLITS = [
    # attention's p and z: b and h short, fused (18 iterations), the memory order kept
    ("p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]", dict(e=(2, 9, 17, 19), z=(2, 9, 17)),
     ("b", "h"), "bhij"),
    ("z[b,h,i] := e[b,h,i,j]", dict(e=(2, 9, 17, 19)), ("b", "h"), "bhij"),
    # an outermost index with at least SHORT values is split alone, in place
    ("p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]", dict(e=(17, 3, 5, 19), z=(17, 3, 5)),
     ("b", None), "bhij"),
    # b x h too short to give SHORT iterations: the longest index, moved outermost
    ("z[b,h,i] := e[b,h,i,j]", dict(e=(2, 3, 40, 19)), ("i", None), "ibhj"),
]


@pytest.mark.parametrize("expr,shapes,split,order", SPLITS)
def test_split_choice_and_same_bits_on_any_thread_count(expr, shapes, split, order):
    arrays = {n: np.abs(rnd(*s, seed=k)) + 0.5 for k, (n, s) in enumerate(shapes.items())}
    k, got = _call(expr, arrays, threads=True)
    plan = k._last.plan
    assert "".join(lp.index for lp in plan.loops) == order, k.forward_code
    assert [lp.index for lp in plan.loops if lp.parallel] == [split[0]]
    assert plan.collapse == (split if split[1] else ())
    e = arrays["e"]
    want = e / arrays["z"][..., None] if "/" in expr else e.sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    from tullio_py import jit
    outs = []
    for n in (1, 2):
        with jit.thread_budget(n):
            outs.append(np.asarray(k(**arrays)))
    assert np.array_equal(outs[0], got) and np.array_equal(outs[1], got)


def test_split_rule_at_layer_sizes():
    """The plans of bench_layers' kernels (no compile): attention's unmasked p[b,h,i,j] and its
    gradient's row sum split the fused b,h (64 iterations) and keep the memory order instead of
    moving i outermost; a 2x2 max-pool splits its batch of 16 in place."""
    att = dict(b=range(8), h=range(8), i=range(128), j=range(128))
    for expr in ("p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]", "dz[b,h,i] := dp[b,h,i,j] * e[b,h,i,j]"):
        p = schedule.plan(parse(expr), att, "float32", threads=2)
        assert [lp.index for lp in p.loops] == list("bhij") and p.collapse == ("b", "h"), expr
    pool = dict(b=range(16), c=range(32), h=range(32), v=range(32), i=range(2), j=range(2))
    p = schedule.plan(parse("(max) y[b,c,h,v] := x[b,c,2h+i,2v+j]"), pool, "float32", threads=2)
    assert p.loops[0].index == "b" and p.loops[0].parallel and not p.collapse
    assert [lp.index for lp in p.loops][:3] == list("bch")


# ----------------------------------------------------------------------------- scatter
EMBAG_GRAD = "dE[J[b,k], d] += dy[b,d]"


@pytest.mark.parametrize("rows,n_d,split", [
    (400, 37, "d"),         # a large output: d in one block (too short for two)
    (6, 600, "d"),          # d in two blocks of 300
    (6, 37, "partial"),     # a small output, d short: per-block copies of dE over b
])
def test_scatter_splits_only_its_contiguous_index(rows, n_d, split):
    """The embedding-bag gradient: the rows J[b,k] collide across b and k, so only d may be
    split; it stays innermost, in blocks of at least SCATTER_BLOCK under the prange, or the
    scatter runs in blocks of b with copies of dE when dE is small and d short.  Colliding rows,
    odd sizes and a strided cotangent against np.add.at and the reference; every thread count
    gives the same bits (each element sums its contributions in a fixed order)."""
    rng = np.random.default_rng(7)
    J = rng.integers(0, 6, (23, 5))                  # 115 tuples into 6 rows
    dy = rnd(23, 2 * n_d, seed=n_d)[:, ::2]
    want = np.zeros((rows, n_d))
    np.add.at(want, J.ravel(), np.repeat(dy, 5, axis=0))
    results, plans = [], []
    for threads in (True, 2, 1, False):
        k = kernel(EMBAG_GRAD, blas=False, threads=threads)
        dE = np.zeros((rows, n_d))
        k(dE=dE, dy=dy, J=J)
        results.append(dE)
        plans.append(k._last.plan)
    plan = plans[0]
    assert [lp.index for lp in plan.loops] == ["b", "k", "d"]
    if split == "d":
        assert [lp.index for lp in plan.loops if lp.parallel] == ["d"]
        assert plan.chunked == "d" and plan.partial is None and not plan.collapse
    else:
        assert not any(lp.parallel for lp in plan.loops)
        assert (plan.chunked, plan.partial) == ("b", "array")
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])
    np.testing.assert_allclose(results[0], want, rtol=1e-12, atol=1e-12)
    ref = evaluate(parse(EMBAG_GRAD), dict(J=J, dy=dy),
                   kernel(EMBAG_GRAD).ranges(dE=np.zeros((rows, n_d)), dy=dy, J=J),
                   np.zeros((rows, n_d)))
    np.testing.assert_allclose(results[0], ref, rtol=1e-12, atol=1e-12)


def test_embedding_bag_gradient_scatters_rows():
    """y[b,d] := E[J[b,k], d]: its vjp for E is that scatter, d innermost."""
    rng = np.random.default_rng(8)
    J = rng.integers(0, 9, (31, 4))
    E, dy = rnd(9, 45), rnd(31, 45, seed=3)
    k = kernel("y[b,d] := E[J[b,k], d]", threads=True)
    np.testing.assert_allclose(k(E=E, J=J), E[J].sum(1), rtol=1e-12)
    want = np.zeros_like(E)
    np.add.at(want, J.ravel(), np.repeat(dy, 4, axis=0))
    np.testing.assert_allclose(k.vjp(dy, E=E, J=J)["E"], want, rtol=1e-12, atol=1e-12)
    assert "loops (outer to inner): b, k, d [threads]" in k.gradient_code, k.gradient_code


def test_a_fused_split_gives_way_to_register_blocking():
    """A locally connected layer's relaid dW: c1 (8 values, fewer than SHORT) would be fused with i
    into one parallel loop, and fused loops are not register-blocked; the single split of s
    lets the nest block 8 values of c2 at once instead.  Attention's unmasked p[b,h,i,j], which
    nothing blocks, keeps its fused b,h."""
    expr = "dW[c1,i,j,c2,s,t] = dout[s,c2,b,t] * x[s+i,c1,b,t+j]"
    lc = dict(c1=range(8), i=range(3), j=range(3), c2=range(16), s=range(30), t=range(30),
              b=range(16))
    p = schedule.plan(parse(expr), lc, "float32", threads=2, vector_bytes=64)
    assert p.jam and not p.collapse and p.loops[0].index == "s" and p.loops[0].parallel, p
    att = dict(b=range(8), h=range(8), i=range(128), j=range(128))
    p = schedule.plan(parse("p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]"), att, "float32", threads=2)
    assert p.collapse == ("b", "h") and not p.jam


def test_tile_waste_counts_the_overlapping_last_tiles():
    """A row of 34 in tiles of 32 sums 64 elements, 13 values of a jammed index in blocks of 8
    run 16: the blocked loops' work over the statement's (what blas_shift weighs them by)."""
    from tullio_py.schedule import tile_waste
    eq = parse("y[b,o,i] := x[b,c,i+j] * w[o,c,j]")
    rng = {"b": range(16), "o": range(13), "i": range(34), "c": range(40), "j": range(5)}
    plan = schedule.plan(eq, rng, "float32", vector_bytes=64)
    assert plan.jam == ("o", 8, 32), plan.jam
    assert tile_waste(plan, rng) == pytest.approx(16 / 13 * 64 / 34)
    rng = {**rng, "o": range(16), "i": range(64)}
    assert tile_waste(schedule.plan(eq, rng, "float32", vector_bytes=64), rng) == 1.0
