"""Error types, wording and carets: a contract.

Every case gives the exception type, a fragment of the message (case-insensitive regex) and the
character offset in the expression where the first caret must stand (None: not checked; a tuple:
any of these offsets).  The message shows the expression indented by 4 spaces with a line of
'^' under the offending part.
"""
import os
import re

import numpy as np
import pytest

from tullio_py.errors import ArgumentError, GradientError, ParseError, RangeError, TullioError
from tullio_py.parse import parse


def caret_offset(message: str, text: str):
    """Offset of the first '^' under the expression line, checking that line is the expression."""
    lines = message.split("\n")
    for k, line in enumerate(lines):
        if line.strip() and set(line.strip()) == {"^"} and line.startswith("    "):
            assert k > 0 and lines[k - 1] == "    " + text, \
                f"caret line not under the expression:\n{message}"
            return line.index("^") - 4
    return None


def check(excinfo, text, fragment, at):
    err = excinfo.value
    msg = str(err)
    assert isinstance(err, TullioError) and isinstance(err, ValueError)
    assert re.search(fragment, msg, re.IGNORECASE | re.DOTALL), \
        f"message lacks {fragment!r}:\n{msg}"
    if at is None:
        return
    col = caret_offset(msg, text)
    assert col is not None, f"no caret line in:\n{msg}"
    allowed = at if isinstance(at, tuple) else (at,)
    assert col in allowed, (f"caret at {col} ({text[col:col + 8]!r}), expected one of {allowed} "
                            f"({[text[a:a + 8] for a in allowed]}):\n{msg}")


# (text, fragment, caret offset)
SYNTAX = [
    # plain syntax errors
    ("C[i] := A[i", r"never closed|syntax", 9),
    ("C[i] A[i]", r"no assignment", 0),
    (":= A[i]", r"missing", 0),
    ("C[i] :=", r"missing", 7),
    ("C[] := A[i]", r"syntax", 2),
    ("C[i] := A[]", r"syntax|empty", 10),
    ("C[i] := A[i] := B[i]", r"syntax|':='", 13),
    ("C[i] := A[i]; D[i] := A[i]", r"one statement", 12),
    # unknown functions, operators
    ("C[i] := foo(A[i])", r"unknown function 'foo'", 8),
    ("C[i] := getattr(A, 'x')", r"unknown function 'getattr'", 8),
    ("C[i] := A[i]^2", r"'\^'.*\*\*", (8, 12)),
    ("C[i] := A[i] % 2", r"not allowed", (8, 13)),
    ("C[i] := A[i] // 2", r"not allowed", (8, 13)),
    ("C[i] := A[i] @ B[i]", r"not allowed", (8, 13)),
    ("C[i] := not A[i]", r"not allowed", 8),
    ("C[i] := ~A[i]", r"not allowed", 8),
    ("C[i] := A[i] and B[i]", r"'and'/'or'|not allowed", 8),
    ("C[i] := A[i] is B[i]", r"comparisons", (8, 13)),
    ("C[i] := A[i] in B[i]", r"comparisons", (8, 13)),
    ("C[i] := exp(A[i], B[i])", r"exp\(\) takes 1 argument", 8),
    ("C[i] := where(A[i] > 0, 1)", r"where\(\) takes 3 arguments", 8),
    ("C[i] := A[i] * exp", r"function", 15),
    ("C[i] := A[i] * A", r"'A' is an array", 15),
    ("C[i] := pad(A[i])", r"inside brackets", 8),
    # injection attempts: never evaluated, always rejected
    ("C[i] := A[i] * __import__('os')", r"__import__", 15),
    ("C[i] := A[__import__('os')]", r"not an index|'_'", 10),
    ("C[i] := A[i].__class__", r"attribute", 8),
    ("C[i] := x.__class__", r"attribute", 8),
    ("C[i] := (lambda: 1)()", r"lambda|only tullio_py's own functions", 9),
    ("C[i] := A[i] * (lambda x: x)", r"lambda", 16),
    ('C[i] := "abc"', r"str", 8),
    ("C[i] := A[i] * 'a'", r"str", 15),
    ('C[i] := A[i] + f"x"', r"string", 15),
    ("C[i] := A[i] + None", r"NoneType|None", 15),
    ("C[i] := A[i] + True", r"bool", 15),
    ("C[i] := exp(*A)", r"starred", (8, 12)),
    ("C[i] := exp(x=A[i])", r"keyword", (12, 14)),
    ("C[i] := [A[i]]", r"list", 8),
    ("C[i] := {A[i]}", r"not allowed", 8),
    ("A.b[i] := x[i]", r"left-hand side", 0),
    # assignment operators
    ("C[i] /= A[i]", r"'/='", 5),
    ("C[i] ^= A[i]", r"'\^='", 5),
    # index expressions
    ("C[i] := A[i*j]", r"product of two indices", 10),
    ("C[i] := A[i:j]", r"slice", 10),
    ("C[i] := A[:]", r"slice", 10),
    ("C[i] := A[i/2]", r"division", 10),
    ("C[i] := A[i%2]", r"modulo", 10),
    ("C[i] := A[1.5]", r"integer", 10),
    ("C[i] := A[-J[i]]", r"gather", 10),
    ("C[i] := A[2*J[i]]", r"gather", 10),
    ("C[i] := A[J[i]+K[i]]", r"one gather", 10),
    ("C[i] := A[J[pad(i)]]", r"index array", 12),
    ("C[i] := A[pad(pad(i))]", r"nested|not an index", 14),
    ("C[i] := A[pad(i, -1)]", r"non-negative", 17),
    ("C[i] := A[pad(i, k)]", r"integer constant", 17),
    ("C[i] := A[clamp(i, 1)]", r"clamp\(e\)", 10),
    ("i[i] := A[i]", r"both as an index", 0),
    ("C[i] := i[i]", r"both as an index", 8),
    # statement rules
    ("C[i] := C[i] + A[i]", r"also read", (0, 15)),
    ("x[i] := 2 * x[i]", r"also read", (0, 12)),
    ("(max) C[i] := A[i]", r"needs an index to reduce", 0),
    ("(*) C[i,j] := A[i] * B[j]", r"needs an index to reduce", 0),
    ("C[i] := A[i] |> sqrt", r"finaliser.*needs an index to reduce", (13, 16)),
    ("(foo) C[i] := A[i,j]", r"unknown reduction '\(foo\)'", 1),
    ("() C[i] := A[i,j]", r"unknown reduction", 0),
    ("C[i] := A[i,j] |> foo", r"unknown finaliser 'foo'", 18),
    ("C[i] := A[i,j] |> max", r"unknown finaliser 'max'", 18),
    ("C[i,1] := A[i]", r"must be 0", 4),
    ("C[2,i] := A[i]", r"must be 0", 2),
    ("_C[i] := A[i]", r"'_'", 0),
    ("C[i] := _A[i]", r"'_'", 8),
    ("C[_i] := A[_i]", r"'_'", 2),
    ("C[i] := A[i] * _p", r"'_'", 15),
    ("C[pad(i)] := A[i]", r"left-hand side", 2),
    ("C[clamp(i)] = A[i]", r"left-hand side", 2),
    ("(max) C[i] += A[i,j]", r"accumulates", 11),
    ("(min) C[i] -= A[i,j]", r"accumulates", 11),
    ("(max) C[i] *= A[i,j]", r"multiplies", 11),
]


@pytest.mark.parametrize("text,fragment,at", SYNTAX, ids=[t for t, _, _ in SYNTAX])
def test_syntax_error(text, fragment, at):
    with pytest.raises(ParseError) as excinfo:
        parse(text)
    check(excinfo, text, fragment, at)


def test_enough_cases():
    assert len(SYNTAX) >= 40


def test_injection_is_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    for text in [f"C[i] := A[i] * __import__('os').system('touch {marker}')",
                 f"C[i] := A[__import__('os').system('touch {marker}')]",
                 f"C[i] := exec('open(\"{marker}\", \"w\")')",
                 f"(max) C[i] := A[i] |> __import__('os').system('touch {marker}')"]:
        with pytest.raises(ParseError):
            parse(text)
    assert not marker.exists()


def test_too_long_is_parse_error_with_hint():
    text = "y[i] := " + "+".join(["x[i]"] * 3000)
    with pytest.raises(ParseError, match=r"too long|10.?000"):
        parse(text)


def test_hint_for_power():
    with pytest.raises(ParseError, match=r"\*\*"):
        parse("C[i] := A[i] ^ 2")


def test_hint_for_divide_assign():
    with pytest.raises(ParseError, match=r"A\[i\] = A\[i\] / B\[i\]|/"):
        parse("A[i] /= B[i]")


# ----------------------------------------------------------------------------- runtime errors
# Through the public API.  These need tullio_py.tullio (kernel.py).

def _tullio():
    from tullio_py import tullio
    return tullio


def _raises(exc, text, fragment, at=None, **kw):
    tullio = _tullio()
    with pytest.raises(exc) as excinfo:
        tullio(text, **kw)
    check(excinfo, text, fragment, at)
    return excinfo.value


def test_public_error_types_exported():
    import tullio_py
    for name in ["TullioError", "ParseError", "RangeError", "ArgumentError", "GradientError"]:
        cls = getattr(tullio_py, name)
        assert issubclass(cls, tullio_py.TullioError) and issubclass(cls, ValueError)
    assert tullio_py.ParseError is ParseError and tullio_py.RangeError is RangeError
    assert issubclass(tullio_py.SummationWarning, Warning)


def test_parse_error_through_api():
    _raises(ParseError, "C[i] := A[i]^2", r"\*\*", (8, 12), A=np.ones(3))


def test_unconstrained_index_named():
    text = "A[i] := j"
    err = _raises(RangeError, text, r"'i'|\bi\b", ranges={"j": 3})
    assert "i" in str(err)
    _raises(RangeError, "A[i] := i", r"\bi\b")
    _raises(RangeError, "A[i] := x[j]", r"\bi\b", x=np.ones(3))


def test_disagreeing_extents_caret_under_second_access():
    text = "C[i] := A[i] + B[i]"
    _raises(RangeError, text, r"\bi\b", (15, 17), A=np.ones(3), B=np.ones(4))
    text = "C[i,k] := A[i,j] * B[j,k]"
    _raises(RangeError, text, r"\bj\b", (19, 21), A=np.ones((2, 3)), B=np.ones((4, 2)))


def test_disagreeing_with_ranges_option():
    _raises(RangeError, "C[i] := A[i]", r"\bi\b", A=np.ones(3), ranges={"i": 5})


def test_gather_out_of_range():
    _raises(RangeError, "G[k] := A[J[k]]", r"J|range|bound", A=np.ones(3),
            J=np.array([0, 5]))
    _raises(RangeError, "G[k] := A[J[k]]", r"J|range|bound", A=np.ones(3),
            J=np.array([0, -1]))
    _raises(RangeError, "H[J[i]] += w[i]", r"J|range|bound", H=np.zeros(3), w=np.ones(2),
            J=np.array([1, 3]))


def test_float_gather_index():
    tullio = _tullio()
    with pytest.raises((RangeError, ArgumentError)) as excinfo:
        tullio("G[k] := A[J[k]]", A=np.ones(3), J=np.array([0.0, 1.0]))
    assert re.search("integer", str(excinfo.value), re.IGNORECASE)


def test_missing_array_named():
    err = _raises(ArgumentError, "C[i] := A[i] * Zq_missing[i]", r"Zq_missing", A=np.ones(3))
    assert "Zq_missing" in str(err)


def test_missing_param_named():
    _raises(ArgumentError, "C[i] := A[i] * alpha_missing_q", r"alpha_missing_q", A=np.ones(3))


def test_wrong_ndim():
    _raises(ArgumentError, "C[i] := A[i,j]", r"\bA\b", A=np.ones(3))
    _raises(ArgumentError, "C[i] := A[i]", r"\bA\b", A=np.ones((3, 3)))


def test_wrong_output_ndim_in_place():
    _raises(ArgumentError, "C[i] += A[i]", r"\bC\b", C=np.ones((3, 1)), A=np.ones(3))


@pytest.mark.parametrize("name", ["threads", "target", "ranges", "verbose", "grad", "fastmath"])
def test_option_names_are_not_array_names(name):
    tullio = _tullio()
    with pytest.raises((ParseError, ArgumentError)) as excinfo:
        tullio(f"C[i] := {name}[i]", **{name: np.ones(3)})
    assert name in str(excinfo.value)


def test_define_output_must_start_at_zero():
    _raises(RangeError, "y[i] := x[i-1]", r"rebase", x=np.ones(4))


def test_constant_index_out_of_bounds():
    _raises(RangeError, "C[i] := A[i, 5]", r"\bA\b|bound|range", (8, 13), A=np.ones((3, 2)))


def test_in_place_output_too_small():
    _raises((RangeError, ArgumentError), "C[i] += A[i]", r"\bC\b|\bi\b", C=np.zeros(2),
            A=np.ones(3))


def test_gradient_of_times_equal_needs_the_old_value():
    from tullio_py import kernel
    k = kernel("P[i] *= A[i,j]")
    A = np.ones((2, 3))
    np.testing.assert_allclose(k(P=np.ones(2), A=A), np.ones(2))  # the forward pass is fine
    with pytest.raises(GradientError) as excinfo:
        k.vjp(np.ones(2), A=A)
    assert re.search(r"before the statement", str(excinfo.value))
    assert "pass P=" in str(excinfo.value)


@pytest.mark.parametrize("text,at", [("y[clamp(i)] := x[i]", (2, 10)),
                                     ("y[pad(i-1, 1, 1)] += x[i]", (2, 16))])
def test_wrapped_left_positions_need_accumulation(text, at):
    _raises(ParseError, text, r"accumulates into the element it hits", at,
            x=np.ones(3), y=np.zeros(3))


def test_errors_do_not_leak_internal_exceptions():
    """Bad arrays give TullioErrors, not IndexError/KeyError/TypeError from generated code."""
    tullio = _tullio()
    bad = [
        ("C[i] := A[i]", dict(A=np.ones(3), ranges={"i": range(0, 4)})),
        ("C[i,k] := A[i,j] * B[j,k]", dict(A=np.ones((2, 3)), B=np.ones((4, 2)))),
        ("C[i] := A[i,j]", dict(A=np.ones(3))),
        ("C[i] := A[i]", dict()),
    ]
    for text, kw in bad:
        with pytest.raises(TullioError):
            tullio(text, **kw)


# ----------------------------------------------------------------------------- dtypes the loops cannot take
@pytest.mark.parametrize("x,fragment", [
    (np.ones(3, np.float16), "float16"),
    (np.ones(3, ">f8"), "byte order"),
])
def test_unsupported_dtypes_are_argument_errors(x, fragment):
    from tullio_py import tullio
    with pytest.raises(ArgumentError, match=fragment) as excinfo:
        tullio("y[i] := x[i] * 2", x=x)
    assert caret_offset(str(excinfo.value), "y[i] := x[i] * 2") == 8


def test_max_of_complex_is_an_argument_error_and_real_output_works():
    from tullio_py import tullio
    z = np.array([1 + 1j, 3 + 0j, -2j])
    with pytest.raises(ArgumentError, match="real values"):
        tullio("(max) m := z[i]", z=z)
    m = np.zeros(())
    tullio("(max) m = abs(z[i])", z=z, m=m)
    assert m == 3.0


@pytest.mark.parametrize("option", ["grad", "blas", "fuse"])
def test_switch_options_must_be_bools(option):
    from tullio_py import kernel
    with pytest.raises(ArgumentError, match=f"{option} must be True or False"):
        kernel("C[i] := A[i]", **{option: "no"})


@pytest.mark.parametrize("options,fragment", [
    (dict(ranges={"q": 3}), r"option ranges names 'q', which is not an index of the statement"),
    (dict(ranges={"A": 3}), r"option ranges names 'A', which is not an index of the statement"),
    (dict(nograd=("B",)), r"option nograd names 'B', which is not an input of the statement"),
    (dict(target="gpu"), r"option target must be one of 'auto', 'cpu', 'cuda', 'python', not 'gpu'"),
    (dict(pad="zero"), r"option pad must be a real number"),
])
def test_option_names_checked_against_the_statement(options, fragment):
    """Options that name things name things of the statement; the message shows it."""
    from tullio_py import kernel
    with pytest.raises(ArgumentError, match=fragment) as excinfo:
        kernel("C[i] := A[i]", **options)
    if "ranges" in options or "nograd" in options:
        assert "    C[i] := A[i]" in str(excinfo.value)
