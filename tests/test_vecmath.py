"""vecmath.py's exp against correctly rounded references, over the whole float range, compiled
(as kernels call it) and as plain Python; and that kernels call it where they should."""
import numpy as np
import pytest

from tullio_py import jit, kernel, vecmath

# dtype: (sweep range, reference dtype).  longdouble has 64 significand bits on x86-64
# Linux; where it is just float64 the float64 sweep checks against numpy's own exp.
CASES = {np.float32: ((-110.0, 90.0), np.float64), np.float64: ((-750.0, 712.0), np.longdouble)}
# Largest error in ulps allowed (measured on 1e6 sweep values: 0.96 for float32, 1.54 for
# float64, where Cephes' rational approximation rounds twice more than numpy's exp).
BOUND = {np.float32: 1.0, np.float64: 1.6}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-30, -1e-30]


def sweep(dtype, n=1_000_000, seed=0):
    """n values spanning the range where exp goes from 0 to inf (uniform, plus values near
    the overflow and underflow thresholds, tiny ones and the special values)."""
    (lo, hi), _ = CASES[dtype]
    info = np.finfo(dtype)
    rng = np.random.default_rng(seed)
    over, under = np.log(info.max), np.log(info.smallest_subnormal)
    near = np.concatenate([rng.uniform(t - 1, t + 1, n // 20) for t in (over, under,
                                                                          np.log(info.tiny))])
    tiny = rng.standard_normal(n // 20) * 10.0 ** rng.uniform(-40, 0, n // 20)
    rest = rng.uniform(lo, hi, n - near.size - tiny.size)
    return np.concatenate([rest, near, tiny, SPECIAL]).astype(dtype)


def ulp_error(got, x, dtype):
    """|got - exp(x)| in units of the last place of exp(x) rounded to `dtype` (its spacing at
    the correctly rounded value: subnormal spacing below the normal range); 0 where both are
    the same inf or NaN."""
    _, ref_type = CASES[dtype]
    with np.errstate(over="ignore", under="ignore"):
        exact = np.exp(x.astype(ref_type))
        rounded = exact.astype(dtype)
        finite = np.isfinite(rounded)
        ulp = np.spacing(np.abs(rounded[finite])).astype(ref_type)
        err = np.zeros(x.shape)
        err[finite] = np.abs(got[finite].astype(ref_type) - exact[finite]) / ulp
    same = (got[~finite] == rounded[~finite]) | (np.isnan(got[~finite]) & np.isnan(rounded[~finite]))
    err[~finite] = np.where(same, 0.0, np.inf)
    return err


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
def test_exp_is_within_bound_ulps_over_the_float_range(loop, dtype):
    x = sweep(dtype)
    got = loop(f"exp_{'f32' if dtype == np.float32 else 'f64'}", x)
    assert got.dtype == dtype
    err = ulp_error(got, x, dtype)
    worst = int(np.argmax(err))
    assert err.max() <= BOUND[dtype], (x[worst], got[worst], err.max())
    with np.errstate(over="ignore", under="ignore"):
        mine = np.exp(x)                        # numpy's own (float32: up to ~2.4 ulp)
    assert ulp_error(mine, x, dtype).max() <= 3.0   # the reference agrees with numpy
    assert np.array_equal(np.isinf(got), np.isinf(mine))
    assert np.array_equal(got == 0, mine == 0)
    assert np.array_equal(np.isnan(got), np.isnan(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_runs_as_plain_python(dtype):
    """The same functions uncompiled (pow2 through np.ldexp) give the same values."""
    x = np.array(SPECIAL + [-104.0, -87.5, 88.5, -745.0, 709.0, 3.7], dtype)
    f = vecmath.FUNCTIONS[f"exp_{'f32' if dtype == np.float32 else 'f64'}"]
    with np.errstate(over="ignore", under="ignore"):
        got = np.array([f(v) for v in x])
    assert got.dtype == dtype
    assert ulp_error(got, x, dtype).max() <= BOUND[dtype]


EXP = kernel("e[i,j] := exp(x[i,j] - m[i])")
SIGMOID = kernel("s[i] := sigmoid(x[i])")


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
