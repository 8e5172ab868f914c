"""Gathers are bounds-checked over the index values the loops read, not the whole index array.

`s := b[a[0,i]]` (Tullio.jl issue #35) reads row 0 of `a` only: a bad value in another row is
fine, a bad value in row 0 is a RangeError, on every target and on the fast call path (which
must never replay a call whose index values it did not check).  Results are checked against the
reference interpreter and plain numpy.
"""
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference import evaluate  # noqa: E402

from tullio_py import RangeError, kernel  # noqa: E402
from tullio_py.parse import parse  # noqa: E402

TARGETS = ["python", "cpu"]
B = np.arange(1.0, 5.0)                          # 4 elements
GOOD = np.array([[0, 1, 2], [0, 1, 7]])          # row 1 holds 7: out of bounds, never read
BAD = np.array([[0, 1, 7], [0, 1, 2]])           # row 0 holds 7
NEGATIVE = np.array([[0, -1, 2], [0, 1, 2]])     # -1 would wrap around in numpy and numba


def _k(expr, target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kernel(expr, target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_constant_position_reads_one_row(target):
    k = _k("s := b[a[0,i]]", target)
    for _ in range(2):                           # the second call takes the fast path
        got = k(a=GOOD, b=B)
        assert got == B[GOOD[0]].sum() == evaluate(parse("s := b[a[0,i]]"), dict(a=GOOD, b=B),
                                                   {"i": range(3)})
    for bad in (BAD, NEGATIVE, BAD):             # the same shapes as the remembered call
        with pytest.raises(RangeError, match="where the loops read it"):
            k(a=bad, b=B)
    assert k(a=GOOD[::-1].copy(), b=np.arange(8.0)) == np.arange(8.0)[[0, 1, 7]].sum()


@pytest.mark.parametrize("target", TARGETS)
def test_vector_output_and_gradient(target):
    k = _k("y[i] := b[a[1,i]] * c[i]", target)
    c = np.array([1.0, 10.0, 100.0])
    a = GOOD[::-1].copy()                        # row 1 is read, row 0 holds 7
    np.testing.assert_array_equal(k(a=a, b=B, c=c), B[a[1]] * c)
    want = np.zeros(4)
    np.add.at(want, a[1], c)
    np.testing.assert_array_equal(k.vjp(np.ones(3), a=a, b=B, c=c)["b"], want)
    with pytest.raises(RangeError):
        k(a=GOOD, b=B, c=c)


@pytest.mark.parametrize("target", TARGETS)
def test_narrowed_positions_read_only_their_range(target):
    """i runs over 0:2 (from c), so a[0,i+1] reads a[0,1] and a[0,2] only."""
    k = _k("s := b[a[0,i+1]] * c[i]", target)
    c = np.array([1.0, 10.0])
    unread_bad = np.array([[99, 1, 2], [5, 6, 7]])
    for _ in range(2):
        assert k(a=unread_bad, b=B, c=c) == (B[[1, 2]] * c).sum()
    ok = np.array([[0, 3, 2], [0, 0, 0]])
    for _ in range(2):                           # remembered: the text's whole row fits
        assert k(a=ok, b=B, c=c) == (B[[3, 2]] * c).sum()
    for _ in range(2):
        with pytest.raises(RangeError):
            k(a=np.array([[0, 1, 99], [0, 0, 0]]), b=B, c=c)


@pytest.mark.parametrize("target", TARGETS)
def test_shifted_gather_ranges_from_the_row_read(target):
    """y[k] := b[a[0,i]+k]: k's range comes from the values of row 0 only."""
    k = _k("y[k] := b[a[0,i]+k]", target)
    a = np.array([[0, 1, 2], [0, 3, 3]])
    assert k.ranges(a=a, b=B) == {"i": range(3), "k": range(2)}
    want = np.array([B[a[0] + s].sum() for s in range(2)])
    np.testing.assert_array_equal(k(a=a, b=B), want)
    np.testing.assert_array_equal(
        evaluate(parse("y[k] := b[a[0,i]+k]"), dict(a=a, b=B), {"i": range(3), "k": range(2)}),
        want)
