"""tullio()'s repeated calls (kernel.py's per-text memo) and the fast call path's replay
(callpath.py): a call whose arrays differ from the remembered one in dtype, strides, layout,
read-only flag, alignment or aliasing gets its own answer, never a stale entry's.  Checked
against numpy."""
import importlib

import numpy as np
import pytest

from tullio_py import ArgumentError, Tape, kernel, tullio

kernel_module = importlib.import_module("tullio_py.kernel")

rng = np.random.default_rng(11)
MATMUL = "C[i,k] := A[i,j] * B[j,k]"


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _unaligned(a):
    """A copy of `a` whose data starts one byte past an element boundary (numba: aligned=False)."""
    buf = np.empty(a.nbytes + 1, np.uint8)
    u = np.frombuffer(buf[1:].data, a.dtype).reshape(a.shape)
    u[...] = a
    assert not u.flags.aligned
    return u


def _variants():
    A, B = rng.random((4, 3)), rng.random((3, 5))
    return [(A, B),
            (A.astype(np.float32), B.astype(np.float32)),
            (A.astype(np.float32), B),                       # mixed dtypes
            (np.asfortranarray(A), B),
            (rng.random((8, 6))[::2, ::2], B),
            (_readonly(A), _readonly(B)),
            (_unaligned(A), B),
            (A, B),                                          # back to the first key
            (rng.random((2, 7)), rng.random((7, 2)))]


@pytest.mark.parametrize("via", ["kernel", "tullio"])
def test_each_variant_of_the_arrays_gets_its_own_answer(via):
    k = kernel(MATMUL)
    for A, B in _variants():
        for _ in range(3):              # the first call remembers, the next ones replay
            C = k(A=A, B=B) if via == "kernel" else tullio(MATMUL, A=A, B=B)
            assert C.shape == (A.shape[0], B.shape[1]) and C.dtype == np.result_type(A, B)
            np.testing.assert_allclose(C, A @ B, rtol=1e-6)
    assert kernel_module._BY_TEXT.get(MATMUL) is not None or via == "kernel"


def test_in_place_aliasing_is_checked_on_every_replay():
    text = "y[i] = x[i] + x[5 - i]"
    for _ in range(3):
        x, y = rng.random(6), np.zeros(6)
        np.testing.assert_allclose(tullio(text, y=y, x=x), x + x[::-1])
    for _ in range(2):                   # y is x: the old values are read, not the new ones
        x = rng.random(6)
        want = x + x[::-1]
        assert tullio(text, y=x, x=x) is x
        np.testing.assert_allclose(x, want)
    ro = _readonly(np.zeros(6))
    with pytest.raises(ArgumentError, match="output 'y' is read-only"):
        tullio(text, y=ro, x=rng.random(6))


def test_options_scope_and_missing_names_after_a_remembered_text():
    A, B = rng.random((3, 4)), rng.random((4, 2))
    for _ in range(2):
        np.testing.assert_allclose(tullio(MATMUL, A=A, B=B), A @ B)
    np.testing.assert_allclose(tullio(MATMUL, A=A, B=B, blas=False), A @ B)
    B2 = rng.random((4, 5))
    np.testing.assert_allclose(tullio(MATMUL, A=A, B=B2), A @ B2)
    B = B2                              # read from this scope: not the remembered B
    np.testing.assert_allclose(tullio(MATMUL, A=A), A @ B2)
    with pytest.raises(ArgumentError, match="not used by the expression: D"):
        tullio(MATMUL, A=A, B=B, D=B)   # a name the statement does not read


def test_a_remembered_text_is_recorded_by_an_active_tape():
    A, B = rng.random((3, 4)), rng.random((4, 2))
    tullio(MATMUL, A=A, B=B)
    tullio(MATMUL, A=A, B=B)
    with Tape() as tape:
        C = tullio(MATMUL, A=A, B=B)
    np.testing.assert_allclose(C, A @ B)
    assert len(tape.records) == 1 and tape.records[0].text == MATMUL
