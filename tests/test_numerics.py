"""Numerical rules of the generated code, checked against numpy and torch.

NaN: `(max)`/`(min)` reductions and the elementwise `max`/`min`/`relu` propagate NaN as
np.max / np.maximum do, on the compiled target (serial and threaded, through the vectorised
lane loops, the split full reductions, the row form and the scatter form) and the python
target; the gradient of a NaN maximum goes to the first NaN in index order (torch's
`max(dim)`).  Long doubles are a typed error.
"""
import numpy as np
import pytest

from tullio_py import ArgumentError, kernel

torch = pytest.importorskip("torch")

NAN = np.nan


def _with_nans(shape, where, seed=0):
    """Random floats with NaN at the given flat positions (or everywhere: 'all')."""
    x = np.random.default_rng(seed).standard_normal(shape)
    if where == "all":
        x[...] = NAN
    else:
        x.reshape(-1)[list(where)] = NAN
    return x


# ------------------------------------------------------------------ (max)/(min) reductions
# Full reductions of 40 000 elements: split across threads into per-chunk partials, each
# chunk's loop in 8 lanes with a remainder loop (40 000 / 16 chunks = 2500 = 8 * 312 + 4).
N = 40_000
FULL_POSITIONS = {"none": [], "first": [0], "middle": [N // 2 + 3], "last": [N - 1],
                  "chunk-remainder": [2499], "two": [5, N - 2], "all": "all"}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("red", ["max", "min"])
@pytest.mark.parametrize("pos", list(FULL_POSITIONS), ids=list(FULL_POSITIONS))
def test_full_reduction_propagates_nan(threads, red, pos):
    x = _with_nans(N, FULL_POSITIONS[pos])
    got = kernel(f"({red}) m := x[i]", threads=threads)(x=x)
    want = np.max(x) if red == "max" else np.min(x)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got) == (pos != "none")


# Row reductions (lanes over the contiguous j, rows threaded) and column reductions (the row
# form: each i updates a whole row of the output), 300 x 203 (203 = 8 * 25 + 3 leaves a
# remainder after the lanes).  Row r has NaN at: 0 first, 1 middle, 2 last, 3 all, 4 in the
# remainder, 5 in lane 7, others none.
def _matrix(float32=False):
    A = np.random.default_rng(1).standard_normal((300, 203))
    for r, js in enumerate([[0], [101], [202], list(range(203)), [201], [7, 15]]):
        A[r, js] = NAN
    A[150:, 50] = NAN                       # column 50 from the middle on
    A[:, 202] = np.where(np.arange(300) % 2, NAN, A[:, 202])
    return A.astype(np.float32) if float32 else A


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("red", ["max", "min"])
@pytest.mark.parametrize("float32", [False, True], ids=["f64", "f32"])
def test_row_and_column_reductions_propagate_nan(threads, red, float32):
    A = _matrix(float32)
    f = np.max if red == "max" else np.min
    rows = kernel(f"({red}) R[i] := A[i,j]", threads=threads)(A=A)
    cols = kernel(f"({red}) C[j] := A[i,j]", threads=threads)(A=A)
    np.testing.assert_array_equal(rows, f(A, axis=1))
    np.testing.assert_array_equal(cols, f(A, axis=0))
    assert rows.dtype == A.dtype and np.isnan(rows[:6]).all()


def test_lane_loop_and_column_form_are_the_ones_tested():
    """The shapes above reach the code paths they are meant to: lanes with a NaN flag for
    rows, the row form (an update of a whole output row per step) for columns, partials
    for the full reduction."""
    A = _matrix()
    k = kernel("(max) R[i] := A[i,j]", threads=2)
    k(A=A)
    assert "_a7" in k.forward_code and "_nan = _nan | (_x != _x)" in k.forward_code
    k = kernel("(max) C[j] := A[i,j]", threads=2)
    k(A=A)
    assert "C[j] = _v if" in k.forward_code
    k = kernel("(max) m := x[i]", threads=2)
    k(x=np.ones(N))
    assert "_part[_c] = _acc" in k.forward_code and "_a7" in k.forward_code


def test_scatter_and_python_target_propagate_nan():
    J = np.array([0, 2, 2, 1, 0, 2])
    w = np.arange(12.0).reshape(6, 2)
    w[1, 1] = w[4, 0] = NAN
    want = np.full(3, -np.inf)
    for i in range(6):
        want[J[i]] = np.max([want[J[i]], *w[i]])
    for target in ("cpu", "python"):
        got = kernel("(max) H[J[i]] := w[i, k]", target=target)(w=w, J=J)
        np.testing.assert_array_equal(got, want)
    x = np.array([1.0, NAN, 3.0])
    for target in ("cpu", "python"):
        assert np.isnan(kernel("(max) m := x[i]", target=target)(x=x))
        assert np.isnan(kernel("(min) m := x[i]", target=target)(x=x))
        assert np.isnan(kernel("(max) m := x[i]", target=target)(x=np.full(3, NAN)))
        assert kernel("(max) m := x[i]", target=target)(x=np.array([1.0, 3.0])) == 3.0


@pytest.mark.parametrize("target", ["cpu", "python"])
def test_elementwise_max_min_relu_propagate_nan(target):
    a = np.array([1.0, NAN, 3.0, NAN, -2.0, 0.5])
    b = np.array([2.0, 1.0, NAN, NAN, -3.0, 0.5])
    np.testing.assert_array_equal(kernel("y[i] := max(a[i], b[i])", target=target)(a=a, b=b),
                                  np.maximum(a, b))
    np.testing.assert_array_equal(kernel("y[i] := min(a[i], b[i])", target=target)(a=a, b=b),
                                  np.minimum(a, b))
    np.testing.assert_array_equal(kernel("y[i] := relu(a[i])", target=target)(a=a),
                                  torch.relu(torch.from_numpy(a)).numpy())
    # inside a reduction: max over j of max(a, b)
    A, B = _matrix()[:20], _matrix()[20:40][:, ::-1].copy()
    got = kernel("(max) y[i] := max(A[i,j], B[i,j])", target=target)(A=A, B=B)
    np.testing.assert_array_equal(got, np.max(np.maximum(A, B), axis=1))


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("red", ["max", "min"])
def test_gradient_of_nan_extremum_goes_to_first_nan(red):
    """torch's max(dim)/min(dim) sends the gradient to the index it returns: the first NaN
    when there is one, else the first extremal element."""
    A = np.random.default_rng(2).integers(-3, 3, (8, 11)).astype(np.float64)   # ties
    A[1, 4] = A[1, 7] = NAN
    A[2, 0] = NAN
    A[3, 10] = NAN
    A[4, :] = NAN
    k = kernel(f"({red}) M[i] := A[i,j]")
    M = k(A=A)
    dM = np.random.default_rng(3).standard_normal(8)
    got = k.vjp(dM, A=A)["A"]
    tA = torch.from_numpy(A).requires_grad_()
    values, _ = (tA.max if red == "max" else tA.min)(1)
    values.backward(torch.from_numpy(dM))
    np.testing.assert_array_equal(M, values.detach().numpy())
    np.testing.assert_array_equal(got, tA.grad.numpy())


def test_gradient_of_elementwise_max_goes_to_the_nan_argument():
    """max(a, b) passes the gradient to the argument it returned: a NaN argument (the first
    when both are), else the larger (ties: the first).  torch.maximum splits ties and gives
    both arguments the gradient when one is NaN; tullio_py keeps one chosen argument."""
    a = np.array([1.0, NAN, 3.0, NAN, 2.0])
    b = np.array([2.0, 1.0, NAN, NAN, 2.0])
    k = kernel("y[i] := max(a[i], b[i]) * w[i]")
    w = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    g = k.vjp(np.ones(5), a=a, b=b, w=w)
    np.testing.assert_array_equal(g["a"], [0, 2, 0, 4, 5])
    np.testing.assert_array_equal(g["b"], [1, 0, 3, 0, 0])


# ------------------------------------------------------------------ unsupported dtypes
@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_long_double_is_an_argument_error(dtype):
    if np.dtype(dtype).itemsize <= (8 if np.dtype(dtype).kind == "f" else 16):
        pytest.skip("long double is double on this platform")
    with pytest.raises(ArgumentError, match="compiled loops do not support") as e:
        kernel("y[i] := 2 * x[i]")(x=np.ones(3, dtype))
    assert "^" in str(e.value) and "astype" in str(e.value)
    with pytest.raises(ArgumentError, match="scalar"):
        kernel("y[i] := a * x[i]")(x=np.ones(3), a=np.ones((), dtype)[()])
