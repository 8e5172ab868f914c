"""bind.py: the call signature, ranges, output shape and dtype, fill and gather extrema of a
call, against values worked out by hand; and the errors for bad arrays.  Nothing compiles."""
import numpy as np
import pytest

from tullio_py.bind import ArrayInfo, bind
from tullio_py.errors import ArgumentError, RangeError
from tullio_py.options import Options
from tullio_py.parse import parse


def bound(text, options=None, extrema=None, **arrays):
    options = options or Options()
    return bind(parse(text, tuple(options.given)), options, arrays, extrema)


def test_the_docstring_example():
    # x[i+j] with 10 and 3 elements: j in 0:3, i yields to 0:8; int32 * int64 / 2 -> float64
    b = bound("y[i] := x[i+j] * h[j] / 2", x=np.arange(10, dtype=np.int32),
              h=np.arange(3, dtype=np.int64))
    assert b.ranges == {"i": range(0, 8), "j": range(0, 3)}
    assert b.shape == (8,) and b.dtype == np.float64 and not b.fill
    assert b.signature == (("h", "<i8", 1, "C"), ("x", "<i4", 1, "C"))
    assert b.target == "auto" and b.extrema == {} and b.read == {}


def test_where_conditions_do_not_set_the_dtype():
    """As numpy's np.where (int64, float64, float32 for the first four): the arrays a `where`
    only compares choose a branch, the branches give the dtype (the argmax helper of a float32
    (max) holds integer positions)."""
    m = np.ones(3, np.float32)
    for text, want in [("where(m[i] > 0, 1, 0)", np.where(m > 0, 1, 0)),    # numpy itself
                       ("where(m[i] > 0.5, 1, 0)", np.where(m > 0.5, 1, 0)),
                       ("where(m[i] > 0, 1.5, 0)", np.where(m > 0, 1.5, 0)),
                       ("where(m[i] > 0, m[i], 0)", np.where(m > 0, m, 0))]:
        assert bound(f"y[i] := {text}", m=m).dtype == want.dtype, text
    assert bound("y[i] := where(m[i] > 0, 1, 0)", m=m).dtype == np.int64
    assert bound("y[i] := where(m[i] > 0.5, 1, 0)", m=m).dtype == np.int64
    assert bound("y[i] := where(m[i] > 0, 1.5, 0)", m=m).dtype == np.float64
    assert bound("y[i] := where(m[i] > 0, m[i], 0)", m=m).dtype == np.float32
    assert bound("y[i] := (m[i] > 0) * 2", m=m).dtype == np.float32    # a comparison's value
    assert bound("(min) a := where(m[i] == m[i], i, n)", m=m, n=3).dtype == np.int64


def test_matmul_shape_dtype_and_layouts():
    A = np.ones((3, 2), np.float32).T        # (2, 3), Fortran order
    b = bound("C[i,k] := A[i,j] * B[j,k]", Options(target="cpu"), A=A,
              B=np.ones((3, 4), np.float32))
    assert b.ranges == {"i": range(0, 2), "j": range(0, 3), "k": range(0, 4)}
    assert b.shape == (2, 4) and b.dtype == np.float32 and not b.fill
    assert dict((s[0], s[1:]) for s in b.signature) == {"A": ("<f4", 2, "F"),
                                                        "B": ("<f4", 2, "C")}
    assert b.target == "cpu"


def test_strided_output_positions_are_filled():
    b = bound("y[2i] := x[i]", x=np.ones(3))
    assert b.shape == (5,) and b.fill           # y[1], y[3] are never written
    assert bound("y[i] := x[i]", x=np.ones(3)).fill is False
    assert bound("d[i] := M[i,i]", M=np.ones((4, 4))).fill is False
    assert bound("M[i,i] := d[i]", d=np.ones(4)).fill is True      # the off-diagonal


def test_in_place_output_gives_shape_and_dtype():
    y = np.zeros(7, np.complex64)
    b = bound("y[i] += x[i+1]", y=y, x=np.ones(9))
    assert b.shape == (7,) and b.dtype == np.complex64 and b.ranges == {"i": range(0, 7)}
    assert b.fill is False and b.arrays["y"] is y


def test_given_ranges_and_scalar_reduction():
    o = Options.from_kwargs(ranges={"i": range(1, 4)})
    b = bound("s := x[i] * c", o, x=np.ones(6, np.float32), c=2.0)
    assert b.ranges == {"i": range(1, 4)} and b.shape == () and b.dtype == np.float32
    assert bound("n := m[i]", m=np.ones(3, bool)).dtype == np.int64    # a sum of booleans
    assert bound("n[i] := m[i]", m=np.ones(3, bool)).dtype == np.bool_   # no sum
    assert bound("r[i] := abs(z[i])", z=np.ones(2, np.complex128)).dtype == np.float64


def test_gather_extrema_over_what_is_read():
    J = np.array([[0, 3, 1], [9, 9, 9]])
    b = bound("y[k] := x[J[0,k]]", x=np.ones(5), J=J)
    assert b.extrema == {"J": (0, 3)} and b.shape == (3,)
    with pytest.raises(RangeError, match=r"holds values 0\.\.9 .* out of bounds for 'x'"):
        bound("y[k,m] := x[J[m,k]]", x=np.ones(5), J=J)     # row 1 is read too


def test_array_infos_and_given_extrema():
    b = bound("y[k] := x[J[k]]", extrema={"J": (1, 4)},
              x=ArrayInfo((5,), np.dtype(np.float32)), J=ArrayInfo((6,), np.dtype(np.int64)))
    assert b.shape == (6,) and b.dtype == np.float32 and b.extrema == {"J": (1, 4)}
    assert b.arrays["x"].shape == (5,) and b.arrays["x"].strides == (0,)
    with pytest.raises(RangeError, match="holds values 1..5"):
        bound("y[k] := x[J[k]]", extrema={"J": (1, 5)},
              x=ArrayInfo((5,), np.dtype(np.float32)), J=ArrayInfo((6,), np.dtype(np.int64)))


@pytest.mark.parametrize("arrays,error,message", [
    (dict(x=np.ones((2, 2))), ArgumentError, "'x' has 2 dimensions but is indexed with 1"),
    (dict(x=np.ones(2, np.float16)), ArgumentError, "'x' is float16, which the compiled"),
    (dict(x=np.array(["a"])), ArgumentError, "'x' has dtype <U1: tullio_py needs numbers"),
    (dict(x=np.ones(2, ">f8")), ArgumentError, "non-native byte order"),
    (dict(), ArgumentError, "missing array: x"),
    (dict(x=np.ones(2), z=np.ones(2)), ArgumentError, "not used by the expression: z"),
])
def test_bad_arrays(arrays, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        bound("y[i] := x[i]", **arrays)


def test_bad_index_arrays_parameters_and_outputs():
    with pytest.raises(RangeError, match="index array 'J' must hold integers, not float64"):
        bound("y[k] := x[J[k]]", x=np.ones(3), J=np.zeros(2))
    with pytest.raises(ArgumentError, match="'c' is used as a scalar parameter but got list"):
        bound("y[i] := x[i] * c", x=np.ones(3), c=[1])
    y = np.zeros(3)
    y.flags.writeable = False
    with pytest.raises(ArgumentError, match="output 'y' is read-only"):
        bound("y[i] = x[i]", x=np.ones(3), y=y)
    with pytest.raises(ArgumentError, match=r"a \(max\) reduction needs real values"):
        bound("(max) m[i] := z[i,j]", z=np.ones((2, 2), np.complex128))
