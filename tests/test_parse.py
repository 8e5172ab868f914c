"""Parser: round trip parse(str(eq)) == eq, structure of the Equation, robustness."""
import pytest

from tullio_py.errors import ParseError, TullioError
from tullio_py.ir import (Access, Affine, Binary, Call, Compare, Const, Gather, IndexValue, Param,
                          Unary, Wrapped)
from tullio_py.parse import parse

ROUND_TRIP = [
    # assignment forms and reductions
    "C[i,k] := A[i,j] * B[j,k]",
    "C[i,k] = A[i,j] * B[j,k]",
    "C[i,k] += A[i,j] * B[j,k]",
    "C[i,k] -= A[i,j] * B[j,k]",
    "C[i,k] *= A[i,j] * B[j,k]",
    "(+) C[i,k] := A[i,j] * B[j,k]",
    "(*) P[i] := A[i,j]",
    "(max) M[i] := A[i,j]",
    "(min) M[j] = A[i,j] + 1",
    "(*) P[i] *= A[i,j]",
    "( max ) M[i] := abs(A[i,j])",
    # finalisers
    "n[i] := A[i,j]**2 |> sqrt",
    "(max) m[i] := A[i,j] |> exp",
    "s := x[i] |> log",
    # shifts, strides, implicit multiplication
    "y[i] := x[i+j] * h[j]",
    "y[i] := x[i-j+3] * h[j]",
    "y[i] := x[2i+k] * h[k]",
    "y[i] := x[2*i+k] * h[k]",
    "y[i] := x[i+2k] * h[k]",
    "y[i] := x[3i-2k-1] * h[k]",
    "y[i+j] += x[i] * h[j]",
    "y[i+j] := x[i] * h[j]",
    "y[2i] = x[i]",
    "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
    # boundary wrappers
    "y[i] := x[pad(i+k, 1, 1)] * h[k]",
    "y[i] := x[pad(i+k-2, 2)] * h[k]",
    "y[i] := x[pad(i+k)] * h[k]",
    "y[i] := x[clamp(i+k)] * h[k]",
    "y[i] := x[mod(i+k)] * h[k]",
    "y[i] := x[mod(J[i]+1)]",
    # gathers
    "G[k] := A[J[k]]",
    "G[k,c] := A[J[k]+i, c] * w[i]",
    "G[k] := A[J[k]-1]",
    "G[k] := A[J[k,0], J[k,1]]",
    "H[J[i]] += w[i]",
    "H[J[i]+1] += 1",
    # naked indices, masks, compares, where
    "A[i,j] := i + 10*j",
    "U[i,j] := A[i,j] * (i <= j)",
    "U[i,j] := A[i,j] * (0 < i <= j)",
    "y[i] := where(x[i] > 0, x[i], 0.0)",
    "y[i] := x[i] if x[i] != 0 else 1",
    "y[i] := (x[i] == 1) + (x[i] >= 2) - (x[i] < -1)",
    # functions
    "y[i] := exp(x[i]) + log(x[i]) + log1p(x[i]) + expm1(x[i])",
    "y[i] := sqrt(x[i]) + abs(x[i]) + sin(x[i]) + cos(x[i]) + tan(x[i])",
    "y[i] := tanh(x[i]) + sinh(x[i]) + cosh(x[i]) + arctan(x[i])",
    "y[i] := sigmoid(x[i]) * relu(x[i]) - conj(z[i]) + real(z[i]) * imag(z[i])",
    "y[i] := max(x[i], 0) + min(x[i], h[i])",
    # constants, params, scalars, unary, precedence
    "y[i] := 2.5 * x[i] - 3 + 1e-3",
    "y[i] := (1+2j) * x[i] + 3j",
    "y[i] := -x[i] + -(x[i] - 1)",
    "y[i] := x[i]**2**3",
    "y[i] := (x[i]**2)**3",
    "y[i] := x[i] / (h[i] * 2) - (x[i] - h[i]) / 3",
    "y[i] := (-x[i])**2",
    "y[i] := alpha * x[i] + beta",
    "s := x[i] * y[i]",
    "s += x[i]",
    "C[i,0] := A[i,j]",
    "C[i,3] = A[i,j]",
    "y[i] := x[i, 2]",
]


@pytest.mark.parametrize("text", ROUND_TRIP, ids=ROUND_TRIP)
def test_round_trip(text):
    eq = parse(text)
    printed = str(eq)
    again = parse(printed)
    assert again == eq, (printed, again)
    assert str(again) == printed
    assert hash(again) == hash(eq)


def test_round_trip_count():
    assert len(set(ROUND_TRIP)) >= 40


def test_matmul_structure():
    eq = parse("C[i,k] := A[i,j] * B[j,k]")
    assert eq.assign == ":=" and eq.reduction is None and eq.reducer == "+"
    assert eq.output == "C"
    assert eq.lhs_indices == ("i", "k")
    assert eq.indices == ("i", "k", "j")
    assert eq.reduction_indices == ("j",)
    assert eq.arrays == ("A", "B")
    assert eq.params == ()
    assert eq.rhs == Binary("*", Access("A", (Affine((("i", 1),)), Affine((("j", 1),)))),
                            Access("B", (Affine((("j", 1),)), Affine((("k", 1),)))))


def test_reducer_rules():
    assert parse("C[i] *= A[i,j]").reducer == "*"
    assert parse("C[i] *= A[i,j]").reduction is None
    assert parse("(max) C[i] := A[i,j]").reducer == "max"
    assert parse("C[i] += A[i,j]").reducer == "+"
    assert parse("(min) C[i] = A[i,j]").reducer == "min"


def test_affine_slots():
    eq = parse("y[i] := x[2i+3k-1] * h[k]")
    slot = eq.rhs.left.indices[0]
    assert slot == Affine((("i", 2), ("k", 3)), -1)
    assert parse("y[i] := x[2*i+3*k-1] * h[k]") == eq
    assert parse("y[i] := x[i+i] ").rhs.indices[0] == Affine((("i", 2),), 0)
    # arithmetic that cancels to a plain index is still a shifted use, like i+0
    assert parse("y[i] := x[i+j-j]*z[j]").rhs.left.indices[0] == Affine((("i", 1),), 0,
                                                                         shifted=True)
    assert not parse("y[i] := x[i+0]").rhs.indices[0].is_bare
    assert parse("y[i] := x[i, 2]").rhs.indices[1] == Affine((), 2)


def test_wrapped_and_gather_slots():
    eq = parse("y[i] := x[pad(i+k, 1, 2)] * h[k]")
    assert eq.rhs.left.indices[0] == Wrapped("pad", Affine((("i", 1), ("k", 1))), 1, 2)
    assert parse("y[i] := x[pad(i, 3)]").rhs.indices[0] == Wrapped("pad", Affine((("i", 1),)), 3, 3)
    assert parse("y[i] := x[pad(i)]").rhs.indices[0] == Wrapped("pad", Affine((("i", 1),)))
    assert parse("y[i] := x[clamp(i-1)]").rhs.indices[0].kind == "clamp"
    assert parse("y[i] := x[mod(i-1)]").rhs.indices[0].kind == "mod"
    g = parse("G[k] := A[J[k]+i] * w[i]").rhs.left.indices[0]
    assert g == Gather("J", (Affine((("k", 1),)),), Affine((("i", 1),)))
    eq = parse("G[k] := A[J[k]+i] * w[i]")
    assert eq.arrays == ("A", "w", "J")
    assert eq.indices == ("k", "i")
    assert eq.reduction_indices == ("i",)
    assert [a.array for a in eq.accesses()] == ["A", "w"]
    scatter = parse("H[J[i]] += w[i]")
    assert scatter.lhs.indices[0] == Gather("J", (Affine((("i", 1),)),))
    assert scatter.lhs_indices == ("i",) and scatter.reduction_indices == ()
    assert scatter.arrays == ("w", "J")


def test_index_values_vs_params():
    eq = parse("A[i,j] := i + alpha * j")
    assert eq.rhs == Binary("+", IndexValue("i"), Binary("*", Param("alpha"), IndexValue("j")))
    assert eq.params == ("alpha",)
    assert eq.arrays == ()
    eq = parse("y[i] := x[i] * n")
    assert eq.rhs.right == Param("n")
    # a name is an index when any bracket uses it, even on the other side
    eq = parse("y[i] := x[j] * (i < j)")
    assert eq.rhs.right == Compare(("<",), (IndexValue("i"), IndexValue("j")))
    # extra_indices (from ranges=) make a bare name an index
    eq = parse("A[i] := j", extra_indices=("j",))
    assert eq.rhs == IndexValue("j")
    assert eq.indices == ("i", "j") and eq.reduction_indices == ("j",)
    assert parse("A[i] := j").rhs == Param("j")


def test_scalar_outputs_and_constants():
    eq = parse("s := x[i] * y[i]")
    assert eq.lhs == Access("s", ())
    assert eq.lhs_indices == () and eq.reduction_indices == ("i",)
    c = parse("y[i] := (1+2j) * x[i] - 2 + 0.5")
    consts = [n.value for n in _walk(c.rhs) if isinstance(n, Const)]
    assert consts in ([1, 2j, 2, 0.5], [1 + 2j, 2, 0.5])
    assert any(isinstance(v, complex) for v in consts)
    assert type(parse("y[i] := 3 * x[i]").rhs.left.value) is int
    assert type(parse("y[i] := 3.0 * x[i]").rhs.left.value) is float
    assert parse("y[i] := -x[i]").rhs == Unary("-", Access("x", (Affine((("i", 1),)),)))


def test_calls_and_finaliser():
    eq = parse("y[i] := where(x[i] > 0, max(x[i], 1), min(x[i], -1))")
    assert isinstance(eq.rhs, Call) and eq.rhs.func == "where" and len(eq.rhs.args) == 3
    assert parse("y[i] := x[i] if x[i] > 0 else 0").rhs.func == "where"
    eq = parse("n[i] := A[i,j]**2 |> sqrt")
    assert eq.finaliser == "sqrt" and eq.rhs == Binary(
        "**", Access("A", (Affine((("i", 1),)), Affine((("j", 1),)))), Const(2))


def test_spans_point_into_text():
    text = "C[i,k] := A[i,j] * B[j,k]"
    eq = parse(text)
    assert eq.text == text
    a = eq.rhs.left
    assert text[a.span[0]:a.span[1]] == "A[i,j]"
    b = eq.rhs.right
    assert text[b.span[0]:b.span[1]] == "B[j,k]"
    text = "y[i] := x[2i+k] * h[k]"
    s = parse(text).rhs.left.indices[0]
    assert text[s.span[0]:s.span[1]] == "2i+k"


def test_spans_do_not_affect_equality():
    assert parse("C[i,k]:=A[i,j]*B[j,k]") == parse("C[i, k]   :=   A[i, j] * B[j, k]")


def test_very_long_input_is_parse_error():
    text = "y[i] := " + " + ".join(f"x{n}[i]" for n in range(2000))
    assert len(text) > 10_000
    with pytest.raises(ParseError):
        parse(text)


def test_long_chain_of_plus_is_parse_error_not_recursion():
    text = "y[i] := x[i]" + "+x[i]" * 2500
    assert len(text) > 10_000
    with pytest.raises(ParseError):
        parse(text)


@pytest.mark.parametrize("n", [1000, 1600])
def test_long_sum_under_the_length_limit_is_not_recursion_error(n):
    # ~5000-8000 characters: a long but flat sum.  Either parses or is a ParseError.
    text = "y[i] := x[i]" + "+x[i]" * n
    assert len(text) < 10_000
    try:
        eq = parse(text)
    except ParseError:
        return
    except RecursionError:
        pytest.fail("RecursionError instead of ParseError")
    assert eq.arrays == ("x",)


@pytest.mark.parametrize("depth", [200, 1000, 4000])
def test_deep_parens_are_parse_error_not_recursion(depth):
    text = "y[i] := " + "(" * depth + "x[i]" + ")" * depth
    try:
        eq = parse(text)
    except ParseError:
        return
    except RecursionError:  # pragma: no cover - the failure this test is about
        pytest.fail("RecursionError instead of ParseError")
    assert eq == parse("y[i] := x[i]")


@pytest.mark.parametrize("depth", [300, 2000])
def test_deep_unary_and_brackets_are_parse_error_not_recursion(depth):
    for text in ["y[i] := " + "-" * depth + "x[i]",
                 "y[i] := x[" + "(" * depth + "i" + ")" * depth + "]",
                 "y[i] := " + "exp(" * depth + "x[i]" + ")" * depth]:
        try:
            parse(text)
        except ParseError:
            pass
        except RecursionError:
            pytest.fail(f"RecursionError for {text[:40]}...")


def test_parse_error_is_tullio_error_and_value_error():
    with pytest.raises(TullioError):
        parse("C[i] := ")
    with pytest.raises(ValueError):
        parse("C[i] := ")


def test_non_string_input():
    with pytest.raises(ParseError):
        parse(None)
    with pytest.raises(ParseError):
        parse(b"C[i] := A[i]")


def _walk(e):
    from tullio_py.ir import walk
    return list(walk(e))
