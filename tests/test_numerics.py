"""Numerical rules of the generated code, checked against numpy and torch.

NaN: `(max)`/`(min)` reductions and the elementwise `max`/`min`/`relu` propagate NaN as
np.max / np.maximum do, on the compiled target (serial and threaded, through the vectorised
row loops, the split full reductions, the row form and the scatter form) and the python
target; the gradient of a NaN maximum goes to the first NaN in index order (torch's
`max(dim)`).  Long doubles are a typed error.

dtypes: every element is computed as numpy computes it from arrays of the input dtypes
(`int8 * int8` wraps in int8, `uint64 * int64` is float64), then reduced in the result dtype;
the compiled and python targets agree with numpy.  The table covers 13 dtypes: all 169 pairs
on target="python" (no compile), and on the compiled target a fixed covering subset
(COMPILED_PAIRS: every dtype on each side, and every kind of promotion), since numba compiles
each dtype signature separately (about a second each).
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
# chunk's loop one vectorised chain (40 000 / 16 chunks = 2500 = 8 * 312 + 4).
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
    """The shapes above reach the code paths they are meant to: one vectorised chain of IEEE
    maximum for rows, the row form (an update of a whole output row per step) for columns,
    partials for the full reduction."""
    A = _matrix()
    k = kernel("(max) R[i] := A[i,j]", threads=2)
    k(A=A)
    assert "_m = _vm_maximum_f64(_m, A_[i_, j_])" in k.forward_code
    k = kernel("(max) C[j] := A[i,j]", threads=2)
    k(A=A)
    assert "C_[j_] = _v if" in k.forward_code     # user names carry a trailing _ in code
    k = kernel("(max) m := x[i]", threads=2)
    k(x=np.ones(N))
    assert "_part[_c] = _acc" in k.forward_code and "_vm_maximum_f64(" in k.forward_code


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


# ------------------------------------------------------------------ dtype table
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128"]


def _values(name):
    """Four values of dtype `name` that expose computing in the wrong type: the largest
    integer (products wrap, or exceed int64), 2**24 + 1 (not a float32), negatives."""
    dt = np.dtype(name)
    if dt.kind == "b":
        return np.array([True, True, False, True])
    if dt.kind in "iu":
        big = np.iinfo(dt).max
        odd = 2**24 + 1 if big > 2**24 else 5
        return np.array([big, 3, -2 if dt.kind == "i" else 1, odd], dt)
    if dt.kind == "f":
        return np.array([1e20, 1.5, -2.5, 16777217.0], dt)
    return np.array([1e20 + 1j, 1.5 - 2j, -2.5, 16777217.0 + 3j], dt)


def _numpy(red, x, y):
    """The numpy value: the product as numpy arrays, then reduced in the result dtype."""
    with np.errstate(all="ignore"):
        p = x * y
    rdt = np.dtype(np.int64) if p.dtype == np.bool_ else p.dtype
    p = p.astype(rdt)
    with np.errstate(all="ignore"):
        return (np.add.reduce(p, dtype=rdt) if red == "+" else np.max(p)), rdt


def _check_pair(a, b, target, red):
    x, y = _values(a), _values(b)[::-1].copy()
    expr = "s := x[i] * y[i]" if red == "+" else "(max) s := x[i] * y[i]"
    want, rdt = _numpy(red, x, y)
    with np.errstate(all="ignore"):
        got = kernel(expr, target=target, blas=False)(x=x, y=y)
    assert got.dtype == rdt, (a, b)
    if rdt.kind in "biu":
        assert got == want, (a, b, got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6 if rdt.itemsize <= 8 else 1e-13,
                                   err_msg=f"{a} x {b}")


@pytest.mark.parametrize("a", DTYPES)
def test_dtype_table_python_target(a):
    for b in DTYPES:
        _check_pair(a, b, "python", "+")
        if "complex" not in a + b:
            _check_pair(a, b, "python", "max")


# every dtype on each side; same-type wrap (int8, uint16), mixed signedness of one width
# (int32 x uint32, uint8 x int8), uint64 x int64 (float64), uint64 x bool, ints x floats
# (float64 where float32 would round 2**24 + 1), bool x bool (logical, then counted), complex.
COMPILED_PAIRS = [("int8", "int8"), ("uint64", "int64"), ("uint64", "bool"), ("bool", "bool"),
                  ("int32", "uint32"), ("uint8", "int8"), ("uint16", "uint16"),
                  ("float32", "int64"), ("int16", "float32"), ("float64", "uint32"),
                  ("complex64", "float64"), ("complex128", "int8")]


@pytest.mark.parametrize("a,b", COMPILED_PAIRS, ids=[f"{a}-{b}" for a, b in COMPILED_PAIRS])
def test_dtype_table_compiled(a, b):
    _check_pair(a, b, "cpu", "+")
    if "complex" not in a + b:
        _check_pair(a, b, "cpu", "max")


def test_reported_cases():
    """uint64 x int64 is float64 (not int64 wrapped to 3.0); (max) of int8 products wraps
    each product in int8 as numpy does (6, not the -56 of an unwrapped 200)."""
    x, y = np.array([2**62, 3], np.uint64), np.array([4, 1], np.int64)
    for target in ("cpu", "python"):
        assert kernel("s := x[i] * y[i]", target=target, blas=False)(x=x, y=y) == 2.0**64 + 3
        a, b = np.array([10, 2], np.int8), np.array([20, 3], np.int8)
        with np.errstate(all="ignore"):
            assert kernel("(max) m := a[i] * b[i]", target=target)(a=a, b=b) == 6


def test_scalars_weak_numpy_scalars_strong():
    """A Python scalar takes the array's dtype (float32 stays float32, int8 wraps in int8); a
    numpy scalar counts with its own dtype; a 0-d array parameter is a Python scalar."""
    x = np.array([1.5, 2.5], np.float32)
    k = kernel("y[i] := a * x[i]")
    assert k(x=x, a=2.0).dtype == np.float32
    assert k(x=x, a=np.float64(2.0)).dtype == np.float64
    assert k(x=x, a=np.array(2.0)).dtype == np.float32
    i8 = np.array([100, -3], np.int8)
    with np.errstate(all="ignore"):
        got = kernel("y[i] := x[i] * 3 + 1")(x=i8)
        np.testing.assert_array_equal(got, i8 * 3 + 1)
        assert got.dtype == np.int8
    with pytest.raises(ArgumentError, match="out of bounds for int8"):
        kernel("y[i] := x[i] * 1000")(x=i8)
