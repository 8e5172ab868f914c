"""Register blocking (Plan.jam, codegen/blocked.py) and the hoisted reads the schedule decides
(Plan.hoists): every blocked kernel gives what numpy, the reference interpreter and the same
plan without blocking (the plain row form) give, on sizes that leave remainders of the jam
factor and of the lane tile, on strided and Fortran-ordered inputs, on 1 and 2 threads, with
NaN in the input; with the tiles for 256-bit vectors and for 512-bit ones (Plan.wide), either
way whatever the machine has.  The work threshold for threads is lowered to 0 so that small
arrays take the blocked path; the kernels are module-level and shared (each compile costs
seconds).
"""
import os
import sys
import warnings
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from plan_variant import run_variant  # noqa: E402
from reference import evaluate  # noqa: E402

from tullio_py import codegen, jit, kernel, schedule, vjp_run  # noqa: E402
from tullio_py.kernel import Kernel  # noqa: E402
from tullio_py.codegen import blocked  # noqa: E402, F401  (the renderer under test)
from tullio_py.codegen.nest import nonunit_indices  # noqa: E402
from tullio_py.parse import parse  # noqa: E402
from tullio_py.rewrite import lower  # noqa: E402


@pytest.fixture(autouse=True)
def always_threads(monkeypatch, request):
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)
    if request.function.__name__ not in MACHINE_TILES:     # 256-bit tiles (wide: below)
        monkeypatch.setattr(jit, "vector_bytes", lambda: 32)


# Tests that run with the tiles of this machine's vectors (the others pin 256-bit ones, whose
# jam choices they check).
MACHINE_TILES = {"test_gradient_relaid_blocked_equals_numpy_and_plain"}


MM = "C[i,k] := A[i,j] * B[j,k]"
CONV = "y[s,c2,b] += x[s+i,c1,b] * W[i,c1,c2]"
CONV_SUB = "y[s,c2,b] -= x[s+i,c1,b] * W[i,c1,c2]"
NORM = "N[i,k] := A[i,j]**2 * B[j,k]**2 |> sqrt"
KERNELS = {(e, t): kernel(e, blas=False, threads=t) for e in (MM, CONV, CONV_SUB, NORM)
           for t in (True, 1)}


def rnd(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(dtype)


def _run(k, arrays):
    """(result, plan, plain result): the kernel's call, its plan, and the same plan without
    blocking compiled and run on the same inputs."""
    eq = k.equation
    arrays = {n: v.copy(order="K") if eq.assign != ":=" and n == eq.output else v
              for n, v in arrays.items()}
    before = {n: v.copy() for n, v in arrays.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = np.asarray(k(**arrays))
    inputs = {n: v for n, v in before.items() if n != eq.output}
    given = {n: v for n, v in before.items() if n != eq.output or eq.assign != ":="}
    out = before[eq.output].copy() if eq.output in before else np.zeros_like(got)
    plan = run_variant(k, given, got, inputs, out, jam=())
    return got, plan, out


def _reference(expr, arrays):
    eq = parse(expr)
    rng = kernel(expr, blas=False).ranges(**{n: v for n, v in arrays.items()
                                            if n != eq.output or eq.assign != ":="})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate(eq, arrays, rng, arrays[eq.output].copy() if eq.assign != ":=" else None)


def _strided(a):
    """A non-contiguous view with a's values."""
    big = np.zeros(tuple(2 * n for n in a.shape), a.dtype)
    view = big[tuple(slice(None, None, 2) for _ in a.shape)]
    view[...] = a
    return view


MM_CASES = {   # name: (A, B, lanes expected or None when the layout changes the plan)
    "odd 37x45x41": (rnd(37, 45), rnd(45, 41, seed=1), 32),
    "lanes 16, 9x30x20": (rnd(9, 30), rnd(30, 20, seed=1), 16),
    "exact 8x16x64": (rnd(8, 16), rnd(16, 64, seed=1), 32),
    "strided": (_strided(rnd(13, 21)), _strided(rnd(21, 35, seed=1)), 32),
    "A fortran": (np.asfortranarray(rnd(11, 17)), rnd(17, 33, seed=1), None),
    "NaN and inf": (np.where(rnd(10, 12) > 1.5, np.nan, rnd(10, 12)),
                    np.where(rnd(12, 34, seed=1) > 2, np.inf, rnd(12, 34, seed=1)), 32),
    "float32": (rnd(6, 50, dtype=np.float32), rnd(50, 19, seed=1, dtype=np.float32), 16),
    "int64": (np.arange(5 * 7).reshape(5, 7) % 11 - 5, np.arange(7 * 40).reshape(7, 40) % 7 - 3,
              32),
    # 16 rows or more (PACK_BLOCKS blocks of JAM): B copied into panels first (Plan.pack)
    "packed, B strided 35x29x45": (rnd(35, 29), _strided(rnd(29, 45, seed=1)), 32),
    "packed float32 41x50x70": (rnd(41, 50, dtype=np.float32),
                                rnd(50, 70, seed=1, dtype=np.float32), 32),
    "packed int64 16x9x33": (np.arange(16 * 9).reshape(16, 9) % 13 - 6,
                             np.arange(9 * 33).reshape(9, 33) % 5 - 2, 32),
}


def _check_matmul(got, plain, A, B):
    """The blocked and the plain result against numpy's A @ B (exactly for integers); returns
    numpy's result and the tolerance used."""
    want = np.einsum("ij,jk->ik", A, B)
    if A.dtype.kind == "i":
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(plain, want)
        return want, 0
    tol = 1e-4 if A.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got, plain, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    return want, tol


@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
@pytest.mark.parametrize("case", list(MM_CASES))
def test_matmul_blocked_equals_numpy_and_plain(case, threads):
    A, B, lanes = MM_CASES[case]
    got, plan, plain = _run(KERNELS[MM, threads], dict(A=A, B=B))
    if lanes is not None:
        assert plan.jam == ("i", schedule.JAM, lanes), plan
        assert plan.pack == (len(A) >= schedule.PACK_BLOCKS * schedule.JAM), plan
        assert ("_p0[_rb, " in KERNELS[MM, threads].forward_code) == plan.pack
        # the rows left over by the jam factor run in an overlapping last block that stores
        # only them (codegen/blocked.py): no second loop nest over i, with or without rows
        # left over ("exact 8x16x64" has none)
        text = codegen.render(plan).text
        assert (text.count("for _jb in "), text.count("for i_ in ")) == (1, 0), text
        assert "_j0 = min(" in text and "if _f0 <= " in text, text
    _check_matmul(got, plain, A, B)


@pytest.mark.parametrize("expr", [CONV, CONV_SUB])
@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
def test_shifted_accumulate_blocked_equals_reference_and_plain(expr, threads):
    x, W = rnd(20, 3, 19), rnd(3, 3, 6, seed=2)          # s 18, c2 6 (4 + 2), b 19 (16 + 3)
    y0 = rnd(18, 6, 19, seed=3)
    got, plan, plain = _run(KERNELS[expr, threads], dict(x=x, W=W, y=y0))
    assert plan.jam == ("c2", schedule.JAM, 16), plan
    sign = -1 if "-=" in expr else 1
    want = y0 + sign * sum(np.einsum("scb,cd->sdb", x[i:i + 18], W[i]) for i in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, plain, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, _reference(expr, dict(x=x, W=W, y=y0)), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
def test_short_tile_extents_are_constants(threads):
    """A tile's short extents (the jammed index, the loops inside the tile, the row; each at
    most SHORT_LOOP) are baked into the code as constants (Plan.fixed): the same values as the
    loops with the extents passed as arguments, to rounding (the compiler may reorder the
    sums it now sees whole)."""
    k = KERNELS[CONV, threads]
    x, W, y0 = rnd(20, 3, 19), rnd(3, 3, 6, seed=2), rnd(18, 6, 19, seed=3)
    got = k(x=x, W=W, y=y0.copy())
    given = dict(x=x, W=W, y=y0)
    plan = k.plan_for(given, k.ranges(**given), got.dtype, got.shape)[0]
    assert plan.jam == ("c2", schedule.JAM, 16)
    assert plan.fixed == (("c2", 0, 6), ("i", 0, 3), ("c1", 0, 3), ("b", 0, 19)), plan.fixed
    assert "    _stop_b_ = 19\n" in codegen.render(plan).text
    out = y0.copy()
    run_variant(k, given, got, {"x": x, "W": W}, out, fixed=())
    np.testing.assert_allclose(got, out, rtol=1e-13, atol=1e-13)
    want = y0 + sum(np.einsum("scb,cd->sdb", x[i:i + 18], W[i]) for i in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


LANE_SHIFT = kernel("y[o,p] := x[c,p+j] * w[o,c,j]", blas=False)


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_lane_shifted_read_is_unsigned_and_equals_numpy_and_plain(strided):
    """A read at p+j, p in the vector lanes (x of a 1D convolution, NCW): its position is
    passed as an unsigned integer (codegen/expr.py: no per-lane wraparound, so a vector load
    rather than a gather), the values those of numpy and of the unblocked plan."""
    x, w = rnd(3, 80 if strided else 40), rnd(5, 3, 3, seed=1)      # p 38: 16 + 16 + 6
    if strided:
        x = x[:, ::2]
    got, plan, plain = _run(LANE_SHIFT, dict(x=x, w=w))
    assert plan.jam and plan.jam[0] == "o", plan
    assert "_np.uint64(p_+j_)" in codegen.render(plan).text
    want = sum(np.einsum("cp,oc->op", x[:, j:j + 38], w[:, :, j]) for j in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, plain, rtol=1e-12, atol=1e-12)


DEPTHWISE = {e: kernel(e, blas=False) for e in ("y[b,c,i] := x[b,c,i+j] * w[c,j]",
                                                "y[b,c,i] += x[b,c,i+j] * w[c,j]")}


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("expr", list(DEPTHWISE))
def test_depthwise_rows_blocked_without_a_shared_read(expr, dtype, layout):
    """y[b,c,i] (+)= x[b,c,i+j] * w[c,j]: every read of the row is selected by the jammed
    index, so nothing is shared, but the sums stay in a register tile across j.  Odd sizes
    (remainders of the jam factor and of the lanes), strided inputs, an accumulated output:
    the values of the plain plan and of numpy (exactly for integers)."""
    x, w = rnd(7, 9, 45), rnd(9, 5, seed=1)
    if dtype == np.int64:
        x, w = np.round(x * 4), np.round(w * 4)
    x, w = x.astype(dtype), w.astype(dtype)
    if layout == "strided":
        x, w = _strided(x), _strided(w)
    arrays = dict(x=x, w=w)
    y0 = rnd(7, 9, 41, seed=2).astype(dtype)
    if "+=" in expr:
        arrays["y"] = y0
    got, plan, plain = _run(DEPTHWISE[expr], arrays)
    assert plan.jam and plan.jam[1] == schedule.JAM, plan
    want = sum(x[:, :, j:j + 41].astype(np.float64) * w[None, :, j, None].astype(np.float64)
               for j in range(5)) + (y0 if "+=" in expr else 0)
    if dtype == np.int64:
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(plain, want)
    else:
        tol = 1e-4 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        np.testing.assert_allclose(got, plain, rtol=tol, atol=tol)


def test_finaliser_applied_once_per_element():
    A, B = rnd(9, 14), rnd(14, 23, seed=1)
    got, plan, plain = _run(KERNELS[NORM, True], dict(A=A, B=B))
    assert plan.jam == ("i", schedule.JAM, 16)
    want = np.sqrt(np.einsum("ij,jk->ik", A ** 2, B ** 2))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got, plain, rtol=1e-12)
    np.testing.assert_allclose(got, _reference(NORM, dict(A=A, B=B)), rtol=1e-12)


def _plan(expr, sizes, threads=True, **arrays):
    eq = lower(parse(expr)).equation
    ranges = {n: range(s) for n, s in sizes.items()}
    return schedule.plan(eq, ranges, "float64", threads=threads)


@pytest.mark.parametrize("expr,sizes,jam", [
    (MM, dict(i=512, j=512, k=512), ("i", 4, 32)),
    (MM, dict(i=512, j=512, k=20), ("i", 4, 16)),
    (MM, dict(i=3, j=512, k=512), ()),                  # fewer rows than the jam factor
    (MM, dict(i=512, j=512, k=8), ()),                  # a row shorter than 16
    ("C[i,k] := A[i,j] * B[j,k] * (i <= k)", dict(i=64, j=64, k=64), ()),   # a guard on i
    ("(max) C[i,k] := A[i,j] * B[j,k]", dict(i=64, j=64, k=64), ()),       # not a sum
    # every row read selected by i: nothing loaded once for several sums, but the sums stay
    # in registers across j (the plain row form reloads and restores C's row at each j)
    ("C[i,k] := A[i,j] * B[i,k]", dict(i=64, j=64, k=64), ("i", 4, 32)),
    ("C[i,k] += C[i,k] * A[i,j] * B[j,k]", dict(i=64, j=64, k=64), ()),   # reads its output
])
def test_jam_rule(expr, sizes, jam):
    plan = _plan(expr, sizes)
    assert plan.jam == jam, plan
    assert _plan(expr, sizes) == plan                  # the choice is a function of the call
    assert _plan(expr, sizes, threads=False).jam == ()  # small kernels stay plain
    assert not (plan.jam and plan.block)
    assert plan.pack == (bool(jam) and sizes["i"] >= schedule.PACK_BLOCKS * jam[1])


def test_hoisted_reads_are_the_plans():
    """Codegen loads into locals exactly the reads the plan lists: with none listed, every
    read stays in the loop."""
    plan = _plan(MM, dict(i=64, j=64, k=64), threads=False)
    assert [(str(a), level) for a, level in plan.hoists] == [("A[i, j]", 1)]
    text = codegen.render(plan).text
    assert "_h0 = A_[i_, j_]" in text
    bare = codegen.render(replace(plan, hoists=())).text
    assert "_h0" not in bare and "A_[i_, j_] * B_[j_, k_]" in bare


@pytest.mark.parametrize("expr,jam", [
    ("y[s,c2,b] := x[pad(s+i-1,1,1),c1,b] * W[i,c1,c2]", ("c2", 4, 16)),   # padded row read
    ("C[i,k] := where(A[i,j] > 0, A[i,j], 0) * B[J[j],k] * k", ("i", 4, 32)),  # gather, index
])
def test_padded_gathered_and_index_values(expr, jam):
    r = np.random.default_rng(5)
    arrays = (dict(x=rnd(21, 3, 19), W=rnd(3, 3, 6, seed=2)) if "pad" in expr else
              dict(A=rnd(9, 13), B=rnd(13, 37, seed=1), J=r.integers(0, 13, 13)))
    k = kernel(expr, blas=False)
    got = np.asarray(k(**arrays))
    assert k.plan_for(arrays, k.ranges(**arrays), got.dtype, got.shape)[0].jam == jam
    np.testing.assert_allclose(got, _reference(expr, arrays), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- gradients
# A gradient statement whose output's contiguous index is not contiguous in a read runs on a
# copy of that read with the index's axis last (vjp_plan.relaid), register-blocked like any
# row form.  Checked against numpy and against the plain plan (relaid switched off: the fused
# nest of plain loops), on sizes that leave remainders of the jam factor and of the lane
# tile (the overlapping last tile), with strided and Fortran-ordered inputs.
LOCAL = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"
LAYER = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[c1,i,j,c2,s,t]"       # tullio_py.nn's layout
GRAD_KERNELS = {e: kernel(e) for e in (LOCAL, LAYER)}


def _local_arrays(expr, strided):
    S, T, C1, B, C2, K = (7, 6, 5, 19, 17, 3) if expr == LOCAL else (18, 20, 3, 4, 5, 3)
    x = rnd(S, T, C1, B, dtype=np.float32)
    W = (rnd(S, T, K, K, C1, C2, seed=1, dtype=np.float32) if expr == LOCAL else
         rnd(C1, K, K, C2, S - K + 1, T - K + 1, seed=1, dtype=np.float32))
    cot = rnd(S - K + 1, T - K + 1, C2, B, seed=2, dtype=np.float32)
    if strided:
        x, cot = _strided(x), np.asfortranarray(cot)
    return x, W, cot


def _local_numpy(expr, x, W, cot):
    """dx, dW in float64 numpy: out[s,t,c2,b] = sum of x[s+i,t+j,c1,b] * w(s,t,i,j,c1,c2)."""
    x, W, cot = (np.asarray(a, np.float64) for a in (x, W, cot))
    S, T, K = cot.shape[0], cot.shape[1], 3
    dx, dW = np.zeros_like(x), np.zeros_like(W)
    for i in range(K):
        for j in range(K):
            w = W[i:i + S, j:j + T, i, j] if expr == LOCAL else W[:, i, j].transpose(2, 3, 0, 1)
            dx[i:i + S, j:j + T] += np.einsum("stdb,stcd->stcb", cot, w)
            dw = np.einsum("stdb,stcb->stcd", cot, x[i:i + S, j:j + T])
            if expr == LOCAL:
                dW[i:i + S, j:j + T, i, j] += dw
            else:
                dW[:, i, j] += dw.transpose(2, 3, 0, 1)
    return dx, dW


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("expr", [LOCAL, LAYER], ids=["local", "layer"])
def test_gradient_relaid_blocked_equals_numpy_and_plain(expr, strided, monkeypatch):
    from tullio_py import relayout, vjp_plan
    from tullio_py.gradient_kernel import Gradient
    k = GRAD_KERNELS[expr]
    x, W, cot = _local_arrays(expr, strided)
    g = Gradient(k)
    got = g.vjp(cot, x=x, W=W)
    plan = g.last_plan
    relaid = {s.output: s.relayout for s in plan.statements}
    # dW's statement reads the cotangent (and, for the layer, x) with c2 (t) last; the
    # local convolution's Fortran-ordered cotangent is copied C-ordered for dx too, which its
    # row of 19 then blocks (the layer's row of 4 is too short)
    want = {"dx": (), "dW": (("dout", (0, 1, 3, 2)),)} if expr == LOCAL else {
        "dx": (), "dW": (("dout", (0, 2, 3, 1)), ("x", (0, 2, 3, 1)))}
    if strided and expr == LOCAL:
        want["dx"] = (("dout", (0, 1, 2, 3)),)
    assert relaid == want, relaid
    assert [s.kind for s in plan.steps] == ["loops", "loops"]
    # dW's statement writes each element of dW at most once, summing b in registers: it runs
    # as '=' into an unfilled array (vjp_written.unzeroed; NaN below); the local
    # convolution's as its gather (dW[p,q,i,j,c1,c2] = dout[p-i,q-j,b,c2] * x[p,q,c1,b] *
    # masks), W's elements no (s, t, i, j) reads (p < i, p - i >= 5, q < j, q - j >= 4)
    # zeroed alone
    assert [(a.name, a.written) for a in plan.arrays] == [("dx", False), ("dW", True)]
    dW_plan = plan.arrays[1]
    if expr == LOCAL:
        never = np.ones(W.shape, bool)
        for i in range(3):
            for j in range(3):
                never[i:i + 5, j:j + 4, i, j] = False
        boxed = np.zeros(W.shape, bool)
        for box in dW_plan.zero:
            boxed[tuple(slice(lo, hi) for lo, hi in box)] = True
        assert (boxed == never).all()
        assert [n for n, _ in plan.statements[1].consts] == ["_lo_s", "_hi_s", "_lo_t", "_hi_t"]
    else:
        assert dW_plan.zero == ()
    monkeypatch.setattr(vjp_run.Host, "empty", staticmethod(lambda shape, dtype: np.full(
        shape, np.nan, dtype)))
    got = Gradient(k).vjp(cot, x=x, W=W)
    again = Gradient(k)
    again.vjp(cot, x=x, W=W)
    assert again.last_plan == plan                  # the choice is a function of the call
    dx, dW = _local_numpy(expr, x, W, cot)
    np.testing.assert_allclose(got["x"], dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["W"], dW, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(vjp_plan, "relaid", lambda s, *a: s)      # the plain plan (and no
    monkeypatch.setattr(relayout, "choose", lambda *a, **o: None)       # statement's own copies)
    plain = Gradient(k)
    want = plain.vjp(cot, x=x, W=W)
    assert all(not s.relayout for s in plain.last_plan.statements)
    np.testing.assert_allclose(got["x"], want["x"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["W"], want["W"], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- 512-bit tiles
VECTOR_BYTES = jit.vector_bytes      # (the fixture above replaces it in most tests)


def test_vector_bytes_follow_numba_target(monkeypatch):
    """64 only where numba compiles for AVX-512: its target features, else the host's unless
    a CPU name is set or AVX is switched off."""
    from numba.core import config
    for features, name, avx, want in [("+avx2,+avx512f", None, True, 64),
                                      ("+avx2,-avx512f", None, True, 32),
                                      (None, "generic", True, 32), (None, None, False, 32)]:
        monkeypatch.setattr(jit, "_VECTOR_BYTES", [])
        monkeypatch.setattr(config, "CPU_FEATURES", features)
        monkeypatch.setattr(config, "CPU_NAME", name)
        monkeypatch.setattr(config, "ENABLE_AVX", avx)
        assert VECTOR_BYTES() == want, (features, name, avx)


WIDE = {t: kernel(MM, blas=False, threads=t) for t in (True, 1)}     # (KERNELS' MM kernels:
WIDE_CASES = {   # name: (A, B, jam factor, lanes)             # shapes unlike MM_CASES')
    "f64 odd 37x45x43": (rnd(37, 45), rnd(45, 43, seed=1), 8, 16),
    "f32 odd 13x50x37": (rnd(13, 50, dtype=np.float32), rnd(50, 37, seed=1, dtype=np.float32),
                         8, 32),
    "f32 6 rows, row 19": (rnd(6, 52, dtype=np.float32), rnd(52, 19, seed=1, dtype=np.float32),
                           4, 16),
    "f32 strided": (_strided(rnd(17, 21, dtype=np.float32)),
                    _strided(rnd(21, 70, seed=1, dtype=np.float32)), 8, 32),
    "f32 NaN and inf": (np.where(rnd(10, 12) > 1.5, np.nan, rnd(10, 12)).astype(np.float32),
                        np.where(rnd(12, 34, seed=1) > 2, np.inf,
                                 rnd(12, 34, seed=1)).astype(np.float32), 8, 32),
    "int64": (np.arange(9 * 7).reshape(9, 7) % 11 - 5, np.arange(7 * 40).reshape(7, 40) % 7 - 3,
              8, 16),
}


@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_wide_tiles_equal_numpy_and_plain(case, threads, monkeypatch):
    """JAM_WIDE rows (JAM when fewer) of 128 bytes of the row (64 when it is shorter), marked
    for 512-bit vectors; the same results as numpy, the plain row form and plain Python."""
    monkeypatch.setattr(jit, "vector_bytes", lambda: 64)
    A, B, factor, lanes = WIDE_CASES[case]
    got, plan, plain = _run(WIDE[threads], dict(A=A, B=B))
    assert plan.wide and plan.jam == ("i", factor, lanes), plan
    assert "_wide_vectors()" in codegen.render(plan).text
    want, tol = _check_matmul(got, plain, A, B)
    if threads is True and case.startswith("f32 odd"):
        python = kernel(MM, blas=False, target="python")(A=A, B=B)
        np.testing.assert_allclose(python, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("expr,build,want", [
    ("e[i,j] := exp(x[i,j] - m[i])", lambda x: dict(x=x, m=x.max(1)),
     lambda x: np.exp(x - x.max(1)[:, None])),
    ("s[i] := exp(x[i,j] - m[i])", lambda x: dict(x=x, m=x.max(1)),
     lambda x: np.exp(x - x.max(1)[:, None]).sum(1)),
], ids=["elementwise", "sum"])
@pytest.mark.parametrize("width", [32, 64])
def test_vector_math_loops_prefer_wide_vectors(expr, build, want, width, monkeypatch):
    """A body calling vector math (exp) is compute-bound: with 512-bit vectors on the machine
    its loops are marked to use them (Plan.wide); results as numpy's and plain Python's, odd
    sizes, a strided input."""
    monkeypatch.setattr(jit, "vector_bytes", lambda: width)
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)
    x = np.random.default_rng(5).standard_normal((37, 46)).astype(np.float32)[:, 1::2]
    k = type(kernel(expr))(parse(expr))     # uncached: planned under this vector width
    got = k(**build(x))
    assert (k.last.plan.wide, "_wide_vectors()" in k.forward_code) == (width == 64,) * 2
    np.testing.assert_allclose(got, want(x.astype(np.float64)), rtol=1e-5)
    plain = kernel(expr, target="python")(**build(x))
    np.testing.assert_allclose(got, plain, rtol=1e-6)


def test_prefer_wide_is_optional():
    """The 512-bit mark is added to llvmlite's attribute set as text; where an llvmlite no
    longer accepts that, the mark is skipped (the kernel compiles at the default width)
    instead of failing the compile."""
    from llvmlite import ir
    from tullio_py import intrinsics

    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    assert intrinsics.prefer_wide(fn)
    assert '"prefer-vector-width"="512"' in str(module)

    class Frozen:
        attributes = frozenset()
    assert not intrinsics.prefer_wide(Frozen())


# ----------------------------------------------------------------------------- one thread
# On one thread the local convolution's register-blocked loops beat the cost model's best BLAS
# plan over strided views (an im2col plan at the plain-loop rate): the forward call weighs
# them as explain and the gradient do (it once asked at the plain-loop rate and kept that
# answer), and the gradient's dW runs relaid and blocked rather than through BLAS.
MACHINE_TILES |= {"test_one_thread_forward_weighs_blocked_loops",
                  "test_one_thread_gradient_relaid_blocked"}


def _bench_arrays():
    S, T, C1, B, C2, K = 32, 32, 8, 16, 16, 3         # benchmarks/bench_suite.py's sizes
    x = rnd(S, T, C1, B, dtype=np.float32)
    W = rnd(S, T, K, K, C1, C2, seed=1, dtype=np.float32)
    cot = rnd(S - K + 1, T - K + 1, C2, B, seed=2, dtype=np.float32)
    return x, W, cot


def test_one_thread_forward_weighs_blocked_loops():
    from tullio_py.kernel import Kernel
    x, W, _ = _bench_arrays()
    called, asked = Kernel(LOCAL, threads=1), Kernel(LOCAL, threads=1)
    got = called(x=x, W=W)                 # the call first: its plan memo keeps its answer
    out = np.empty(got.shape, got.dtype)
    blas = asked.uses_blas(dict(x=x, W=W), asked.ranges(x=x, W=W), out)
    assert (called.last is not None, blas) == (True, False)     # both: the blocked loops
    assert called.last.plan.jam
    want = sum(np.einsum("stcb,stcd->stdb", x[i:i + 30, j:j + 30].astype(np.float64),
                         W[i:i + 30, j:j + 30, i, j].astype(np.float64))
               for i in range(3) for j in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_one_thread_gradient_relaid_blocked():
    from tullio_py.gradient_kernel import Gradient
    from tullio_py.kernel import Kernel
    x, W, cot = _bench_arrays()
    g = Gradient(Kernel(LOCAL, threads=1))
    got = g.vjp(cot, x=x, W=W)
    plan = g.last_plan
    assert {s.output: s.relayout for s in plan.statements} == {
        "dx": (), "dW": (("dout", (0, 1, 3, 2)),)}
    assert [s.kind for s in plan.steps] == ["loops", "loops"]
    assert all(rec is not None for rec in g.last[4].values())     # loops ran, not BLAS
    dx, dW = _local_numpy(LOCAL, x, W, cot)
    np.testing.assert_allclose(got["x"], dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["W"], dW, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jam_index_is_one_the_rows_reads_do_not_select(dtype):
    """conv2d NCHW y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]: the row v is read from x, which
    h selects and o does not: o is jammed (one load of x for all its values, schedule.jam_last),
    not h; numpy's numbers and the unblocked plan's, on odd sizes (o 13: an overlapping last
    block of o)."""
    x, w = rnd(16, 5, 9, 37, dtype=dtype), rnd(13, 5, 3, 3, seed=1, dtype=dtype)
    k = kernel("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]", blas=False)
    got, plan, plain = _run(k, dict(x=x, w=w))
    assert plan.jam and plan.jam[0] == "o", plan.jam
    want = sum(np.einsum("bchv,oc->bohv", x[:, :, i:i + 7, j:j + 35].astype(np.float64),
                         w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))
    tol = 2e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got, plain, rtol=tol, atol=tol)


def test_short_reductions_are_constants_only_when_all_are():
    """conv1d y[b,o,i] := x[b,c,i+j] * w[o,c,j] with c of 40 (above SHORT_LOOP): j (5) keeps
    its bounds as arguments, unlike the tile's own short extents; conv2d NHWC, whose reductions
    are all short, bakes them all in.  Both give numpy's numbers."""
    x, w = rnd(16, 40, 70), rnd(16, 40, 5, seed=1)
    k = kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", blas=False)
    got, plan, _ = _run(k, dict(x=x, w=w))
    assert plan.jam and {f[0] for f in plan.fixed} & {"c", "j"} == set(), plan.fixed
    want = sum(np.einsum("bci,oc->boi", x[:, :, j:j + 66], w[:, :, j]) for j in range(5))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    x2, w2 = rnd(16, 9, 11, 8), rnd(3, 3, 8, 16, seed=1)
    k2 = kernel("y[b,h,v,o] := x[b,h+i,v+j,c] * w[i,j,c,o]", blas=False)
    got2, plan2, _ = _run(k2, dict(x=x2, w=w2))
    assert plan2.jam and {"i", "j", "c"} <= {f[0] for f in plan2.fixed}, plan2.fixed
    want2 = sum(np.einsum("bhvc,co->bhvo", x2[:, i:i + 7, j:j + 9], w2[i, j])
                for i in range(3) for j in range(3))
    np.testing.assert_allclose(got2, want2, rtol=1e-11, atol=1e-11)


POOL = kernel("(max) y[b,c,h,v] := x[b,c,2h+i,2v+j]", ranges={"i": 2, "j": 2})


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pool_window_runs_inside_its_strided_index_unrolled(dtype):
    """A 2x2 max-pool reads x at 2v+j: the window's loops i and j run inside v with constant
    bounds (schedule._window: the compiler unrolls them, and v's loop loads x as whole vectors),
    v's loop a plain `range(start, stop)`; the values numpy's, NaN included."""
    x = rnd(3, 4, 10, 14).astype(dtype)
    x[1, 2, 3, 5] = np.nan
    got = POOL(x=x)
    plan = POOL.plan_for({"x": x}, POOL.ranges(x=x), got.dtype, got.shape)[0]
    text = codegen.render(plan).text
    order = [l.index for l in plan.loops]
    assert plan.form == "scalar" and order[-3:] == ["v", "i", "j"], order
    assert plan.fixed == (("i", 0, 2), ("j", 0, 2)) and plan.lanes == 0, plan
    assert "for v_ in range(_start_v_, _stop_v_):" in text, text
    want = x.reshape(3, 4, 5, 2, 7, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[1, 2, 1, 2]) and np.isnan(got).sum() == 1
    # its argmax helper chooses with where: counted from 0 (measured faster there)
    helper = parse(POOL.gradient_equations["x"][0])
    assert nonunit_indices([POOL.equation]) == {"h", "v"} and nonunit_indices([helper]) == set()


@pytest.mark.parametrize("text,shape", [
    ("y[b,c,h,v] := x[b,c,2h+i,2v+j] / 4", (4, 8, 62, 66)),          # average pool
    ("y[b,c,v] := x[b,c,2v+j] * w[c,j]", (8, 16, 301)),              # strided depthwise conv
    ("(min) y[b,c,h,v] := x[b,c,3h+i,3v+j]", (4, 8, 62, 66)),         # 3x3 window, stride 3
])
def test_window_form_gives_the_bits_of_the_row_form(text, shape, monkeypatch):
    """A short window read at a stride in the contiguous index runs inside that index
    (schedule._window); without that rule the statement runs in the row form.  A (max) or
    (min) gives the same bits in both, NaN included; a sum the same to rounding (the compiler
    may reassociate the unrolled window's sum)."""
    x = rnd(*shape)
    x[(0,) * len(shape)] = np.nan
    ranges = {"i": 3, "j": 3} if "3h" in text else {"i": 2, "j": 2} if "h" in text else {"j": 2}
    arrays = {"x": x, "w": rnd(shape[1], 2)} if "w[" in text else {"x": x}
    fast = Kernel(text, ranges=ranges)
    got = fast(**arrays)
    plan = fast.plan_for(arrays, fast.ranges(**arrays), got.dtype, got.shape)[0]
    red = [l.index for l in plan.loops if l.reduction]
    assert plan.form == "scalar" and [f[0] for f in plan.fixed] == red, plan
    inside = plan.loops[-1 - len(red)]           # the strided index, just outside the window
    assert inside.index == "v" and not inside.parallel, plan.loops
    monkeypatch.setattr(schedule, "_window", lambda *a: False)
    rows = Kernel(text, ranges=ranges)
    assert rows.plan_for(arrays, rows.ranges(**arrays), got.dtype, got.shape)[0].form == "row"
    # the brute-force interpreter of the statement (tests/reference.py) as the reference
    # (its comparisons drop NaN, which the kernels propagate: compared beside that element)
    ref = evaluate(parse(text), arrays, fast.ranges(**arrays))
    rest = np.ones(got.shape, bool)
    rest.flat[0] = False
    np.testing.assert_allclose(got[rest], ref[rest], rtol=1e-12, atol=1e-12)
    want = rows(**arrays)
    if text.startswith("(min)"):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    assert np.isnan(got.flat[0]) and np.isnan(got).sum() == 1


# A convolution's weight gradient with the channel in the lanes (relayout's short-row scratch):
# the left indices i and j (3 each) outside the split, jammed index o.
DW_LANES = "dW[i,j,o,c] := dy[b,o,p,q] * x[b,p+i,q+j,c]"


@pytest.mark.parametrize("sizes,order,jam", [
    (dict(i=3, j=3, o=20, c=19, b=2, p=5, q=6), ("i", "j", "o"), ("o", schedule.JAM, 16)),
    # 81 iterations outside the split exceed JAM_OUTER: o moves outermost, j is jammed
    (dict(i=9, j=9, o=20, c=19, b=2, p=5, q=6), ("o", "i", "j"), ("j", schedule.JAM, 16)),
])
def test_jammed_split_loop_stays_inside_short_left_loops(sizes, order, jam):
    plan = _plan(DW_LANES, sizes)
    assert tuple(l.index for l in plan.loops[:3]) == order, plan
    assert [l.index for l in plan.loops if l.parallel] == ["o"], plan
    assert plan.jam == jam, plan
    assert _plan(DW_LANES, sizes) == plan


@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
def test_jammed_split_loop_inside_equals_numpy_and_plain(threads):
    """Blocks of o in parallel inside the loops over i and j (a parallel region per (i, j)):
    numpy's numbers and the plain row form's, with o and c leaving remainders of the jam
    factor and of the lanes, x strided."""
    dy = rnd(2, 21, 5, 6, seed=4)
    x = _strided(rnd(2, 7, 8, 19, seed=5))
    got, plan, plain = _run(kernel(DW_LANES, blas=False, threads=threads), dict(dy=dy, x=x))
    assert plan.jam == ("o", schedule.JAM, 16) and plan.loops[2].index == "o", plan
    want = np.einsum("bopq,bpqijc->ijoc", dy, np.lib.stride_tricks.sliding_window_view(
        x, (5, 6), axis=(1, 2))[:, :3, :3].transpose(0, 4, 5, 1, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, plain, rtol=1e-12, atol=1e-12)
