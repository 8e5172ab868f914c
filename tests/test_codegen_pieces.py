"""The pieces every renderer of tullio_py.codegen is built from, each checked on its own: the
emitter's indentation, the expression renderer's text per target, and the loop bounds that
guards clip (against index sets counted one by one)."""
import itertools

import numpy as np
import pytest

from tullio_py import dtypes, rewrite, schedule
from tullio_py.codegen.bounds import loop_bounds, loop_header
from tullio_py.codegen.emit import Emitter, under
from tullio_py.codegen.expr import Expr, call_text, combine, identity_code
from tullio_py.ir import Affine
from tullio_py.parse import parse
from tullio_py.schedule import Guard, Linear


# ----------------------------------------------------------------------------- emitter
def test_emitter_indents_by_depth_and_leading_spaces():
    out = Emitter()
    out.add("for i in range(3):")
    out.depth += 1
    out.add("if not (i != 1):\n    continue\nx = i")
    out.add("while s > 0:\n    if t < s:\n        t += 1")
    out.depth -= 1
    out.add("done = 1")
    assert out.text() == ("    for i in range(3):\n"
                          "        if not (i != 1):\n"
                          "            continue\n"
                          "        x = i\n"
                          "        while s > 0:\n"
                          "            if t < s:\n"
                          "                t += 1\n"
                          "    done = 1\n")
    assert out.lines()[-1] == "    done = 1"


def test_under_puts_every_line_inside_the_condition():
    out = Emitter()
    out.add(under("0 <= i < n", "_v = x\ny = _v if _v > y else y"))
    out.add("z = 0")
    assert out.lines() == ["    if 0 <= i < n:", "        _v = x", "        y = _v if _v > y else y",
                           "    z = 0"]


def test_emitter_starts_at_its_depth():
    out = Emitter(depth=0)
    out.add("a = 1\n    b = 2")
    assert out.lines() == ["a = 1", "    b = 2"]


# ----------------------------------------------------------------------------- expressions
def _rhs(expr: str, arrays: dict, target: str) -> str:
    eq = rewrite.lower(parse(expr)).equation
    rng = {n: range(0, 3) for n in eq.indices}
    plan = schedule.plan(eq, rng, "float64", threads=False)
    plan = dtypes.with_dtypes(plan, arrays)
    return Expr(plan, target).rhs_without_guards()


F = np.zeros(3)
C = np.zeros(3, complex)

EXPRESSIONS = [
    ("y[i] := exp(A[i]) + max(A[i], B[i])", {"A": F, "B": F},
     {"cpu": "(_vm_exp_f64(A[i]) + _np.maximum(A[i], B[i]))",
      "python": "(_np.exp(A[i]) + _np.maximum(A[i], B[i]))",
      "cuda": "(math.exp(A[i]) + (A[i] if (A[i] > B[i]) | (A[i] != A[i]) else B[i]))"}),
    ("y[i] := relu(A[i]) * sqrt(B[i])", {"A": F, "B": F},
     {"cpu": "(_np.maximum(A[i], 0) * _np.sqrt(B[i]))",
      "cuda": "((A[i] if (A[i] > 0) | (A[i] != A[i]) else 0) * math.sqrt(B[i]))"}),
    ("y[i] := min(A[i], B[i]) - arctan(A[i])", {"A": F, "B": F},
     {"cpu": "(_np.minimum(A[i], B[i]) - _np.arctan(A[i]))",
      "cuda": "((A[i] if (A[i] < B[i]) | (A[i] != A[i]) else B[i]) - math.atan(A[i]))"}),
    ("y[i] := log1p(A[i]) + conj(A[i])", {"A": C},
     {"cpu": "(_np.log1p(A[i]) + _np.conj(A[i]))",
      "cuda": "(cmath.log(1 + A[i]) + (A[i]).conjugate())"}),
]


@pytest.mark.parametrize("target", ["cpu", "python", "cuda"])
@pytest.mark.parametrize("expr,arrays,want", EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_expression_text_per_target(expr, arrays, want, target):
    assert _rhs(expr, arrays, target) == want.get(target, want["cpu"])


def test_call_text_math_module_follows_the_argument_kind():
    f64, c128 = np.dtype("float64"), np.dtype("complex128")
    assert call_text("cuda", "expm1", ["a"], f64) == "math.expm1(a)"
    assert call_text("cuda", "expm1", ["a"], c128) == "(cmath.exp(a) - 1)"
    assert call_text("cuda", "sigmoid", ["a"], c128) == "(1.0 / (1.0 + cmath.exp(-a)))"
    assert call_text("cpu", "sigmoid", ["a"], f64) == "(1.0 / (1.0 + _vm_exp_f64(-a)))"
    # exp is vecmath's for float32 / float64 in compiled CPU kernels, else numpy's
    assert call_text("cpu", "exp", ["a"], np.dtype("float32")) == "_vm_exp_f32(a)"
    assert call_text("cpu", "exp", ["a"], np.dtype("float16")) == "_np.exp(a)"
    assert call_text("cpu", "log", ["a"], f64) == "_vm_log_f64(a)"
    assert call_text("cpu", "tanh", ["a"], np.dtype("float32")) == "_vm_tanh_f32(a)"
    assert call_text("cpu", "sigmoid", ["a"], c128) == "(1.0 / (1.0 + _np.exp(-a)))"
    assert call_text("python", "exp", ["a"], f64) == "_np.exp(a)"
    assert call_text("cpu", "real", ["a"], c128) == "(a).real"
    assert call_text("cuda", "real", ["a"], c128) == "(a).real"


def test_combine_and_identities():
    f64, i32 = np.dtype("float64"), np.dtype("int32")
    assert combine("+", "s", "x", f64) == "s += x"
    assert combine("*", "s", "x", i32, branch=True) == "s *= x"
    assert combine("max", "s", "x", f64) == "_v = x\ns = _v if (_v > s) | (_v != _v) else s"
    assert combine("min", "s", "x", i32, branch=True) == "_v = x\nif _v < s:\n    s = _v"
    assert identity_code("max", i32) == f"_T({np.iinfo(np.int32).min})"
    assert identity_code("min", f64) == "_T(_np.inf)"
    assert identity_code("+", f64) == "_T(0)"


# ----------------------------------------------------------------------------- loop bounds
def _run(start: str, stop: str, checks: list, env: dict) -> list[int]:
    """The values the loop takes (the generated bounds and checks evaluated at `env`)."""
    lo, hi = eval(start, {}, env), eval(stop, {}, env)
    taken = []
    for v in range(lo, hi):
        ok = all(eval(c.split("\n")[0][len("if not "):-1], {}, {**env, "j": v}) for c in checks)
        if ok:
            taken.append(v)
    return taken


@pytest.mark.parametrize("c", [1, -1, 2, 3, -2, -3])
def test_loop_bounds_match_the_guard_counted_by_hand(c):
    """1 <= c*j + i < n + 1, j in [0, m): the clipped loop runs exactly the j that pass.  (A
    guard's constant lives in its bounds: schedule builds guards with constant-free exprs.)"""
    g = Guard(Affine.of((("j", c), ("i", 1))), Linear.of((), 1), Linear.of((("n", 1),), 1))
    start, stop, checks = loop_bounds("j", {"i"}, [g])
    assert not checks
    for i, n, m in itertools.product(range(-2, 6), range(0, 7), range(0, 6)):
        want = [j for j in range(m) if 1 <= c * j + i < n + 1]
        assert _run(start, stop, checks, {"i": i, "n": n, "_start_j": 0, "_stop_j": m}) == want


def test_loop_bounds_texts():
    g = Guard(Affine.of((("j", 1), ("i", 1))), Linear.of((), 0), Linear.of((("n", 1),)))
    assert loop_bounds("j", {"i"}, [g]) == ("max(_start_j, -i)", "min(_stop_j, n - i)", [])
    # a guard with an index not yet looped over is applied later, not here
    assert loop_bounds("j", set(), [g]) == ("_start_j", "_stop_j", [])
    # from a block's bounds instead of the range arguments
    assert loop_bounds("j", {"i"}, [g], ("_clo", "_chi"))[:2] == ("max(_clo, -i)",
                                                                  "min(_chi, n - i)")


def test_condition_guards_become_checks():
    g = Guard(Affine.of((("j", 1), ("i", -1))), None, None, "i != j")
    head, checks = loop_header("j", {"i"}, [g], parallel=True)
    assert head == "for j in _prange(_start_j, _stop_j):"
    assert checks == ["if not (i != j):\n    continue"]
    for i, m in itertools.product(range(4), range(5)):
        assert _run("_start_j", "_stop_j", checks, {"i": i, "_start_j": 0, "_stop_j": m}) == \
            [j for j in range(m) if j != i]


# ----------------------------------------------------------------------------- lane positions
@pytest.mark.parametrize("expr,text,ref", [
    # a sum over the innermost index i, read at i+j (the depthwise convolution's weight grad)
    ("dw[c,j] += dy[b,c,i] * x[b,c,i+j]", "x_[b_, c_, _np.uint64(i_+j_)]",
     lambda dy, x, w: np.stack([np.einsum("bci,bci->c", dy, x[:, :, j:j + 23])
                                for j in range(5)], 1)),
    # a pad() read at p-j, p innermost, only where it is inside the array (its input grad)
    ("dx[b,c,p] += dy[b,c,pad(p-j)] * w[c,j]", "_np.uint64(p_-j_)",
     lambda dy, x, w: sum(np.pad(dy * w[None, :, j, None], ((0, 0), (0, 0), (j, 4 - j)))
                          for j in range(5))),
])
def test_positions_along_the_innermost_index_are_unsigned(expr, text, ref):
    """A position that sums the innermost loop's index with others is passed as an unsigned
    integer (no per-lane wraparound: the compiler vectorises the loads): in the plain CPU
    nest's text, and the values those of numpy on odd sizes and at the boundaries."""
    from tullio_py import kernel
    rng = np.random.default_rng(3)
    dy, x, w = rng.standard_normal((3, 7, 23)), rng.standard_normal((3, 7, 27)), \
        rng.standard_normal((7, 5))
    k = kernel(expr, blas=False)
    arrays = (dict(dy=dy, x=x, dw=np.zeros((7, 5))) if expr.startswith("dw") else
              dict(dy=dy, w=w, dx=np.zeros((3, 7, 27))))
    got = k(**arrays)
    assert not k.last.plan.jam and text in k.last.source.text
    np.testing.assert_allclose(got, ref(dy, x, w), rtol=1e-12, atol=1e-12)
