"""The oracle itself, checked against np.einsum and plain numpy with hand-written ranges."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference import evaluate, output_dtype  # noqa: E402

from tullio_py.parse import parse  # noqa: E402

rng = np.random.default_rng(0)


def R(**kw):
    return {k: range(v) if isinstance(v, int) else v for k, v in kw.items()}


def test_matmul():
    A, B = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    C = evaluate(parse("C[i,k] := A[i,j] * B[j,k]"), dict(A=A, B=B), R(i=3, j=4, k=5))
    np.testing.assert_allclose(C, A @ B, rtol=1e-12)
    assert C.dtype == np.float64 and C.shape == (3, 5)


def test_trace_and_scalar_output():
    A = rng.standard_normal((4, 4))
    t = evaluate(parse("t := A[i,i]"), dict(A=A), R(i=4))
    assert t.shape == () and np.isclose(t, np.trace(A))


def test_outer_and_float32_dtype():
    x = rng.standard_normal(3).astype(np.float32)
    y = rng.standard_normal(4).astype(np.float32)
    P = evaluate(parse("P[i,j] := 2.0 * x[i] * y[j]"), dict(x=x, y=y), R(i=3, j=4))
    assert P.dtype == np.float32
    np.testing.assert_allclose(P, 2 * np.einsum("i,j->ij", x, y), rtol=1e-6)


def test_sums_and_implicit_whole_rhs_reduction():
    A = rng.standard_normal((3, 4))
    B = rng.standard_normal((3, 4))
    a = rng.standard_normal(3)
    s = evaluate(parse("s[i] := A[i,j]"), dict(A=A), R(i=3, j=4))
    np.testing.assert_allclose(s, A.sum(1))
    # Tullio's rule: the whole RHS is summed over j, so a[i] is counted 4 times
    u = evaluate(parse("u[i] := a[i] + B[i,j]"), dict(a=a, B=B), R(i=3, j=4))
    np.testing.assert_allclose(u, 4 * a + B.sum(1))


def test_max_min_prod_reductions_and_int_identity():
    A = rng.integers(-9, 9, (3, 5))
    M = evaluate(parse("(max) M[i] := A[i,j]"), dict(A=A), R(i=3, j=5))
    np.testing.assert_array_equal(M, A.max(1))
    assert M.dtype == A.dtype
    m = evaluate(parse("(min) m[j] := A[i,j]"), dict(A=A), R(i=3, j=5))
    np.testing.assert_array_equal(m, A.min(0))
    p = evaluate(parse("(*) p[i] := A[i,j]"), dict(A=A), R(i=3, j=5))
    np.testing.assert_array_equal(p, A.prod(1))


def test_valid_and_full_convolution():
    x, h = rng.standard_normal(7), rng.standard_normal(3)
    y = evaluate(parse("y[i] := x[i+j] * h[j]"), dict(x=x, h=h), R(i=5, j=3))
    np.testing.assert_allclose(y, np.convolve(x, h[::-1], mode="valid"))
    full = evaluate(parse("y[i+j] := x[i] * h[j]"), dict(x=x, h=h), R(i=7, j=3))
    np.testing.assert_allclose(full, np.convolve(x, h))
    # padded: 'same' correlation with pad(i+j-1)
    same = evaluate(parse("y[i] := x[pad(i+j-1, 1, 1)] * h[j]"), dict(x=x, h=h), R(i=7, j=3))
    np.testing.assert_allclose(same, np.convolve(x, h[::-1], mode="same"))


def test_out_of_bounds_is_an_assertion():
    x = np.arange(4.0)
    with pytest.raises(AssertionError, match="out of bounds"):
        evaluate(parse("y[i] := x[i+1]"), dict(x=x), R(i=4))
    with pytest.raises(AssertionError, match="out of bounds"):
        evaluate(parse("y[i] := x[i, 0]"), dict(x=x[:, None]), R(i=5))


def test_gather_vs_fancy_indexing():
    A = rng.standard_normal((6, 3))
    J = np.array([5, 0, 2, 2])
    G = evaluate(parse("G[k,c] := A[J[k], c]"), dict(A=A, J=J), R(k=4, c=3))
    np.testing.assert_allclose(G, A[J])
    G1 = evaluate(parse("G[k] := A[J[k]-1, 2]"), dict(A=A, J=J + 1), R(k=4))
    np.testing.assert_allclose(G1, A[J, 2])


def test_scatter_histogram():
    J = np.array([1, 3, 3, 0, 3, 1])
    w = rng.standard_normal(6)
    H = np.zeros(5)
    H2 = evaluate(parse("H[J[i]] += w[i]"), dict(H=H, J=J, w=w), R(i=6))
    ref = np.zeros(5)
    np.add.at(ref, J, w)
    np.testing.assert_allclose(H2, ref)
    assert np.all(H == 0)  # the caller's array is not modified
    counts = evaluate(parse("C[J[i]] := 1"), dict(J=J), R(i=6))
    np.testing.assert_array_equal(counts, np.bincount(J))
    assert counts.dtype == np.int64


def test_finaliser_norm():
    A = rng.standard_normal((3, 4))
    n = evaluate(parse("n[i] := A[i,j]**2 |> sqrt"), dict(A=A), R(i=3, j=4))
    np.testing.assert_allclose(n, np.linalg.norm(A, axis=1))
    ni = evaluate(parse("n[i] := B[i,j]**2 |> sqrt"), dict(B=np.arange(12).reshape(3, 4)),
                  R(i=3, j=4))
    assert ni.dtype == np.float64


def test_in_place_snapshot_and_assignment_forms():
    x = np.arange(5.0)
    y = evaluate(parse("x[i] = x[i+1] + x[i]"), dict(x=x), R(i=4))
    np.testing.assert_allclose(y, [1, 3, 5, 7, 4])
    C = np.ones((2, 2))
    A = rng.standard_normal((2, 3))
    B = rng.standard_normal((3, 2))
    np.testing.assert_allclose(evaluate(parse("C[i,k] += A[i,j]*B[j,k]"), dict(A=A, B=B),
                                        R(i=2, j=3, k=2), out=C), 1 + A @ B)
    np.testing.assert_allclose(evaluate(parse("C[i,k] -= A[i,j]*B[j,k]"), dict(A=A, B=B),
                                        R(i=2, j=3, k=2), out=C), 1 - A @ B)
    np.testing.assert_allclose(evaluate(parse("C[i,k] = A[i,j]*B[j,k]"), dict(A=A, B=B),
                                        R(i=2, j=3, k=2), out=C), A @ B)
    np.testing.assert_allclose(evaluate(parse("C[i,k] *= A[i,j]*B[j,k]"), dict(A=A, B=B),
                                        R(i=2, j=3, k=2), out=2 * C),
                               2 * np.prod(A[:, :, None] * B[None], axis=1))
    # '=' only touches the covered elements
    z = np.full(5, 7.0)
    np.testing.assert_allclose(evaluate(parse("z[i] = 2 * w[i]"), dict(w=np.ones(2)), R(i=2),
                                        out=z), [2, 2, 7, 7, 7])


def test_masks_naked_indices_where_and_dtypes():
    A = evaluate(parse("A[i,j] := i + 10*j"), {}, R(i=3, j=4))
    np.testing.assert_array_equal(A, np.add.outer(np.arange(3), 10 * np.arange(4)))
    assert A.dtype == np.int64
    B = rng.standard_normal((4, 4))
    U = evaluate(parse("U[i,j] := B[i,j] * (i <= j)"), dict(B=B), R(i=4, j=4))
    np.testing.assert_allclose(U, np.triu(B))
    W = evaluate(parse("W[i] := where(B[i,0] > 0, B[i,1], -1.0)"), dict(B=B), R(i=4))
    np.testing.assert_allclose(W, np.where(B[:, 0] > 0, B[:, 1], -1.0))
    # a masked-out tuple contributes nothing, not 0*inf = nan
    x = np.array([1.0, np.inf, 2.0])
    s = evaluate(parse("s := x[i] * (i != 1)"), dict(x=x), R(i=3))
    assert s == 3.0
    # params are weak scalars
    x32 = np.ones(3, np.float32)
    assert evaluate(parse("y[i] := a * x[i]"), dict(x=x32, a=2.5), R(i=3)).dtype == np.float32
    assert output_dtype(parse("y[i] := a * x[i]"), dict(x=x32, a=2j)) == np.complex64
    assert output_dtype(parse("y[i] := x[i] / 2"), dict(x=np.ones(3, np.int32))) == np.float64
    assert output_dtype(parse("y := x[i]"), dict(x=np.ones(3, bool))) == np.int64


def test_clamp_mod_pad_value():
    x = np.arange(1.0, 6.0)
    c = evaluate(parse("c[i] := x[clamp(i+j-1)]"), dict(x=x), R(i=5, j=3))
    np.testing.assert_allclose(c, np.convolve(np.pad(x, 1, mode="edge"), np.ones(3), "valid"))
    m = evaluate(parse("m[i] := x[mod(i+2)]"), dict(x=x), R(i=5))
    np.testing.assert_allclose(m, np.roll(x, -2))
    p = evaluate(parse("p[i] := x[pad(i-1, 1, 0)]"), dict(x=x), R(i=6), pad_value=-1.0)
    np.testing.assert_allclose(p, [-1, 1, 2, 3, 4, 5])


def test_index_masks_are_guards_for_every_reducer():
    A = -np.arange(1.0, 10.0).reshape(3, 3)
    M = evaluate(parse("(max) M[i] := A[i,j] * (j <= i)"), dict(A=A), R(i=3, j=3))
    np.testing.assert_allclose(M, [A[i, :i + 1].max() for i in range(3)])
    # a mask of left indices only selects the written elements of '='
    y = evaluate(parse("y[i] = x[i] * (i < 2)"), dict(x=np.ones(4)), R(i=4), out=np.full(4, 7.0))
    np.testing.assert_allclose(y, [1, 1, 7, 7])
    # a mask mixing in reduction indices still writes the element (the empty sum is 0)
    s = evaluate(parse("s[i] = A[i,j] * (j < i)"), dict(A=A), R(i=3, j=3), out=np.full(3, 7.0))
    np.testing.assert_allclose(s, [0, A[1, 0], A[2, 0] + A[2, 1]])
    # parameters may take part in a mask
    t = evaluate(parse("t[i] := A[i,j] * (j < n)"), dict(A=A, n=1), R(i=3, j=3))
    np.testing.assert_allclose(t, A[:, 0])
