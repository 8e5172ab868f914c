"""An in-place output that is the memory of an input passed under another name (the same array,
a view, a transpose, an overlapping slice, an index array): the statement reads every input as
it was before it, exactly as numpy computes on copies.  Inputs that share a buffer with the
output but no element (disjoint slices) give the right answer too."""
import warnings

import numpy as np
import pytest

from tullio_py import Tape, kernel, tullio
from tullio_py import overlap

N = 4
# (statement, numpy on copies: (A, B, C) -> new A); kernels are shared by every alias case
FORMS = {
    "=": ("A[i,k] = B[i,j] * C[j,k]", lambda A, B, C: B @ C),
    "+=": ("A[i,k] += B[i,j] * C[j,k]", lambda A, B, C: A + B @ C),
    "-=": ("A[i,k] -= B[i,j] * C[j,k]", lambda A, B, C: A - B @ C),
    "*=": ("A[i,k] *= B[i,j] * C[j,k]",
           lambda A, B, C: A * np.prod(B[:, :, None] * C[None, :, :], axis=1)),
    "(max) =": ("(max) A[i,k] = B[i,j] * C[j,k]",
                lambda A, B, C: np.max(B[:, :, None] * C[None, :, :], axis=1)),
}


def _values(shape, seed):
    # in (0.5, 1.5): products over j stay moderate, and a wrong read changes the result
    return 0.5 + np.random.default_rng(seed).random(shape)


def _cases(xp_copy, T):
    """name -> (A, B, C) with A aliasing B and/or C; T transposes, xp_copy copies."""
    def fresh(shape, seed):
        return xp_copy(_values(shape, seed))
    cases = {}
    Y = fresh((N, N), 1)
    cases["same array"] = (Y, Y, Y)
    Y = fresh((N, N), 2)
    cases["view"] = (Y, Y[:], fresh((N, N), 3))
    Y = fresh((N, N), 4)
    cases["transpose"] = (Y, T(Y), T(Y))
    Z = fresh((N + 1, N), 5)
    cases["overlapping slice"] = (Z[:N], Z[1:], fresh((N, N), 6))
    Z = fresh((N, 2 * N), 7)
    cases["overlapping columns"] = (Z[:, :N], fresh((N, N), 8), Z[:, 1:N + 1])
    Z = fresh((2 * N, N), 9)
    cases["disjoint slice"] = (Z[:N], Z[N:], Z[N:])
    Z = fresh((N, 2 * N), 10)
    cases["disjoint interleaved"] = (Z[:, ::2], Z[:, 1::2], fresh((N, N), 11))
    return cases


def _numpy_cases():
    return _cases(lambda a: np.array(a), lambda a: a.T)


def _check(form, A, B, C, to_numpy):
    expr, ref = FORMS[form]
    want = ref(*(np.array(to_numpy(x), copy=True) for x in (A, B, C)))
    got = tullio(expr, A=A, B=B, C=C)
    assert got is A
    np.testing.assert_allclose(to_numpy(A), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("form", list(FORMS))
def test_numpy_output_aliasing_an_input_reads_values_from_before(form):
    for name, (A, B, C) in _numpy_cases().items():
        # a call with separate arrays of the same dtypes, shapes and strides first: the
        # replayed call path must not run the aliased call as it ran that one
        tullio(FORMS[form][0], A=np.array(A, copy=True), B=np.array(B, copy=True),
               C=np.array(C, copy=True))
        try:
            _check(form, A, B, C, np.asarray)
        except AssertionError as e:
            raise AssertionError(f"{form} with {name}: {e}") from None


@pytest.mark.parametrize("form", list(FORMS))
def test_torch_output_aliasing_an_input_reads_values_from_before(form):
    torch = pytest.importorskip("torch")
    cases = _cases(lambda a: torch.from_numpy(np.array(a)), lambda t: t.T)
    with torch.no_grad():
        for name, (A, B, C) in cases.items():
            try:
                _check(form, A, B, C, lambda t: t.numpy())
            except AssertionError as e:
                raise AssertionError(f"{form} with {name}: {e}") from None


def test_copies_only_inputs_that_share_an_element_with_the_output():
    eq = kernel(FORMS["="][0]).equation
    Z = _values((2 * N, 2 * N), 12)
    W = _values((N, N), 13)
    disjoint = [dict(A=Z[:N, :N], B=Z[N:, :N], C=Z[:N, N:]),
                dict(A=Z[:, ::2][:N], B=Z[:, 1::2][:N], C=W)]
    for arrays in disjoint:
        assert overlap.snapshot_aliases(eq, arrays) is arrays
    arrays = dict(A=Z[:N, :N], B=Z[1:N + 1, :N], C=W)
    snap = overlap.snapshot_aliases(eq, arrays)
    assert snap["C"] is W and snap["A"] is arrays["A"]
    assert not np.shares_memory(snap["B"], Z) and np.array_equal(snap["B"], arrays["B"])
    T = Z[:N, :N].T
    assert overlap.snapshot_aliases(eq, dict(A=Z[:N, :N], B=T, C=W))["B"].flags.f_contiguous


def test_output_aliasing_a_gather_index_array():
    x = np.arange(10, 20)
    J = np.array([3, 1, 4, 1, 5, 9])
    want = np.full(J.shape, x[J].sum())
    H = np.array(J, copy=True)
    tullio("H[i] = x[J[j]]", H=H, J=H, x=x)
    np.testing.assert_array_equal(H, want)
    H = np.array(J, copy=True)      # the replayed call path, after a call without aliasing
    tullio("H[i] = x[J[j]]", H=np.zeros_like(J), J=np.array(J, copy=True), x=x)
    tullio("H[i] = x[J[j]]", H=H, J=H, x=x)
    np.testing.assert_array_equal(H, want)


# ----------------------------------------------------------------------------- the Tape
def _taped(stmts, arrays, out, cot):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Tape() as tape:
            for s in stmts:
                tullio(s, **arrays)
    tape.backward(out, cot)
    return tape


@pytest.mark.parametrize("form", ["=", "+="])
def test_tape_same_array_under_three_names(form):
    Y = _values((N, N), 14)
    Y0 = Y.copy()
    G = np.random.default_rng(15).standard_normal((N, N))
    tape = _taped([FORMS[form][0]], dict(A=Y, B=Y, C=Y), Y, G)
    np.testing.assert_allclose(Y, FORMS[form][1](Y0, Y0, Y0), rtol=1e-12)
    # new = Y@Y (+ Y): the old Y's adjoint is G@Y.T + Y.T@G (+ G)
    want = G @ Y0.T + Y0.T @ G + (G if form == "+=" else 0)
    np.testing.assert_allclose(tape.grad(Y), want, rtol=1e-12)


def test_tape_keeps_the_value_a_view_had_before_its_memory_is_overwritten():
    Y, W, X = _values((N, N), 16), _values((N, N), 17), _values((N, N), 18)
    Yt, Y0 = Y.T, Y.copy()
    G = np.random.default_rng(19).standard_normal((N, N))
    S = np.zeros((N, N))
    with Tape() as tape:
        tullio("S[i,k] = Yt[i,j] * W[j,k]", S=S, Yt=Yt, W=W)
        tullio("Y[i,k] = 2 * X[i,k] + Yt[i,k]", Y=Y, X=X, Yt=Yt)     # reads and overwrites Yt
    np.testing.assert_allclose(Y, 2 * X + Y0.T, rtol=1e-12)
    tape.backward([S, Y], [G, G])
    np.testing.assert_allclose(tape.grad(W), Y0 @ G, rtol=1e-12)      # Yt's value before
    np.testing.assert_allclose(tape.grad(Yt), G @ W.T + G, rtol=1e-12)
    np.testing.assert_allclose(tape.grad(X), 2 * G, rtol=1e-12)


class _Device:
    """An array exposing its memory as `__cuda_array_interface__` (host memory standing in for
    the GPU: the span arithmetic is the same)."""

    def __init__(self, a):
        self.__cuda_array_interface__ = dict(a.__array_interface__, version=3)


def test_device_byte_ranges_agree_with_numpy_bounds():
    Z = np.zeros((6, 8))
    views = [Z, Z[:3], Z[3:], Z[2:4], Z.T, Z[:, ::2], Z[:, 1::2], Z[::-1], Z[5:, ::-1], Z[0:0],
             Z[:, 7:], Z[0, :]]
    for a in views:
        for b in views:
            want = np.may_share_memory(a, b) and a.size > 0 and b.size > 0
            assert overlap.device_overlaps(_Device(a), _Device(b)) == want, (a.shape, b.shape)


OWN = {"=": lambda y, x: y * x.sum(1), "+=": lambda y, x: y + y * x.sum(1),
       "*=": lambda y, x: y * np.prod(y[:, None] * x, axis=1)}


@pytest.mark.parametrize("op", list(OWN))
def test_reduction_reading_its_own_output_element(op):
    """`y[i] += y[i] * x[i,j]`: the read of y[i] is loaded once per i (a hoisted read), the
    write still goes to y's memory, not to that local."""
    y, x = _values(3, 1), _values((3, 4), 2)
    want = OWN[op](y.copy(), x)
    kernel(f"y[i] {op} y[i] * x[i,j]")(y=y, x=x)
    np.testing.assert_allclose(y, want, rtol=1e-13)
