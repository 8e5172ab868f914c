"""A table of equations run through the public API on every CPU target, checked against the
reference interpreter (tests/reference.py) and, where one exists, a plain numpy formula.

Each entry: expression, a builder of the arrays (from a seeded rng), options for tullio(),
optionally a numpy formula for the expected result and the ranges range inference must find.
"""
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference import evaluate  # noqa: E402

from tullio_py.parse import parse  # noqa: E402

TARGETS = ["cpu", "python"]


class T:
    def __init__(self, expr, build, opts=None, numpy=None, ranges=None, tag=""):
        self.expr, self.build, self.opts = expr, build, dict(opts or {})
        self.numpy, self.ranges = numpy, ranges
        self.id = expr + (f" [{tag}]" if tag else "")


def f64(r, *shape):
    return r.standard_normal(shape)


def f32(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


def c128(r, *shape):
    return r.standard_normal(shape) + 1j * r.standard_normal(shape)


def i64(r, *shape, lo=-5, hi=6):
    return r.integers(lo, hi, shape).astype(np.int64)


def pos(r, *shape):
    return r.uniform(0.5, 2.0, shape)


ein = np.einsum
MATMUL = "C[i,k] := A[i,j] * B[j,k]"
CONV = "y[i] := x[i+j] * h[j]"


def _corr_same(x, h):
    return np.convolve(x, h[::-1], mode="same")


def _prod_rows(A, B):
    return np.prod(A[:, :, None] * B[None], axis=1)


TABLE = [
    # ------------------------------------------------------------ contractions, layouts
    T(MATMUL, lambda r: dict(A=f64(r, 3, 4), B=f64(r, 4, 5)), numpy=lambda a: a["A"] @ a["B"],
      ranges=dict(i=range(3), j=range(4), k=range(5))),
    T(MATMUL, lambda r: dict(A=f32(r, 3, 4), B=f32(r, 4, 2)), numpy=lambda a: a["A"] @ a["B"],
      tag="float32"),
    T(MATMUL, lambda r: dict(A=i64(r, 2, 5), B=i64(r, 5, 3)), numpy=lambda a: a["A"] @ a["B"],
      tag="int64"),
    T(MATMUL, lambda r: dict(A=c128(r, 2, 3), B=c128(r, 3, 4)), numpy=lambda a: a["A"] @ a["B"],
      tag="complex128"),
    T(MATMUL, lambda r: dict(A=f64(r, 4, 3).T, B=f64(r, 8, 5)[::2, 1:]),
      numpy=lambda a: a["A"] @ a["B"], tag="non-contiguous"),
    T("D[i,l] := A[i,j] * B[j,k] * C[k,l]",
      lambda r: dict(A=f64(r, 2, 3), B=f64(r, 3, 4), C=f64(r, 4, 5)),
      numpy=lambda a: ein("ij,jk,kl->il", a["A"], a["B"], a["C"])),
    T("s := x[i] * y[i]", lambda r: dict(x=f64(r, 6), y=f64(r, 6)),
      numpy=lambda a: np.array(a["x"] @ a["y"])),
    T("T[j,i] := A[i,j]", lambda r: dict(A=f64(r, 3, 5)), numpy=lambda a: a["A"].T),
    T("t := A[i,i]", lambda r: dict(A=f64(r, 4, 4)), numpy=lambda a: np.array(np.trace(a["A"]))),
    T("d[i] := A[i,i]", lambda r: dict(A=i64(r, 5, 5)), numpy=lambda a: np.diag(a["A"])),
    T("P[i,j] := x[i] * y[j]", lambda r: dict(x=f64(r, 3), y=f64(r, 4)),
      numpy=lambda a: np.outer(a["x"], a["y"])),
    T("C[i,j] := A[i,j] + b[j]", lambda r: dict(A=f64(r, 3, 4), b=f64(r, 4)),
      numpy=lambda a: a["A"] + a["b"]),
    T("C[i,j,k] := A[i,j] * B[j,k]", lambda r: dict(A=f64(r, 2, 3), B=f64(r, 3, 4)),
      numpy=lambda a: ein("ij,jk->ijk", a["A"], a["B"])),
    T("y[i] := A[i,j,k] * x[k]", lambda r: dict(A=f64(r, 2, 3, 4), x=f64(r, 4)),
      numpy=lambda a: ein("ijk,k->i", a["A"], a["x"])),
    T("C[b,i,k] := A[b,i,j] * B[b,j,k]", lambda r: dict(A=f64(r, 2, 3, 4), B=f64(r, 2, 4, 3)),
      numpy=lambda a: a["A"] @ a["B"]),
    T("u[i] := a[i] + B[i,j]", lambda r: dict(a=f64(r, 3), B=f64(r, 3, 5)),
      numpy=lambda a: 5 * a["a"] + a["B"].sum(1)),
    T("y[i] := x[i, 2]", lambda r: dict(x=f64(r, 4, 3)), numpy=lambda a: a["x"][:, 2]),
    T("C[i,0] := A[i,j]", lambda r: dict(A=f64(r, 3, 4)), numpy=lambda a: a["A"].sum(1)[:, None]),
    T("y[i] := x[3-i]", lambda r: dict(x=f64(r, 4)), numpy=lambda a: a["x"][::-1],
      ranges=dict(i=range(4))),
    # ------------------------------------------------------------ reductions
    T("(max) M[i] := A[i,j]", lambda r: dict(A=f64(r, 3, 5)), numpy=lambda a: a["A"].max(1)),
    T("(max) M[i] := A[i,j]", lambda r: dict(A=i64(r, 3, 5)), numpy=lambda a: a["A"].max(1),
      tag="int64"),
    T("(min) m[j] := A[i,j]", lambda r: dict(A=f32(r, 4, 3)), numpy=lambda a: a["A"].min(0)),
    T("(*) p[i] := A[i,j]", lambda r: dict(A=pos(r, 3, 4)), numpy=lambda a: a["A"].prod(1)),
    T("(+) s[j] := A[i,j]", lambda r: dict(A=i64(r, 4, 3)), numpy=lambda a: a["A"].sum(0)),
    T("(max) M := A[i,j]", lambda r: dict(A=f64(r, 3, 4)), numpy=lambda a: np.array(a["A"].max())),
    T("(min) m[i] = A[i,j] * B[j]", lambda r: dict(m=np.full(3, 99.0), A=f64(r, 3, 4),
                                                   B=f64(r, 4)),
      numpy=lambda a: (a["A"] * a["B"]).min(1)),
    # ------------------------------------------------------------ assignment forms
    T("C[i,k] = A[i,j] * B[j,k]", lambda r: dict(C=np.ones((3, 2)), A=f64(r, 3, 4), B=f64(r, 4, 2)),
      numpy=lambda a: a["A"] @ a["B"]),
    T("C[i,k] += A[i,j] * B[j,k]",
      lambda r: dict(C=f64(r, 3, 2), A=f64(r, 3, 4), B=f64(r, 4, 2)),
      numpy=lambda a: a["C"] + a["A"] @ a["B"]),
    T("C[i,k] += A[i,j] * B[j,k]",
      lambda r: dict(C=i64(r, 3, 2), A=i64(r, 3, 4), B=i64(r, 4, 2)),
      numpy=lambda a: a["C"] + a["A"] @ a["B"], tag="int64"),
    T("C[i,k] -= A[i,j] * B[j,k]",
      lambda r: dict(C=f64(r, 3, 2), A=f64(r, 3, 4), B=f64(r, 4, 2)),
      numpy=lambda a: a["C"] - a["A"] @ a["B"]),
    T("C[i,k] *= A[i,j] * B[j,k]",
      lambda r: dict(C=f64(r, 3, 2), A=f64(r, 3, 4), B=f64(r, 4, 2)),
      numpy=lambda a: a["C"] * _prod_rows(a["A"], a["B"])),
    T("s += x[i]", lambda r: dict(s=np.array(1.5), x=f64(r, 5)),
      numpy=lambda a: np.array(1.5 + a["x"].sum())),
    T("C[i,2] = A[i,j]", lambda r: dict(C=np.zeros((3, 4)), A=f64(r, 3, 5)),
      numpy=lambda a: np.concatenate([np.zeros((3, 2)), a["A"].sum(1)[:, None],
                                      np.zeros((3, 1))], axis=1)),
    # ------------------------------------------------------------ shifts, strides, boundaries
    T(CONV, lambda r: dict(x=f64(r, 7), h=f64(r, 3)),
      numpy=lambda a: np.convolve(a["x"], a["h"][::-1], "valid"),
      ranges=dict(i=range(5), j=range(3))),
    T(CONV, lambda r: dict(x=f64(r, 14)[::2], h=f32(r, 3)),
      numpy=lambda a: np.convolve(a["x"], a["h"][::-1], "valid"), tag="strided float64*float32"),
    T("y[i] := x[i-j+2] * h[j]", lambda r: dict(x=f64(r, 6), h=f64(r, 3)),
      numpy=lambda a: np.convolve(a["x"], a["h"], "valid"),
      ranges=dict(i=range(4), j=range(3))),
    T("y[i] := x[2i+k] * h[k]", lambda r: dict(x=f64(r, 9), h=f64(r, 3)),
      numpy=lambda a: np.convolve(a["x"], a["h"][::-1], "valid")[::2],
      ranges=dict(i=range(4), k=range(3))),
    T("y[i] := x[i+2k] * h[k]", lambda r: dict(x=f64(r, 8), h=f64(r, 3)),
      numpy=lambda a: sum(a["x"][2 * k:2 * k + 4] * a["h"][k] for k in range(3)),
      ranges=dict(i=range(4), k=range(3))),
    T("Y[i,j] := X[i+a, j+b] * K[a,b]", lambda r: dict(X=f64(r, 5, 6), K=f64(r, 2, 3)),
      numpy=lambda a: sum(a["X"][p:p + 4, q:q + 4] * a["K"][p, q] for p in range(2)
                          for q in range(3)),
      ranges=dict(i=range(4), j=range(4), a=range(2), b=range(3))),
    T("y[i] := x[pad(i+k-1, 1, 1)] * h[k]", lambda r: dict(x=f64(r, 6), h=f64(r, 3)),
      numpy=lambda a: _corr_same(a["x"], a["h"]), ranges=dict(i=range(6), k=range(3))),
    T("y[i] := x[pad(i+k-1, 1, 1)] * h[k]", lambda r: dict(x=f64(r, 6), h=f64(r, 3)),
      opts=dict(pad=-1.0), tag="pad=-1",
      numpy=lambda a: np.convolve(np.pad(a["x"], 1, constant_values=-1.0), a["h"][::-1],
                                  "valid")),
    T("y[i] := x[pad(i-2, 2, 0)]", lambda r: dict(x=i64(r, 5)),
      numpy=lambda a: np.concatenate([[0, 0], a["x"]]), ranges=dict(i=range(7))),
    T("y[i] := x[clamp(i+k-1)] * h[k]", lambda r: dict(x=f64(r, 6), h=f64(r, 3)),
      opts=dict(ranges={"i": 6}),
      numpy=lambda a: np.convolve(np.pad(a["x"], 1, mode="edge"), a["h"][::-1], "valid")),
    T("y[i] := x[mod(i+k)] * h[k]", lambda r: dict(x=f64(r, 5), h=f64(r, 3)),
      opts=dict(ranges={"i": range(0, 5)}),
      numpy=lambda a: sum(np.roll(a["x"], -k) * a["h"][k] for k in range(3))),
    T("y[i+j] += x[i] * h[j]", lambda r: dict(y=np.zeros(8), x=f64(r, 6), h=f64(r, 3)),
      numpy=lambda a: np.convolve(a["x"], a["h"])),
    T("y[i+j] += x[i] * h[j]", lambda r: dict(y=np.ones(11), x=f64(r, 6), h=f64(r, 3)),
      numpy=lambda a: np.concatenate([1 + np.convolve(a["x"], a["h"]), np.ones(3)]),
      tag="longer output"),
    T("y[i+j] := x[i] * h[j]", lambda r: dict(x=f64(r, 5), h=f64(r, 4)),
      numpy=lambda a: np.convolve(a["x"], a["h"])),
    T("y[2i] = x[i]", lambda r: dict(y=np.full(8, 7.0), x=f64(r, 4)),
      numpy=lambda a: np.stack([a["x"], np.full(4, 7.0)], 1).ravel()),
    # ------------------------------------------------------------ gathers and scatters
    T("G[k,c] := A[J[k], c]", lambda r: dict(A=f64(r, 6, 3), J=np.array([5, 0, 2, 2, 1])),
      numpy=lambda a: a["A"][a["J"]]),
    T("G[k] := A[J[k]+i] * w[i]", lambda r: dict(A=f64(r, 8), w=f64(r, 3),
                                                  J=np.array([0, 5, 3, 1])),
      numpy=lambda a: np.array([a["A"][j:j + 3] @ a["w"] for j in a["J"]])),
    T("G[k] := A[J[k], J[k]]", lambda r: dict(A=f64(r, 4, 4), J=np.array([3, 1, 1], np.int32)),
      numpy=lambda a: np.diag(a["A"])[a["J"]], tag="int32 index"),
    T("G[k] := A[mod(J[k]+1)]", lambda r: dict(A=f64(r, 4), J=np.array([3, 0, 1])),
      numpy=lambda a: a["A"][(a["J"] + 1) % 4]),
    T("H[J[i]] += w[i]", lambda r: dict(H=np.zeros(5), w=f64(r, 7),
                                        J=np.array([1, 3, 3, 0, 3, 1, 4])),
      numpy=lambda a: np.bincount(a["J"], a["w"], minlength=5)),
    T("H[J[i]] += 1", lambda r: dict(H=np.zeros(6, np.int64), J=np.array([1, 3, 3, 0, 3, 1, 4])),
      numpy=lambda a: np.bincount(a["J"], minlength=6)),
    T("H[J[i], c] += w[i, c]", lambda r: dict(H=np.zeros((3, 2)), w=f64(r, 5, 2),
                                              J=np.array([2, 0, 2, 2, 1])),
      numpy=lambda a: np.stack([np.bincount(a["J"], a["w"][:, c], minlength=3)
                                for c in range(2)], 1)),
    # threaded: scatters and shifted left sides must not race (bigger arrays so threads engage)
    T("H[J[i]] += w[i]", lambda r: dict(H=np.zeros(5), w=f64(r, 3000),
                                        J=r.integers(0, 5, 3000)),
      numpy=lambda a: np.bincount(a["J"], a["w"], minlength=5), opts=dict(threads=True),
      tag="threads"),
    T("y[i+j] += x[i] * h[j]", lambda r: dict(y=np.zeros(402), x=f64(r, 400), h=f64(r, 3)),
      numpy=lambda a: np.convolve(a["x"], a["h"]), opts=dict(threads=4), tag="threads=4"),
    T(MATMUL, lambda r: dict(A=f64(r, 30, 20), B=f64(r, 20, 7)), numpy=lambda a: a["A"] @ a["B"],
      opts=dict(threads=True), tag="threads"),
    # ------------------------------------------------------------ naked indices, masks, where
    T("A[i,j] := i + 10*j", lambda r: dict(), opts=dict(ranges={"i": 3, "j": 4}),
      numpy=lambda a: np.add.outer(np.arange(3), 10 * np.arange(4))),
    T("A[i] := i**2", lambda r: dict(), opts=dict(ranges={"i": range(0, 5)}),
      numpy=lambda a: np.arange(5) ** 2),
    T("y[i] := x[i] * i", lambda r: dict(x=f32(r, 5)), numpy=lambda a: a["x"] * np.arange(5)),
    T("U[i,j] := A[i,j] * (i <= j)", lambda r: dict(A=f64(r, 4, 4)), numpy=lambda a: np.triu(a["A"])),
    T("s[i] := A[i,j] * (j < i)", lambda r: dict(A=f64(r, 4, 4)),
      numpy=lambda a: np.tril(a["A"], -1).sum(1)),
    T("y[i] := x[i] * (1 <= i < 4)", lambda r: dict(x=f64(r, 6)),
      numpy=lambda a: a["x"] * (np.arange(6) >= 1) * (np.arange(6) < 4)),
    T("s := x[i] * (i != 2)", lambda r: dict(x=np.array([1.0, 2.0, np.inf, 4.0])),
      numpy=lambda a: np.array(7.0), tag="masked inf"),
    T("y[i] := where(x[i] > 0, x[i], 0.1 * x[i])", lambda r: dict(x=f64(r, 6)),
      numpy=lambda a: np.where(a["x"] > 0, a["x"], 0.1 * a["x"])),
    # masks of indices are guards (iteration restrictions) for every reducer: the masked-out
    # zeros do not take part in the max; a mask of left indices only selects written elements
    T("(max) M[i] := A[i,j] * (j <= i)", lambda r: dict(A=f64(r, 4, 4) - 3),
      numpy=lambda a: np.array([a["A"][i, :i + 1].max() for i in range(4)])),
    T("y[i] = x[i] * (i < 2)", lambda r: dict(y=np.full(5, 7.0), x=f64(r, 5)),
      numpy=lambda a: np.concatenate([a["x"][:2], [7.0, 7.0, 7.0]])),
    T("s[i] := A[i,j] * (j < n)", lambda r: dict(A=f64(r, 3, 4), n=2),
      numpy=lambda a: a["A"][:, :2].sum(1)),
    # ------------------------------------------------------------ finalisers, functions
    T("n[i] := A[i,j]**2 |> sqrt", lambda r: dict(A=f64(r, 3, 4)),
      numpy=lambda a: np.linalg.norm(a["A"], axis=1)),
    T("n[i] := A[i,j]**2 |> sqrt", lambda r: dict(A=i64(r, 3, 4)),
      numpy=lambda a: np.linalg.norm(a["A"], axis=1), tag="int64 -> float64"),
    T("(max) m[i] := A[i,j] |> exp", lambda r: dict(A=f64(r, 3, 4)),
      numpy=lambda a: np.exp(a["A"].max(1))),
    T("lse[i] := exp(A[i,j]) |> log", lambda r: dict(A=f64(r, 3, 4)),
      numpy=lambda a: np.log(np.exp(a["A"]).sum(1))),
    T("y[i] := sigmoid(x[i]) + relu(x[i]) + tanh(x[i])", lambda r: dict(x=f64(r, 6)),
      numpy=lambda a: 1 / (1 + np.exp(-a["x"])) + np.maximum(a["x"], 0) + np.tanh(a["x"])),
    T("y[i] := exp(x[i]) - log1p(abs(x[i])) + sin(x[i]) * cos(x[i]) + log(x[i]**2)",
      lambda r: dict(x=f32(r, 6)),
      numpy=lambda a: (np.exp(a["x"]) - np.log1p(np.abs(a["x"])) + np.sin(a["x"]) * np.cos(a["x"])
                       + np.log(a["x"] ** 2))),
    T("y[i] := sqrt(abs(x[i])) + arctan(x[i]) + expm1(x[i]) + sinh(x[i]) - cosh(x[i]) + tan(x[i])",
      lambda r: dict(x=f64(r, 6) / 2),
      numpy=lambda a: (np.sqrt(np.abs(a["x"])) + np.arctan(a["x"]) + np.expm1(a["x"])
                       + np.sinh(a["x"]) - np.cosh(a["x"]) + np.tan(a["x"]))),
    T("y[i] := max(x[i], z[i]) - min(x[i], 0.0)", lambda r: dict(x=f64(r, 5), z=f64(r, 5)),
      numpy=lambda a: np.maximum(a["x"], a["z"]) - np.minimum(a["x"], 0.0)),
    T("y[i] := x[i] / 2", lambda r: dict(x=i64(r, 5)),
      numpy=lambda a: a["x"] / 2, tag="int64 -> float64"),
    T("C[i,k] := Z[i,j] * conj(W[j,k])", lambda r: dict(Z=c128(r, 2, 3), W=c128(r, 3, 2)),
      numpy=lambda a: a["Z"] @ a["W"].conj()),
    T("r[i] := real(Z[i,j]) - 2 * imag(Z[i,j]) + abs(Z[i,j])", lambda r: dict(Z=c128(r, 3, 4)),
      numpy=lambda a: (a["Z"].real - 2 * a["Z"].imag + np.abs(a["Z"])).sum(1)),
    T("y[i] := (1+2j) * x[i]", lambda r: dict(x=f32(r, 4)), numpy=lambda a: (1 + 2j) * a["x"]),
    # ------------------------------------------------------------ params
    T("y[i] := alpha * x[i] + beta", lambda r: dict(x=f64(r, 5), alpha=2.5, beta=-1.0),
      numpy=lambda a: 2.5 * a["x"] - 1.0),
    T("y[i] := alpha * x[i] + beta", lambda r: dict(x=f32(r, 5), alpha=3, beta=0.5),
      numpy=lambda a: 3 * a["x"] + 0.5, tag="float32, int param"),
    T("y[i] := alpha * x[i] + beta", lambda r: dict(x=i64(r, 5), alpha=np.int64(2), beta=np.array(7)),
      numpy=lambda a: 2 * a["x"] + 7, tag="int64, numpy params"),
    # ------------------------------------------------------------ in-place reads (snapshot)
    T("x[i] = x[i+1] + x[i]", lambda r: dict(x=f64(r, 6)),
      numpy=lambda a: np.concatenate([a["x"][1:] + a["x"][:-1], a["x"][-1:]])),
    T("C[i,j] = C[j,i] + 1.0", lambda r: dict(C=f64(r, 4, 4)), numpy=lambda a: a["C"].T + 1.0),
    T("x[i] += x[3-i]", lambda r: dict(x=i64(r, 4)), numpy=lambda a: a["x"] + a["x"][::-1]),
    T("C[i,k] = C[i,j] * A[j,k]", lambda r: dict(C=f64(r, 3, 3), A=f64(r, 3, 3)),
      numpy=lambda a: a["C"] @ a["A"]),
]

IDS = [t.id for t in TABLE]
_CACHE = {}


def _expected(n):
    """(arrays, expected, ranges) for entry n, computed once."""
    if n in _CACHE:
        return _CACHE[n]
    import tullio_py
    t = TABLE[n]
    arrays = t.build(np.random.default_rng(n))
    eq = parse(t.expr, extra_indices=tuple(t.opts.get("ranges", {})))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranges = tullio_py.kernel(t.expr, **t.opts).ranges(**arrays)
    ranges = {k: (range(v) if isinstance(v, int) else v) for k, v in ranges.items()}
    out = None
    if eq.assign != ":=":
        out = np.array(arrays[eq.output], copy=True)
    expected = evaluate(eq, arrays, ranges, out=out, pad_value=t.opts.get("pad", 0))
    _CACHE[n] = (arrays, expected, ranges, eq)
    return _CACHE[n]


def _differentiable(n):
    """(entry, arrays, expected, equation) of an entry whose vjp the other targets are checked
    against (a new float result, without ranges=), or None."""
    t = TABLE[n]
    arrays, expected, ranges, eq = _expected(n)
    if eq.assign != ":=" or t.opts.get("ranges") or expected.dtype.kind != "f":
        return None
    return t, arrays, expected, eq


def _assert_same(got, want, dtype_exact=True):
    if dtype_exact:
        assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        single = want.dtype in (np.float32, np.complex64)
        rtol = 1e-5 if single else 1e-10
        atol = 1e-5 if single else 1e-12
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_table_size():
    assert len(TABLE) >= 60
    assert len({t.expr for t in TABLE}) >= 55


@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_reference_agrees_with_numpy(n):
    """The oracle (with the library's ranges) against a closed numpy formula; also pins the
    ranges where the table gives them, so wrong range inference cannot hide in the oracle."""
    t = TABLE[n]
    arrays, expected, ranges, eq = _expected(n)
    if t.ranges is not None:
        assert {k: ranges[k] for k in t.ranges} == t.ranges
        assert set(ranges) >= set(eq.indices)
    if t.numpy is not None:
        want = np.asarray(t.numpy(arrays))
        assert expected.shape == want.shape
        tol = 1e-5 if expected.dtype in (np.float32, np.complex64) else 1e-10
        np.testing.assert_allclose(expected, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_table(n, target):
    from tullio_py import tullio
    t = TABLE[n]
    arrays, expected, ranges, eq = _expected(n)
    inputs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = tullio(t.expr, target=target, **inputs, **t.opts)
    if eq.assign != ":=":
        assert got is inputs[eq.output], "an in-place form returns the updated array"
        want_dtype = arrays[eq.output].dtype
        assert expected.dtype == want_dtype
    got = np.asarray(got)
    _assert_same(got, expected)
    if t.numpy is not None:
        want = np.asarray(t.numpy(arrays))
        _assert_same(got, want.astype(got.dtype, copy=False) if want.dtype != got.dtype else want,
                     dtype_exact=False)
    # inputs other than the output are never modified
    for k, v in arrays.items():
        if k != eq.output and isinstance(v, np.ndarray):
            np.testing.assert_array_equal(inputs[k], v)


def test_summation_warning_names_the_term():
    from tullio_py import SummationWarning, tullio
    with pytest.warns(SummationWarning, match=r"a\[i\]|\ba\b"):
        tullio("u[i] := a[i] + B[i,j]", a=np.ones(3), B=np.ones((3, 4)), target="python")


@pytest.mark.parametrize("target", ["cpu", "python"])
def test_empty_ranges_keep_the_other_extents(target):
    """An empty range empties only the positions it indexes: a sum over nothing is the
    reduction's identity, as in np.einsum."""
    from tullio_py import tullio
    A = np.ones((3, 0))
    assert tullio("y[i,j] := A[i,j]", A=A, target=target).shape == (3, 0)
    np.testing.assert_array_equal(tullio("y[i] := A[i,j]", A=A, target=target),
                                  np.einsum("ij->i", A))
    np.testing.assert_array_equal(tullio("(max) y[i] := A[i,j]", A=A, target=target),
                                  np.full(3, -np.inf))
    C = tullio("C[i,k] := A[i,j] * B[j,k]", A=np.ones((2, 0)), B=np.ones((0, 4)), target=target)
    np.testing.assert_array_equal(C, np.zeros((2, 4)))
    assert tullio("y[i,b] := x[i+k,b] * w[k]", x=np.ones((5, 0)), w=np.ones(2),
                  target=target).shape == (4, 0)
