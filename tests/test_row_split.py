"""A statement whose only index safe for threads is the output's contiguous one (a column sum
`s[j] := A[i,j]`) splits that index in one block per thread of the call (codegen/nest.py's
`open_chunks(per_thread=True)`): each block still sums each element whole, in the same order,
so every thread count gives the same bits, and those of numpy's sequential sum order.  Sums
of elementwise products with no element read twice (`s[j] := A[i,j] * B[i,j]`) run as loops,
not as a batch of BLAS dot products (blas.contraction)."""
import warnings

import numpy as np
import pytest

from tullio_py import blas, kernel
from tullio_py.parse import parse

R = np.random.default_rng(5)

COLUMN_SUMS = {
    "sum": ("s[j] := A[i,j]", lambda a: {"A": a}, lambda a: a.sum(0)),
    "product": ("s[j] := A[i,j] * B[i,j]", lambda a: {"A": a, "B": a[::-1].copy()},
                lambda a: (a * a[::-1]).sum(0)),
    "normalised": ("dg[j] := dy[i,j] * ((x[i,j] - mu[i]) / sqrt(var[i] + eps))",
                   lambda a: {"dy": a, "x": a[::-1].copy(), "mu": a.mean(1),
                              "var": a.var(1) + 0.5, "eps": 1e-5},
                   lambda a: (a * ((a[::-1] - a.mean(1)[:, None])
                                   / np.sqrt(a.var(1)[:, None] + 0.5 + 1e-5))).sum(0)),
}


@pytest.mark.parametrize("name", sorted(COLUMN_SUMS))
@pytest.mark.parametrize("shape", [(301, 77), (64, 1031)])
def test_every_thread_count_gives_the_same_bits(name, shape):
    text, make, ref = COLUMN_SUMS[name]
    a = R.standard_normal(shape)
    arrays = make(a)
    got = {n: kernel(text, threads=n)(**arrays) for n in (1, 2)}
    assert np.array_equal(got[1], got[2])
    np.testing.assert_allclose(got[1], ref(a), rtol=1e-10, atol=1e-10)
    # the same bits as the statement's loops run serially (threads=False: no split at all)
    assert np.array_equal(got[1], kernel(text, threads=False)(**arrays))


def test_the_split_is_one_block_per_thread_and_the_kernel_is_cached_on_disk():
    k = kernel("s[j] := A[i,j]")
    a = R.standard_normal((257, 513)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # numba's "Cannot cache ..." included
        got = k(A=a)
    np.testing.assert_allclose(got, a.sum(0, dtype=np.float64), rtol=1e-5, atol=1e-4)
    code = k.forward_code
    assert "split into blocks across threads" in code and "_nc = min(_nthreads()" in code
    assert "call_threads as _nthreads" in code


def test_summed_elementwise_products_are_not_blas_and_match_einsum():
    for text, spec, shape, extra in [("s[j] := A[i,j] * B[i,j]", "ij,ij->j", (400, 300), {}),
                                     ("s[b] := A[b,i,j] * B[b,i,j] * c", "bij,bij->b",
                                      (40, 50, 60), {"c": 3.0})]:
        assert blas.contraction(parse(text)) is None, text
        a, b = R.standard_normal(shape), R.standard_normal(shape)
        k = kernel(text)
        got = k(A=a, B=b, **extra)
        np.testing.assert_allclose(got, np.einsum(spec, a, b) * extra.get("c", 1.0),
                                   rtol=1e-10, atol=1e-10)
        assert str(k.explain(A=a, B=b, **extra)).startswith("path: loops")
    # a product with reuse (a matrix product) still goes to BLAS
    assert blas.contraction(parse("C[i,k] := A[i,j] * B[j,k]")) is not None
    assert blas.contraction(parse("s := a[i] * b[i]")) is not None       # one dot: BLAS's
