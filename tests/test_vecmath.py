"""vecmath.py's exp, log and tanh against correctly rounded references over the whole float
range, compiled
(as kernels call it) and as plain Python; and that kernels call it where they should."""
import numpy as np
import pytest

from tullio_py import jit, kernel, vecmath

# Reference dtype per dtype: longdouble has 64 significand bits on x86-64 Linux (where it is
# just float64, the float64 sweeps check against numpy's own functions).
REF = {np.float32: np.float64, np.float64: np.longdouble}
# Largest error in ulps allowed (measured on the sweeps: exp 0.96 for float32, 1.54 for
# float64, where Cephes' rational approximation rounds twice more than numpy's exp; log 0.78
# and 0.88; tanh 1.30 and 1.38).  numpy's own errors for comparison: exp 2.37 / 0.71, log
# 3.31 / 0.60, tanh 1.37 / 1.18.
BOUND = {("exp", np.float32): 1.0, ("exp", np.float64): 1.6, ("log", np.float32): 1.0,
         ("log", np.float64): 1.0, ("tanh", np.float32): 1.5, ("tanh", np.float64): 1.5}
NUMPY_BOUND = 3.5
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-30, -1e-30]


def sweep(func, dtype, n=1_000_000, seed=0):
    """n values over the whole domain of `func` in `dtype`, plus the special values.  exp:
    uniform over (and beyond) the range where exp goes from 0 to inf, values near the
    overflow, underflow and subnormal thresholds, and tiny ones; log: log-uniform over all
    positive floats (subnormal included), uniform near 1 and on [0.5, 2]; tanh: uniform on
    [-25, 25] (where it reaches +-1) and near the switch at +-0.625, and tiny values."""
    info = np.finfo(dtype)
    rng = np.random.default_rng(seed)
    if func == "exp":
        over, under = np.log(info.max), np.log(info.smallest_subnormal)
        parts = [rng.uniform(t - 1, t + 1, n // 20) for t in (over, under, np.log(info.tiny))]
        parts.append(rng.standard_normal(n // 20) * 10.0 ** rng.uniform(-40, 0, n // 20))
        lo, hi = under - 5, over + 2
    elif func == "tanh":
        parts = [rng.uniform(-0.7, 0.7, n // 5),
                 rng.standard_normal(n // 20) * 10.0 ** rng.uniform(-40, 0, n // 20)]
        lo, hi = -25.0, 25.0
    else:
        lo, hi = np.log2(info.smallest_subnormal), np.log2(info.max)
        parts = [2.0 ** rng.uniform(lo, hi, n // 2), 1 + rng.standard_normal(n // 10) * 1e-3,
                 [info.smallest_subnormal, info.tiny, info.max, -info.max]]
        lo, hi = 0.5, 2.0
    parts.append(rng.uniform(lo, hi, n - sum(map(len, parts))))
    return np.concatenate(parts + [SPECIAL]).astype(dtype)


def ulp_error(func, got, x, dtype):
    """|got - func(x)| in units of the last place of func(x) rounded to `dtype` (its spacing
    at the correctly rounded value: subnormal spacing below the normal range); 0 where both
    are the same inf or NaN."""
    ref_type = REF[dtype]
    with np.errstate(all="ignore"):
        exact = getattr(np, func)(x.astype(ref_type))
        rounded = exact.astype(dtype)
        finite = np.isfinite(rounded)
        ulp = np.spacing(np.abs(rounded[finite])).astype(ref_type)
        err = np.zeros(x.shape)
        err[finite] = np.abs(got[finite].astype(ref_type) - exact[finite]) / ulp
    same = (got[~finite] == rounded[~finite]) | (np.isnan(got[~finite]) & np.isnan(rounded[~finite]))
    err[~finite] = np.where(same, 0.0, np.inf)
    return err


def name(func, dtype):
    return f"{func}_f{8 * np.dtype(dtype).itemsize}"


def test_a_fastmath_kernel_does_not_change_it():
    """numba compiles a called function with its caller's fastmath flags unless it has its
    own: the first kernel to call exp must not decide, for every later caller, that NaN and
    inf do not occur.  (First in this file: the sweep below then checks the compiled code.)"""
    x = np.array([88.68431, 88.7, -103.5, np.nan, np.inf, -np.inf, 1.0] * 3, np.float32)
    got = kernel("e[i] := exp(x[i])", fastmath=True)(x=x)
    with np.errstate(over="ignore"):
        want = np.exp(x)
    np.testing.assert_allclose(got, want, rtol=2 * np.finfo(np.float32).eps)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isinf(got[4])


@pytest.fixture(scope="module")
def loop():
    """A compiled loop applying a vecmath function to every element, as kernels do."""
    import numba
    fns = {}

    def run(name, x):
        if name not in fns:
            f = jit.vector_function(name)

            @numba.njit
            def apply(x, y):
                for i in range(x.shape[0]):
                    y[i] = f(x[i])
            fns[name] = apply
        y = np.empty_like(x)
        fns[name](x, y)
        return y
    return run


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("func", ["exp", "log", "tanh"])
def test_within_bound_ulps_over_the_float_range(loop, func, dtype):
    x = sweep(func, dtype)
    got = loop(name(func, dtype), x)
    assert got.dtype == dtype
    err = ulp_error(func, got, x, dtype)
    worst = int(np.argmax(err))
    assert err.max() <= BOUND[func, dtype], (x[worst], got[worst], err.max())
    with np.errstate(all="ignore"):
        mine = getattr(np, func)(x)             # numpy's own, for comparison
    assert ulp_error(func, mine, x, dtype).max() <= NUMPY_BOUND   # the reference agrees
    for same in (np.isinf, np.isnan, lambda v: v == 0, lambda v: np.signbit(v) & (v == v)):
        assert np.array_equal(same(got), same(mine))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("func", ["exp", "log", "tanh"])
def test_runs_as_plain_python(func, dtype):
    """The same functions uncompiled (pow2, exponent, mantissa through numpy) agree."""
    x = np.array(SPECIAL + [-104.0, -87.5, 88.5, -745.0, 709.0, 3.7, 1e-40, 1e-310, 0.3, -0.7],
                 dtype)
    with np.errstate(all="ignore"):
        got = np.array([vecmath.FUNCTIONS[name(func, dtype)](v) for v in x])
    assert got.dtype == dtype
    assert ulp_error(func, got, x, dtype).max() <= BOUND[func, dtype]


EXP = kernel("e[i,j] := exp(x[i,j] - m[i])")
SIGMOID = kernel("s[i] := sigmoid(x[i])")
LOG = kernel("y[i] := log(x[i]) * 2")
TANH = kernel("y[i] := tanh(x[i]) * 2")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_call_it_on_cpu_and_numpy_in_python(dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((33, 17)) * 30).astype(dtype)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    m = rng.standard_normal(33).astype(dtype)
    got = EXP(x=x, m=m)
    assert "_vm_exp_" in EXP.forward_code
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        want = np.exp(x - m[:, None])
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps)
    assert got.dtype == dtype
    s = SIGMOID(x=x[:, 3].copy())
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(s, 1 / (1 + np.exp(-x[:, 3])), rtol=4 * np.finfo(dtype).eps)
    py = kernel("e[i,j] := exp(x[i,j] - m[i])", target="python")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        np.testing.assert_array_equal(py(x=x, m=m), want)
    assert "_vm_exp_f64 = _np.exp" in py.source("python")     # the text of float64 calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_log_kernel(dtype):
    """log's specials and dtypes in a kernel: integers are read as float64, as numpy does."""
    x = np.array([0, -1, 1, 3, 2 ** 20, 7, 1e-30, np.inf, np.nan, -np.inf] * 3)
    x = (x[np.isfinite(x) & (np.abs(x) < 2 ** 31) & (x == np.round(x))] if dtype == np.int32
         else x).astype(dtype)
    got = LOG(x=x)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log(x) * 2
    assert got.dtype == want.dtype and "_vm_log_" in LOG.forward_code
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(want.dtype).eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_kernel(dtype):
    x = np.array([0.0, -0.0, 0.3, -0.7, 5.0, -30.0, 1e-30, np.inf, -np.inf, np.nan] * 3, dtype)
    got = TANH(x=x)
    want = np.tanh(x) * 2
    assert got.dtype == dtype and "_vm_tanh_" in TANH.forward_code
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps)
    assert np.array_equal(np.signbit(got) & (got == got), np.signbit(want) & (want == want))


def correctly_rounded(exact, dtype):
    """The float of `dtype` nearest the Fraction `exact` (ties to even), from the float64
    nearest it and its neighbours."""
    from fractions import Fraction
    v = dtype(float(exact))
    cands = [v, np.nextafter(v, dtype(np.inf)), np.nextafter(v, dtype(-np.inf))]
    dist = [abs(Fraction(float(c)) - exact) for c in cands]
    best = min(dist)
    near = [c for c, d in zip(cands, dist) if d == best]
    itype = np.int32 if dtype == np.float32 else np.int64
    return near[0] if len(near) == 1 else [c for c in near if int(c.view(itype)) % 2 == 0][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fma_rounds_once(dtype):
    """vecmath.fma, compiled in a vectorised loop and as plain Python, is a*b + c correctly
    rounded, where a multiply then an add round twice (and differ on some of these)."""
    import numba
    from fractions import Fraction
    jit.vector_function("exp_f32")                     # (registers the intrinsics)
    fma = vecmath.fma

    @numba.njit(fastmath=False)
    def fused(a, b, c, out):
        for i in range(a.shape[0]):
            out[i] = fma(a[i], b[i], c[i])
    rng = np.random.default_rng(2)
    n = 400
    a = (1 + rng.uniform(-1, 1, n) * 2.0 ** rng.integers(-30, 0, n)).astype(dtype)
    b = (1 + rng.uniform(-1, 1, n) * 2.0 ** rng.integers(-30, 0, n)).astype(dtype)
    c = -(a * b) * (1 + rng.uniform(-1, 1, n) * 2.0 ** -20).astype(dtype)   # cancellation
    c[:3] = [np.inf, 1.0, np.nan]
    got = np.empty_like(a)
    fused(a, b, c, got)
    finite = np.isfinite(c)
    want = np.array([correctly_rounded(Fraction(float(x)) * Fraction(float(y))
                                       + Fraction(float(z)), dtype)
                     for x, y, z in zip(a[finite], b[finite], c[finite])], dtype)
    np.testing.assert_array_equal(got[finite], want)
    assert np.isinf(got[0]) and np.isnan(got[2])
    np.testing.assert_array_equal(
        np.array([fma(x, y, z) for x, y, z in zip(a, b, c)], dtype), got)
    assert np.count_nonzero(a * b + c != got) > n // 4             # two roundings differ


@pytest.mark.parametrize("scalef", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ldexp_shifted_rounds_once(dtype, scalef):
    """vecmath.ldexp_shifted(y, n + SHIFT) is np.ldexp(y, n), subnormal and inf results
    included, both ways it compiles (vscalef where AVX-512 has it, else two factors from
    exponent bits) and as plain Python."""
    import numba
    from tullio_py import intrinsics
    op = intrinsics.ldexp_shifted(scalef)
    if scalef and jit.vector_bytes() != 64:
        pytest.skip("llvm.ldexp is a libm call per element without AVX-512")

    @numba.njit
    def scale(y, t, out):
        for i in range(y.shape[0]):
            out[i] = op(y[i], t[i])
    info = np.finfo(dtype)
    rng = np.random.default_rng(3)
    lo, hi = info.minexp - info.nmant - 40, info.maxexp + 40       # (exp's n: within)
    n = np.concatenate([np.arange(lo, hi), rng.integers(lo, hi, 2000)])
    y = rng.uniform(0.5, 2.0, n.size).astype(dtype)
    y[:7] = [0.5, 1.0, np.nextafter(dtype(2), dtype(0)), 0.75, 1.5, 1.25, np.nan]
    t = (n + 1.5 * 2.0 ** info.nmant).astype(dtype)
    got = np.empty_like(y)
    scale(y, t, got)
    with np.errstate(over="ignore", under="ignore"):
        want = np.ldexp(y, n)
    np.testing.assert_array_equal(got, want)
    assert np.isinf(got).any() and (got == 0).any() and ((got > 0) & (got < info.tiny)).any()
    py = np.array([vecmath.ldexp_shifted(a, b) for a, b in zip(y[::7], t[::7])], dtype)
    np.testing.assert_array_equal(py, want[::7])
