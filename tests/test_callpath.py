"""The fast call path (tullio_py/callpath.py): a repeated call replays the first one, and
anything that changes what the call must do (shapes, dtypes, layout, index-array values,
parameters, names) gives the right answer, never a stale one.  Checked against numpy."""
import numpy as np
import pytest

from tullio_py import ArgumentError, RangeError, jit, kernel

rng = np.random.default_rng(7)


def test_repeat_takes_the_fast_path_and_compiles_nothing():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    A, B = rng.random((4, 3)), rng.random((3, 5))
    np.testing.assert_allclose(k(A=A, B=B), A @ B)
    assert len(k._calls.entries) == 1
    before = jit.stats.snapshot()
    for _ in range(3):
        A, B = rng.random((4, 3)), rng.random((3, 5))     # new values, same key
        C = k(A=A, B=B)
        np.testing.assert_allclose(C, A @ B)
    assert C is not k(A=A, B=B)                           # a new output each time
    assert jit.stats.snapshot() == before and len(k._calls.entries) == 1


def test_new_shape_dtype_layout_are_not_replayed():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    for A, B in [(rng.random((4, 3)), rng.random((3, 5))),
                 (rng.random((2, 6)), rng.random((6, 3))),
                 (rng.random((4, 3)).astype(np.float32), rng.random((3, 5)).astype(np.float32)),
                 (np.asfortranarray(rng.random((4, 3))), rng.random((3, 5))),
                 (rng.random((8, 6))[::2, ::2], rng.random((3, 5)))]:
        for _ in range(2):
            C = k(A=A, B=B)
            assert C.shape == (A.shape[0], B.shape[1]) and C.dtype == np.result_type(A, B)
            np.testing.assert_allclose(C, A @ B, rtol=1e-6)


def test_parameters_are_read_on_every_call():
    k = kernel("y[i] := a * x[i] + b", threads=False)
    x = rng.random(5)
    for a, b in [(2.0, 1.0), (3.0, -1.0), (np.float64(0.5), 2.0), (np.array(4.0), 0.0)]:
        np.testing.assert_allclose(k(x=x, a=a, b=b), a * x + b)


def test_in_place_and_snapshot_repeat():
    k = kernel("y[i] += x[i] * 2.0", threads=False)
    x, y = rng.random(6), np.zeros(6)
    for n in range(1, 4):
        assert k(y=y, x=x) is y
        np.testing.assert_allclose(y, 2 * n * x)
    ro = np.zeros(6)
    ro.flags.writeable = False
    with pytest.raises(ArgumentError):
        k(y=ro, x=x)
    rev = kernel("z[i] = z[5 - i] + 1.0", threads=False)   # reads the old values
    for _ in range(2):
        z = np.arange(6.0)
        rev(z=z)
        np.testing.assert_allclose(z, np.arange(6.0)[::-1] + 1)


def test_index_array_values_are_checked_every_call():
    k = kernel("y[i] := A[J[i]]", threads=False)
    A = rng.random(5)
    J = np.array([0, 4, 2])
    np.testing.assert_allclose(k(A=A, J=J), A[J])
    J2 = np.array([1, 1, 3])
    np.testing.assert_allclose(k(A=A, J=J2), A[J2])
    with pytest.raises(RangeError):
        k(A=A, J=np.array([0, 5, 2]))                    # same shapes, out of bounds now


def test_wrong_arguments_still_raise_after_a_fast_call():
    k = kernel("s[i] := A[i,j]", threads=False)
    A = rng.random((3, 4))
    k(A=A)
    k(A=A)
    with pytest.raises(ArgumentError):
        k(B=A)
    with pytest.raises(ArgumentError):
        k(A=A, B=A)
    with pytest.raises(ArgumentError):
        k(A=rng.random(3))
    np.testing.assert_allclose(k(A=[[1.0, 2.0]]), [3.0])   # lists go the full way


def test_threads_option_on_the_fast_path():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=2)
    A, B = rng.random((64, 64)), rng.random((64, 64))
    for _ in range(2):
        np.testing.assert_allclose(k(A=A, B=B), A @ B)


def test_replay_checks_every_fact_of_the_newest_call():
    """The newest remembered call is replayed inline after checks cheaper than its key: a
    dtype equal to it but another object, strides that differ only where the shape does not
    fix them, a layout that differs, and an older key each get the right answer."""
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    meta = np.dtype("f8", metadata={"unit": "m"})          # == float64, another object
    A, B = rng.random((4, 3)), rng.random((3, 5))
    big = rng.random((6, 8))
    for A1, B1 in [(A, B), (A.astype(meta), B), (A, B.astype(meta)),
                   (A[:1], B), (big[2:3, :3], B), (big[:, None, :3][2:6, 0], B),
                   (np.asfortranarray(A), B), (big[::2, :6:2][:4], B),
                   (rng.random((2, 3)), B), (A, B)]:
        for _ in range(3):
            np.testing.assert_allclose(k(A=A1, B=B1), A1 @ B1)


def test_python_int_parameter_typed_by_its_value():
    """numba types a Python int by its value (uint64 past int64): an int outside the range of
    the remembered call's type is not replayed through that compilation."""
    k = kernel("y[i] := x[i] * n", threads=False)
    x = rng.random(4)
    for n in [2**63 + 5, 2**63 + 5, -3, -3, 3, np.array(-2)]:
        for _ in range(2):
            np.testing.assert_allclose(k(x=x, n=n), x * float(n))


def test_clear_cache_empties_the_replayed_call():
    from tullio_py import clear_cache
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    A, B = rng.random((4, 3)), rng.random((3, 5))
    k(A=A, B=B)
    k(A=A, B=B)
    assert len(k._calls.entries) >= 1
    clear_cache()
    assert len(k._calls.entries) == 0
    np.testing.assert_allclose(k(A=A, B=B), A @ B)         # the full path remembers again
    assert len(k._calls.entries) == 1
