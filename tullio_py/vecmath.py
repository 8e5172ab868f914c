"""exp, log and tanh written out for compiled CPU kernels, so that loops calling it vectorise.

numba's LLVM has no vector math library: `np.exp` in a compiled loop is one scalar libm call
per element and the loop stays scalar.  The functions here are straight-line code (no branch,
no call).  exp: range reduction x = n*ln2 + r with n = round(x/ln2), rounded by adding
1.5 * 2**mantissa bits (so that n also sits in the sum's low bits, for the scaling) and ln2 in a
high and a low part (the high part has few significant bits, so n*hi is exact), a polynomial
approximation of exp(r) on |r| <= ln2/2, and scaling by 2**n through the exponent bits.  The
reduction and the polynomial's Horner steps are fused multiply-adds (`fma`, llvm.fma: one
rounding each, where the order of operations is ours, not the compiler's).  The scaling,
`ldexp_shifted`, rounds a subnormal result once, as numpy does; x is first clamped to a range
whose results are already 0 and inf, which overflow and underflow give without a test; the
clamps let NaN through, and NaN stays NaN.  log and tanh: Cephes' approximations, see each.

Each function is written for one dtype: every constant has that dtype, so the compiled code
computes in it throughout (a float64 constant would widen float32 arithmetic).  They run as
plain Python too (slowly); jit.py compiles them, with `pow2` and `ldexp_shifted` as
exponent-bit arithmetic (or vscalef) and `fma` as llvm.fma (intrinsics.py).
Accuracy against correctly rounded results: tests/test_vecmath.py.
"""
from __future__ import annotations

import numpy as np


def pow2(x):
    """2.0**x in x's float dtype, for an integer-valued x with 2**x a normal float (compiled:
    `(int(x) + bias) << mantissa bits` as the float)."""
    return x.dtype.type(np.ldexp(x.dtype.type(1), int(x)))


def exponent(x):
    """floor(log2(x)) in x's float dtype, for a positive normal x (compiled: the exponent
    bits)."""
    return x.dtype.type(np.frexp(x)[1] - 1)


def mantissa(x):
    """x / 2**exponent(x), in [1, 2), for a positive normal x (compiled: the mantissa bits
    under the exponent of 1)."""
    return x.dtype.type(np.frexp(x)[0] * 2)


def fma(a, b, c):
    """a*b + c rounded once, in a's float dtype (compiled: llvm.fma, one fused multiply-add
    instruction).  Plain Python: the exact value as a fraction, rounded to float64 (for float32
    with round-to-odd, so that the second rounding, to float32, is correct)."""
    t = a.dtype.type
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        with np.errstate(all="ignore"):
            return t(a * b + c)
    from fractions import Fraction
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:
        return t(a * b + c)                     # (the sign of a zero sum)
    with np.errstate(over="ignore"):
        v = np.float64(float(exact)) if abs(exact) < 2 ** 1024 else np.float64(np.inf * exact)
    if (t != np.float64 and np.isfinite(v) and Fraction(float(v)) != exact
            and int(v.view(np.int64)) & 1 == 0):
        v = np.nextafter(v, np.inf if exact > Fraction(float(v)) else -np.inf)
    with np.errstate(over="ignore"):
        return t(v)


def ldexp_shifted(y, t):
    """y * 2.0**n rounded once (to a subnormal, or to inf, as np.ldexp) in y's float dtype, for
    a positive normal y and t = n + SHIFT (SHIFT = 1.5 * 2**mantissa bits, so that n, an
    integer with |n| < 2**11, sits in t's low bits: no conversion of t to an integer); NaN
    where y or t is NaN.  Compiled (intrinsics.py): n from t's bits, then llvm.ldexp, one
    vscalef instruction, with AVX-512; else y * 2**(n//2) * 2**(n - n//2), each factor built
    from exponent bits (the first multiply exact, the second rounding once)."""
    if t != t or y != y:
        return y + t
    shift = t.dtype.type(1.5 * 2.0 ** np.finfo(t.dtype).nmant)
    with np.errstate(over="ignore", under="ignore"):
        return y.dtype.type(np.ldexp(y, int(t - shift)))


_f4, _f8 = np.float32, np.float64

# float32: x = n*ln2 + r with n = round(x/ln2) (t = x*log2(e) + SHIFT rounds it, n = t - SHIFT)
# and ln2 = C1 + C2 (C1 with 9 significant bits: n*C1 exact, and fma makes r = x - n*C1 exact
# too); exp(r) = 1 + r + r**2 P(r), P of degree 4 fitted below, by fused multiply-adds, with
# 1 + r split into its rounded sum and that sum's error, so that only the last addition
# rounds much; then ldexp_shifted scales by 2**n, rounding a subnormal result once.
_LOG2E4, _ZERO4 = _f4(1.44269504088896341), _f4(0.0)
_SHIFT4, _ONE4 = _f4(1.5 * 2 ** 23), _f4(1.0)
_C1_4, _C2_4 = _f4(0.693359375), _f4(-2.12194440e-4)
# P: (exp(r) - 1 - r) / r**2 interpolated at 5 Chebyshev nodes of |r| <= ln2/2 (relative
# error of 1 + r + r**2 P(r) 1.0e-8 with these float32 coefficients).
_P4 = tuple(_f4(c) for c in (
    0.0013926249230280519, 0.008363231085240841, 0.04166655242443085, 0.16666576266288757, 0.5))
# exp(-110) and exp(100) are 0 and inf in float32; n stays within [-159, 145].  The clamps
# are written so that NaN passes them (`LO if LO > x else x` is x for NaN: one max
# instruction on x86); NaN then stays NaN to the end.
_LO4, _HI4 = _f4(-110.0), _f4(100.0)


def exp_f32(x):
    """np.exp of a float32 (within 1 ulp of the correctly rounded value; 0 below about -103.97,
    subnormal results down to there, inf above about 88.72, NaN for NaN)."""
    xc = _LO4 if _LO4 > x else x
    xc = _HI4 if _HI4 < xc else xc
    t = fma(xc, _LOG2E4, _SHIFT4)
    n = t - _SHIFT4
    r = fma(n, -_C1_4, xc)
    r = fma(n, -_C2_4, r)
    z = r * r
    p = fma(fma(fma(fma(_P4[0], r, _P4[1]), r, _P4[2]), r, _P4[3]), r, _P4[4])
    h = _ONE4 + r                               # 1 + r = h + e exactly (|r| < 1)
    e = (_ONE4 - h) + r
    return ldexp_shifted(h + fma(p, z, e), t)


# float64: as float32, with Cephes' ln2 = C1 + C2 (C1 with 15 significant bits) and P of
# degree 9 (relative error of 1 + r + r**2 P(r) 1.6e-17), no division.
_LOG2E8, _HALF8, _ONE8, _TWO8 = _f8(1.4426950408889634073599), _f8(0.5), _f8(1.0), _f8(2.0)
_SHIFT8, _ZERO8 = _f8(1.5 * 2 ** 52), _f8(0.0)
_C1_8, _C2_8 = _f8(6.93145751953125e-1), _f8(1.42860682030941723212e-6)
# P: (exp(r) - 1 - r) / r**2 interpolated at 10 Chebyshev nodes of |r| <= ln2/2.
_P8 = tuple(_f8(c) for c in (
    2.5100470238808523e-08, 2.762019864323475e-07, 2.7557268281679976e-06,
    2.480152106407653e-05, 0.00019841269863168478, 0.0013888888917363079,
    0.008333333333330039, 0.04166666666662383, 0.16666666666666669, 0.5000000000000001))
# exp(-760) and exp(720) are 0 and inf in float64; n stays within [-1097, 1039].
_LO8, _HI8 = _f8(-760.0), _f8(720.0)


def exp_f64(x):
    """np.exp of a float64 (within 1 ulp of the correctly rounded value; 0 below about -745.13,
    subnormal results down to there, inf above about 709.78, NaN for NaN)."""
    xc = _LO8 if _LO8 > x else x
    xc = _HI8 if _HI8 < xc else xc
    t = fma(xc, _LOG2E8, _SHIFT8)
    n = t - _SHIFT8
    r = fma(n, -_C1_8, xc)
    r = fma(n, -_C2_8, r)
    z = r * r
    p = fma(fma(fma(fma(_P8[0], r, _P8[1]), r, _P8[2]), r, _P8[3]), r, _P8[4])
    p = fma(fma(fma(fma(fma(p, r, _P8[5]), r, _P8[6]), r, _P8[7]), r, _P8[8]), r, _P8[9])
    h = _ONE8 + r
    e = (_ONE8 - h) + r
    return ldexp_shifted(h + fma(p, z, e), t)


# log: x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log(x) = log1p(f) + e*ln2 with f = m - 1
# (exact), log1p(f) = f - f**2/2 + f**3 R(f); e*ln2 in the parts of exp's ln2 (C1 * e exact).
# Subnormal x is first scaled into the normal range; x <= 0, inf and NaN are selected.
_SQRT2_4, _NAN4, _INF4 = _f4(1.41421356237309504880), _f4(np.nan), _f4(np.inf)
_HALF4, _TWO4 = _f4(0.5), _f4(2.0)
_TINY4, _SCALE4, _K4 = _f4(np.finfo(np.float32).tiny), _f4(2.0 ** 25), _f4(25.0)
_L0_4, _L1_4, _L2_4 = _f4(7.0376836292e-2), _f4(-1.1514610310e-1), _f4(1.1676998740e-1)
_L3_4, _L4_4, _L5_4 = _f4(-1.2420140846e-1), _f4(1.4249322787e-1), _f4(-1.6668057665e-1)
_L6_4, _L7_4, _L8_4 = _f4(2.0000714765e-1), _f4(-2.4999993993e-1), _f4(3.3333331174e-1)


def log_f32(x):
    """np.log of a float32 (-inf at 0, NaN below 0 and for NaN, inf at inf)."""
    sub = x < _TINY4
    xs = x * _SCALE4 if sub else x
    e = exponent(xs) - (_K4 if sub else _ZERO4)
    m = mantissa(xs)
    big = m > _SQRT2_4
    m = m * _HALF4 if big else m
    e = e + _ONE4 if big else e
    f = m - _ONE4
    z = f * f
    y = ((((((((_L0_4 * f + _L1_4) * f + _L2_4) * f + _L3_4) * f + _L4_4) * f + _L5_4) * f
          + _L6_4) * f + _L7_4) * f + _L8_4) * f * z
    y = y + e * _C2_4
    y = y - _HALF4 * z
    r = f + y + e * _C1_4
    r = r if x > _ZERO4 else (-_INF4 if x == _ZERO4 else _NAN4)
    return r if x < _INF4 else x


# float64: Cephes log, log1p(f) = f - f**2/2 + f**3 P(f) / Q(f), ln2 = C1 - C2.
_SQRT2_8, _NAN8, _INF8 = _f8(1.41421356237309504880), _f8(np.nan), _f8(np.inf)
_TINY8, _SCALE8, _K8 = _f8(np.finfo(np.float64).tiny), _f8(2.0 ** 54), _f8(54.0)
_LC1_8, _LC2_8 = _f8(0.693359375), _f8(2.121944400546905827679e-4)
_LP0_8, _LP1_8, _LP2_8 = (_f8(1.01875663804580931796e-4), _f8(4.97494994976747001425e-1),
                          _f8(4.70579119878881725854e0))
_LP3_8, _LP4_8, _LP5_8 = (_f8(1.44989225341610930846e1), _f8(1.79368678507819816313e1),
                          _f8(7.70838733755885391666e0))
_LQ0_8, _LQ1_8, _LQ2_8 = (_f8(1.12873587189167450590e1), _f8(4.52279145837532221105e1),
                          _f8(8.29875266912776603211e1))
_LQ3_8, _LQ4_8 = _f8(7.11544750618563894466e1), _f8(2.31251620126765340583e1)


def log_f64(x):
    """np.log of a float64 (-inf at 0, NaN below 0 and for NaN, inf at inf)."""
    sub = x < _TINY8
    xs = x * _SCALE8 if sub else x
    e = exponent(xs) - (_K8 if sub else _ZERO8)
    m = mantissa(xs)
    big = m > _SQRT2_8
    m = m * _HALF8 if big else m
    e = e + _ONE8 if big else e
    f = m - _ONE8
    z = f * f
    p = ((((_LP0_8 * f + _LP1_8) * f + _LP2_8) * f + _LP3_8) * f + _LP4_8) * f + _LP5_8
    q = ((((f + _LQ0_8) * f + _LQ1_8) * f + _LQ2_8) * f + _LQ3_8) * f + _LQ4_8
    y = f * (z * p / q)
    y = y - e * _LC2_8
    y = y - _HALF8 * z
    r = f + y + e * _LC1_8
    r = r if x > _ZERO8 else (-_INF8 if x == _ZERO8 else _NAN8)
    return r if x < _INF8 else x


# tanh: x + x**3 R(x**2) for |x| < 0.625 (Cephes), else sign(x) (1 - 2 / (exp(2|x|) + 1)),
# which is 1 once exp overflows; both computed, one selected.  tanh(NaN) is NaN, tanh(-0.0) -0.0.
_SMALL4 = _f4(0.625)
_T0_4, _T1_4, _T2_4 = _f4(-5.70498872745e-3), _f4(2.06390887954e-2), _f4(-5.37397155531e-2)
_T3_4, _T4_4 = _f4(1.33314422036e-1), _f4(-3.33332819422e-1)


def tanh_f32(x):
    """np.tanh of a float32."""
    a = x if x >= _ZERO4 else -x
    z = x * x
    small = x + ((((_T0_4 * z + _T1_4) * z + _T2_4) * z + _T3_4) * z + _T4_4) * z * x
    small = x if z == _ZERO4 else small         # tiny x (and -0.0): x, sign kept
    big = _ONE4 - _TWO4 / (exp_f32(a + a) + _ONE4)
    big = big if x >= _ZERO4 else -big
    return small if a < _SMALL4 else (big if x == x else x)


_SMALL8 = _f8(0.625)
_TP0_8, _TP1_8, _TP2_8 = (_f8(-9.64399179425052238628e-1), _f8(-9.92877231001918586564e1),
                          _f8(-1.61468768441708447952e3))
_TQ0_8, _TQ1_8, _TQ2_8 = (_f8(1.12811678491632931402e2), _f8(2.23548839060100448583e3),
                          _f8(4.84406305325125486048e3))


def tanh_f64(x):
    """np.tanh of a float64."""
    a = x if x >= _ZERO8 else -x
    z = x * x
    small = x + x * (z * ((_TP0_8 * z + _TP1_8) * z + _TP2_8)
                     / (((z + _TQ0_8) * z + _TQ1_8) * z + _TQ2_8))
    small = x if z == _ZERO8 else small
    big = _ONE8 - _TWO8 / (exp_f64(a + a) + _ONE8)
    big = big if x >= _ZERO8 else -big
    return small if a < _SMALL8 else (big if x == x else x)


def maximum(a, b):
    """IEEE 754-2019 maximum of two floats of one dtype: NaN when either is NaN, else the
    larger, +0.0 above -0.0 (compiled: LLVM's llvm.maximum, a reduction the compiler
    vectorises without fast-math flags, since the order of the operands never matters)."""
    if a != a or b != b:
        return a + b
    if a == b:
        return b if np.signbit(a) else a
    return a if a > b else b


def minimum(a, b):
    """IEEE 754-2019 minimum: NaN when either is NaN, else the smaller, -0.0 below +0.0
    (compiled: llvm.minimum)."""
    if a != a or b != b:
        return a + b
    if a == b:
        return a if np.signbit(a) else b
    return a if a < b else b


def maximum_of(a, b):
    """`maximum` as a function jit.py compiles (the intrinsic inside it)."""
    return maximum(a, b)


def minimum_of(a, b):
    """`minimum` as a function jit.py compiles."""
    return minimum(a, b)


# The functions above by name: jit.py compiles each as `vm_<name>`; codegen writes calls of
# `_vm_<name>` into CPU kernels (in plain Python, numpy's ufunc of the name before '_').
FUNCTIONS = {"exp_f32": exp_f32, "exp_f64": exp_f64, "log_f32": log_f32, "log_f64": log_f64,
             "tanh_f32": tanh_f32, "tanh_f64": tanh_f64,
             "maximum_f32": maximum_of, "maximum_f64": maximum_of,
             "minimum_f32": minimum_of, "minimum_f64": minimum_of}
UNARY = ("exp_f32", "exp_f64", "log_f32", "log_f64", "tanh_f32", "tanh_f64")
