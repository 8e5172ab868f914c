"""Float (max)/(min) over a contiguous loop as one vectorised chain of IEEE maximum/minimum
(codegen.cpu._extremum): the result is bit for bit the plain loop's (the same plan without
lanes: one `acc = v if (v > acc) | (v != v) else acc` per element, the first extremal element
in index order), NaN anywhere gives NaN, +-inf, ties, and a zero maximum with the sign of the
first zero; on rows, on a reduction nested in another reduction loop, on a full reduction
split into chunks, on strided and Fortran-ordered inputs, on 1 and 2 threads, float32 and
float64, compiled and in plain Python.  The work threshold for threads is lowered to 0 so
that small arrays take the parallel path; the kernels are module-level and shared.
"""
import os
import sys

import numpy as np
import pytest

from tullio_py import jit, kernel, schedule

sys.path.insert(0, os.path.dirname(__file__))
from plan_variant import run_variant  # noqa: E402

NAN, INF = np.nan, np.inf


@pytest.fixture(autouse=True)
def always_threads(monkeypatch):
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)


ROWS = "({}) R[i] := A[i,j]"
NESTED = "({}) R[i] := A[i,j,k]"
FULL = "({}) m := x[i]"
EXPR = "({}) R[i] := A[i,j] * B[j]"
KERNELS = {(e.format(red), t): kernel(e.format(red), threads=t)
           for e in (ROWS, NESTED, FULL, EXPR) for red in ("max", "min") for t in (True, 1)}


def _rows(width=203):
    """Rows of special cases for (max); negated for (min), they are its mirror image."""
    r = np.random.default_rng(3)
    A = r.standard_normal((16, width))
    A[1, 0] = NAN                                   # NaN first
    A[2, -1] = NAN                                  # NaN last (in the remainder of any lanes)
    A[3, :] = NAN
    A[4, :] = -1.0
    A[4, 5], A[4, 9] = -0.0, 0.0                    # zero maximum: the first zero's sign
    A[5, :] = -2.0
    A[5, 7], A[5, width - 2] = 0.0, -0.0
    A[6, :] = -INF
    A[7, 11], A[7, width // 2] = INF, NAN             # NaN beats inf
    A[8, 3], A[8, width // 2] = INF, INF
    A[9, :] = -0.0
    A[10, :] = 0.0
    A[11, :] = r.integers(-3, 3, width)             # ties
    A[12, :] = -3.0
    A[12, width - 1] = -0.0                         # the only zero, last
    A[13, :] = -1.0
    A[13, ::2] = 0.0
    A[13, 1::2] = -0.0
    A[14, 30] = -NAN                                # a NaN with its sign bit set
    return A


def _same(got, want):
    """Bit for bit, except that any NaN equals any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


def _plain(k, arrays, got):
    """The call's plan without lanes (the plain loop), compiled and run on the same inputs;
    also returns the plan."""
    out = np.zeros(got.shape or (1,), got.dtype)
    plan = run_variant(k, arrays, got, arrays, out, lanes=0)
    return out.reshape(got.shape), plan


def _check(expr, threads, arrays, red, numpy_ref=None):
    k = KERNELS[expr.format(red), threads]
    got = np.asarray(k(**arrays))
    plain, plan = _plain(k, arrays, got)
    _same(got, plain)
    if numpy_ref is not None:
        np.testing.assert_array_equal(got, numpy_ref)     # values (NaN == NaN, 0 == -0)
    python = kernel(expr.format(red), target="python")(**arrays)
    _same(np.asarray(python), plain)
    return k, plan


LAYOUTS = {
    "C": lambda A: A,
    "strided": lambda A: np.repeat(A, 2, axis=1)[:, ::2],
    "fortran": np.asfortranarray,
}


ROW_CASES = [(layout, red, dtype, True) for layout in LAYOUTS for red in ("max", "min")
             for dtype in (np.float32, np.float64) if layout == "C" or dtype == np.float64]
ROW_CASES += [("C", "max", np.float32, 1)]


@pytest.mark.parametrize("layout,red,dtype,threads", ROW_CASES)
def test_rows_equal_plain_loop(layout, red, dtype, threads):
    A = _rows().astype(dtype)
    A = LAYOUTS[layout](A if red == "max" else -A)
    f = np.max if red == "max" else np.min
    k, plan = _check(ROWS, threads, dict(A=A), red, f(A, axis=1))
    if layout == "C":                   # (j is not contiguous in the others)
        name = "maximum" if red == "max" else "minimum"
        assert plan.lanes and f"_vm_{name}_f{8 * A.itemsize}(" in k.forward_code, plan


@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
@pytest.mark.parametrize("red", ["max", "min"])
def test_reduction_inside_another_reduction_loop(red, threads):
    """R[i] := A[i,j,k]: each k loop is one chain, combined over j as the plain loop does (a
    zero from an earlier j keeps its sign against an equal zero later)."""
    A = np.stack([_rows(37)[:8], _rows(37)[8:]], axis=1)          # 8 x 2 x 37
    A[0, 0, :], A[0, 1, :] = -1.0, -1.0
    A[0, 0, 20], A[0, 1, 3] = -0.0, 0.0
    A[1, 0, :], A[1, 1, :] = -0.0, 0.0
    A = A if red == "max" else -A
    f = np.max if red == "max" else np.min
    _check(NESTED, threads, dict(A=A), red, f(A, axis=(1, 2)))


@pytest.mark.parametrize("threads", [True, 1], ids=["threads", "1 thread"])
@pytest.mark.parametrize("red", ["max", "min"])
@pytest.mark.parametrize("case", ["zeros", "nan", "plain"])
def test_full_reduction_in_chunks(case, red, threads):
    n = 40_003
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    if case == "zeros":
        x[:] = -1.0
        x[[7_777, 7_900, 31_000]] = [-0.0, 0.0, 0.0]    # one chunk, and another
    elif case == "nan":
        x[n - 1] = NAN
    x = x if red == "max" else -x
    k, plan = _check(FULL, threads, dict(x=x), red, np.max(x) if red == "max" else np.min(x))
    if threads is True:
        assert plan.chunked and plan.partial == "scalar"


@pytest.mark.parametrize("red", ["max", "min"])
def test_value_expression_and_zero_rescan(red):
    """The value is an expression (of float64 from float32 and float64), computed again by
    the pass that finds the first zero."""
    A = _rows(45).astype(np.float32)
    B = np.abs(np.random.default_rng(6).standard_normal(45)) + 0.5
    A = A if red == "max" else -A
    f = np.max if red == "max" else np.min
    _check(EXPR, True, dict(A=A, B=B), red, f(A * B, axis=1))


def test_integers_keep_the_lane_loop():
    A = np.random.default_rng(7).integers(-50, 50, (9, 203))
    k = KERNELS[ROWS.format("max"), True]
    np.testing.assert_array_equal(k(A=A), A.max(axis=1))
    assert "_vm_" not in k.forward_code and "_a7" in k.forward_code


def test_compiled_maximum_and_minimum_are_ieee():
    """vm_maximum/vm_minimum (llvm.maximum/minimum) against vecmath's plain definitions and
    the rule: NaN when either is NaN, -0.0 below +0.0."""
    from tullio_py import vecmath
    special = [0.0, -0.0, 1.5, -2.0, INF, -INF, NAN]
    for dtype, t in ((np.float32, "f32"), (np.float64, "f64")):
        for a in map(dtype, special):
            for b in map(dtype, special):
                for name, pick in (("maximum", max), ("minimum", min)):
                    got = getattr(jit, f"vm_{name}_{t}")(a, b)
                    plain = getattr(vecmath, name)(a, b)
                    if np.isnan(a) or np.isnan(b):
                        assert np.isnan(got) and np.isnan(plain)
                        continue
                    want = pick(a, b, key=lambda v: (v, not np.signbit(v)))
                    _same(np.array([got, plain], dtype), np.array([want, want], dtype))
