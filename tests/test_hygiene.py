"""The boundary: every option validated (ArgumentError naming the option and what it allows,
without running any of the user's code), no option value or user name pasted into generated
source, and any valid identifier usable as an array, index or parameter name."""
import ast
import builtins
import math
import sys
import warnings

import numpy as np
import pytest

from tullio_py import kernel, tullio
from tullio_py.codegen import Source
from tullio_py.errors import ArgumentError
from tullio_py import jit

r = np.random.default_rng(7)
X = r.standard_normal(6)


class Crafted:
    """A value whose every conversion to text or number records that it ran."""
    ran: list = []

    def _record(self, *a):
        Crafted.ran.append(type(self).__name__)
        return "x"

    __repr__ = __str__ = __format__ = _record

    def __float__(self):
        Crafted.ran.append("float")
        return 1.0

    def __int__(self):
        Crafted.ran.append("int")
        return 1

    __index__ = __int__


class CraftedFloat(float):
    """A float whose repr and float() would run code (pad accepts it as the number it is)."""
    def __repr__(self):
        Crafted.ran.append("float repr")
        return "__import__('os').getcwd()"

    __str__ = __repr__

    def __float__(self):
        Crafted.ran.append("float float")
        return 5.0


@pytest.fixture(autouse=True)
def _clean_flag():
    Crafted.ran.clear()
    yield
    assert Crafted.ran == [], f"user code ran: {Crafted.ran}"


# ----------------------------------------------------------------------------- 2. options
# (option, bad value, regex the message must match: the option and what it allows)
BAD = [
    ("verbose", 3, r"verbose must be 0, 1, 2, True or False, not 3"),
    ("verbose", "yes", r"verbose must be 0, 1, 2, True or False, not 'yes'"),
    ("ranges", [("i", 3)], r"ranges must be a dict from index names to ranges, not a list"),
    ("ranges", {"i": [0, 3]}, r"ranges\['i'\] must be a range with step 1, a size .*not \[0, 3\]"),
    ("ranges", {"i": -1}, r"ranges\['i'\] must be .*an int >= 0.*not -1"),
    ("ranges", {"i": range(3, 1)}, r"ranges\['i'\] must be .*start <= stop.*not range\(3, 1\)"),
    ("ranges", {"i": range(0, 6, 2)}, r"ranges\['i'\] must be a range with step 1"),
    ("ranges", {"i": (1, 2, 3)}, r"ranges\['i'\] must be .*\(start, stop\)"),
    ("ranges", {"i": 2.0}, r"ranges\['i'\] must be .*not 2\.0"),
    ("ranges", {3: 2}, r"ranges: the keys must be index names \(strings\), not 3"),
    ("ranges", {"q": 3}, r"ranges names 'q', which is not an index of the statement.*indices are i"),
    ("ranges", {"x": 6}, r"ranges names 'x', which is not an index"),
    ("nograd", "x", r"nograd must be a tuple or list of input names, not 'x'"),
    ("nograd", ("y",), r"nograd names 'y', which is not an input of the statement.*inputs are x"),
    ("nograd", (1,), r"nograd must be a tuple or list of input names \(strings\)"),
    ("threads", 0, r"threads must be True, False or a positive int, not 0"),
    ("threads", -2, r"threads must be True, False or a positive int, not -2"),
    ("threads", 1.5, r"threads must be True, False or a positive int, not 1\.5"),
    ("threads", "4", r"threads must be True, False or a positive int, not '4'"),
    ("target", "gpu", r"target must be one of 'auto', 'cpu', 'cuda', 'python', not 'gpu'"),
    ("target", None, r"target must be one of 'auto', 'cpu', 'cuda', 'python', not None"),
    ("fastmath", 1, r"fastmath must be True or False, not 1"),
    ("grad", "no", r"grad must be True or False, not 'no'"),
    ("blas", None, r"blas must be True or False, not None"),
    ("fuse", 0, r"fuse must be True or False, not 0"),
    ("pad", "zero", r"pad must be a real number \(an int or a float, inf and nan included; not a "
                    r"bool or a string\), not 'zero'"),
    ("pad", True, r"pad must be a real number.*not True"),
    ("pad", 1j, r"pad must be a real number.*not a complex"),
    ("pad", None, r"pad must be a real number.*not None"),
]
EXPR = "y[i] := x[pad(i-1)] + x[i]"


@pytest.mark.parametrize("option,value,message", BAD, ids=[f"{o}={v!r}" for o, v, _ in BAD])
def test_bad_option_is_an_argument_error(option, value, message):
    for make in (lambda: kernel(EXPR, **{option: value}),
                 lambda: tullio(EXPR, x=X, **{option: value})):
        with pytest.raises(ArgumentError, match="(?s)" + message):
            make()


@pytest.mark.parametrize("option", ["verbose", "ranges", "nograd", "threads", "target",
                                    "fastmath", "grad", "blas", "fuse", "pad"])
def test_crafted_values_run_nothing(option):
    for value in (Crafted(), {"i": Crafted()}, (Crafted(),), [Crafted()]):
        with pytest.raises(ArgumentError, match=rf"\b{option}\b") as excinfo:
            kernel(EXPR, **{option: value})
        assert "x" not in str(excinfo.value).split("\n")[0].split("not ")[-1]
    with pytest.raises(ArgumentError, match="keys must be index names"):
        kernel(EXPR, ranges={Crafted(): 3})


def test_pad_twice_gives_the_same_error():
    messages = []
    for _ in range(2):
        with pytest.raises(ArgumentError) as excinfo:
            tullio(EXPR, x=X, pad="zero")
        messages.append(str(excinfo.value))
    assert messages[0] == messages[1] and "option pad" in messages[0]


def _shifted(x, pad):
    return np.concatenate([[pad], x[:-1]]) + x


@pytest.mark.parametrize("target", ["cpu", "python"])
@pytest.mark.parametrize("pad", [-math.inf, math.inf, math.nan, 2.5, np.float32(-1.5), 3,
                                 np.int64(-4), CraftedFloat(2.0)], ids=repr)
def test_pad_values(pad, target):
    got = tullio(EXPR, x=X, pad=pad, target=target)
    want = _shifted(X, float.__float__(pad) if isinstance(pad, float) else float(pad))
    np.testing.assert_array_equal(got, want)
    code = kernel(EXPR, pad=pad, target=target).forward_code
    assert "__import__" not in code


def test_pad_is_formatted_by_the_generator():
    assert "_pad = _T((-_np.inf))" in kernel(EXPR, pad=-math.inf).source()
    assert "_pad = _T(_np.nan)" in kernel(EXPR, pad=math.nan).source()
    assert "_pad" not in kernel("y[i] := x[i]", pad=math.nan).source()   # no pad(...) read


def test_nan_pad_kernels_are_cached_once():
    assert kernel(EXPR, pad=float("nan")) is kernel(EXPR, pad=float("nan"))


def test_non_integer_pad_of_an_integer_result():
    with pytest.raises(ArgumentError, match=r"option pad=-inf is not a value of the result type "
                                            r"int64"):
        tullio(EXPR, x=np.arange(4), pad=-math.inf)
    np.testing.assert_array_equal(tullio(EXPR, x=np.arange(4), pad=-7),
                                  _shifted(np.arange(4), -7))


def test_valid_options_still_work():
    x2 = r.standard_normal((5, 3))
    k = kernel("y[i] = x[i, j] * (i < j)", ranges={"i": (1, 4)}, threads=2, verbose=False,
               nograd=["x"], fastmath=True, grad=True, blas=False, fuse=False, target="cpu")
    y = np.zeros(5)
    k(y=y, x=x2)
    want = [sum(x2[i, j] for j in range(3) if i < j) if 1 <= i < 4 else 0 for i in range(5)]
    np.testing.assert_allclose(y, want, rtol=1e-12)
    assert k.given == {"i": range(1, 4)} and k.options.nograd == ("x",)
    assert kernel("y[i] := x[i]", threads=np.int64(2)).threads == 2
    assert kernel("y[i] := x[i]", verbose=True).verbose == 1
    assert kernel("y[i] := x[i]", threads=1) is not kernel("y[i] := x[i]", threads=True)
    assert kernel("y[i] := x[i]", threads=True) is kernel("y[i] := x[i]", threads=True)


# ----------------------------------------------------------------------------- 1. loading
def test_a_module_that_fails_to_load_leaves_nothing_registered():
    src = Source("raise ValueError('broken kernel module')\n", "_tullio_kernel", (), False, False)
    before = set(sys.modules)
    for _ in range(2):
        with pytest.raises(ValueError, match="broken kernel module"):
            jit.load(src, "cpu", signature="hygiene test")
    assert set(sys.modules) <= before | {"numba"} | {m for m in sys.modules if "numba" in m}
    assert not any(m.startswith("_tullio_") for m in set(sys.modules) - before)


# ----------------------------------------------------------------------------- 3. user names
NAMES = ["range", "max", "min", "abs", "len", "np", "math", "cmath", "numba", "prange", "float",
         "int", "sum", "cuda", "print", "shape", "T", "exp", "k_", "i_"]
# Each template puts three names in three roles; rows rotate the names through the roles.
TEMPLATES = {
    # a: output, b: index (bare, shifted in a pad, in a mask), c: array
    "index": ("{a}[{b}] := {c}[{b}, k] * {c}[pad({b}+1), k] * (k <= {b})",
              lambda A: np.array([sum(A["c"][b, k] * (A["c"][b + 1, k] if b + 1 < 5 else 0)
                                      for k in range(b + 1)) for b in range(5)]),
              lambda: {"c": r.standard_normal((5, 5))}),
    # a: output, b: array, c: index also used as a value
    "value": ("{a}[i, j] := {b}[i, {c}] * {b}[{c}, j] + {c}",
              lambda A: A["b"] @ A["b"] + 6.0,
              lambda: {"b": r.standard_normal((4, 4))}),
    # a: output, b: array (clamp, mod), c: scalar parameter
    "param": ("{a}[i] := {b}[i] + {b}[clamp(i+1)] * {c} + {b}[mod(i-1)]",
              lambda A: A["b"] + A["b"][np.minimum(np.arange(5) + 1, 4)] * A["c"]
              + A["b"][(np.arange(5) - 1) % 5],
              lambda: {"b": r.standard_normal(5), "c": 1.5}),
    # a: output, b: index array (gather), c: array, (max) reduction
    "gather": ("(max) {a}[i] := {c}[i, {b}[k]]",
               lambda A: A["c"][:, A["b"]].max(axis=1),
               lambda: {"b": np.array([2, 0, 2, 1]), "c": r.standard_normal((3, 3))}),
}
ROWS = [(t, NAMES[k % len(NAMES)], NAMES[(k + 1) % len(NAMES)], NAMES[(k + 2) % len(NAMES)])
        for k, t in zip(range(0, len(NAMES), 3), ["index", "value", "param", "gather"] * 2)]
ROWS += [(t, "range", "max", "np") for t in TEMPLATES]


def _statement(template, a, b, c):
    text, ref, build = TEMPLATES[template]
    data = build()
    arrays = {{"b": b, "c": c}[k]: v for k, v in data.items()}
    return text.format(a=a, b=b, c=c), ref(data), arrays


@pytest.mark.parametrize("target", ["cpu", "python"])
@pytest.mark.parametrize("template,a,b,c", ROWS, ids=["-".join(x) for x in ROWS])
def test_any_identifier_names_arrays_indices_and_parameters(template, a, b, c, target):
    expr, want, arrays = _statement(template, a, b, c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = kernel(expr, target=target, blas=False)
    np.testing.assert_allclose(k(**arrays), want, rtol=1e-12)
    _only_renamed_names(k.forward_code)


GENERATOR_NAMES = {"range", "min", "max", "abs", "complex", "math", "cmath", "cuda", "False",
                   "True"}


def _only_renamed_names(code: str):
    """Every array read, loop index, assigned name and argument in the code is the generator's
    own (leading '_') or a user name renamed (trailing '_'); every other name is one the
    generator uses on purpose."""
    for node in ast.walk(ast.parse(code)):
        bound = []
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            bound.append(node.value.id)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            bound.append(node.target.id)
        elif isinstance(node, ast.Assign):
            bound += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.arg):
            bound.append(node.arg)
        elif isinstance(node, ast.Name) and not node.id.startswith("_") and not node.id.endswith("_"):
            assert node.id in GENERATOR_NAMES, (node.id, code)
        for n in bound:
            assert n.startswith("_") or n.endswith("_"), (n, code)


@pytest.mark.parametrize("template,a,b,c", ROWS[-4:], ids=["-".join(x) for x in ROWS[-4:]])
def test_cuda_and_gradient_source_rename_user_names(template, a, b, c):
    expr, _, _ = _statement(template, a, b, c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = kernel(expr)
    _only_renamed_names(k.source(target="cuda"))
    first = k.source(target="cuda").splitlines()[4]
    assert first.startswith("# ") and f"{a}[" in first           # comments keep the user's names


def test_fused_gradients_with_builtin_names():
    """The local convolution's dx and dW fuse into one kernel; arrays named like builtins."""
    expr = "sum[s,t,c2,b] := range[s+i,t+j,c1,b] * max[s+i,t+j,i,j,c1,c2]"
    x, W = r.standard_normal((6, 6, 2, 3)), r.standard_normal((6, 6, 3, 3, 2, 2))
    k = kernel(expr, blas=False)
    out = k(range=x, max=W)
    ref = np.zeros((4, 4, 2, 3))
    for i in range(3):
        for j in range(3):
            ref += np.einsum("stcb,stce->steb", x[i:i + 4, j:j + 4], W[i:i + 4, j:j + 4, i, j])
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    cot = r.standard_normal(out.shape)
    g = k.vjp(cot, range=x, max=W)
    assert "def _tullio_fused" in k.gradient_code
    _only_renamed_names(k.gradient_code)
    # the gradients of sum(out * cot), from the definition
    dx, dW = np.zeros_like(x), np.zeros_like(W)
    for i in range(3):
        for j in range(3):
            dx[i:i + 4, j:j + 4] += np.einsum("steb,stce->stcb", cot, W[i:i + 4, j:j + 4, i, j])
            dW[i:i + 4, j:j + 4, i, j] += np.einsum("steb,stcb->stce", cot, x[i:i + 4, j:j + 4])
    np.testing.assert_allclose(g["range"], dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g["max"], dW, rtol=1e-12, atol=1e-12)


def test_builtins_are_names_users_may_take():
    assert all(hasattr(builtins, n) for n in ("range", "max", "min", "abs", "len", "float",
                                               "int", "sum", "print"))
