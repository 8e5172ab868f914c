"""A chain's gradient array written element by element and read once, computed where it is read
(vjp_inline.py): the rule on hand-made statement lists, and whole chains whose vjp inlines
against the same chain with inlining off and against numpy."""
import numpy as np
import pytest

from tullio_py import chain as chain_mod, chain_grad, kernel, vjp_inline
from tullio_py.parse import parse
from tullio_py.vjp_plan import Statement

F64 = np.dtype(np.float64)


def st(text, ranges):
    eq = parse(text)
    return Statement(eq, str(eq), eq.output, tuple((n, 0, s, 1) for n, s in ranges.items()))


def softmax_statements(nj=5):
    r = {"i": 4, "j": nj}
    return [st("de[i,j] = dy[i,j] * (1 / z[i])", r),
            st("dz[i] += dy[i,j] * -(e[i,j] / z[i]**2)", r),
            st("de[i,j] += dz[i]", r),
            st("dx[i,j] = de[i,j] * e[i,j]", r)]


SHAPES = {"de": (4, 5), "dz": (4,), "dx": (4, 5), "dq": (4, 5)}
DTYPES = {n: F64 for n in SHAPES}


def texts(out):
    return [s.text for s in out if s is not None]


def test_the_softmax_gradient_inlines_de_into_dx():
    out, gone = vjp_inline.inline(softmax_statements(), SHAPES, DTYPES, {"de", "dz"})
    assert gone == {"de"}
    assert texts(out) == ["dz[i] += dy[i, j] * -(e[i, j] / z[i]**2)",
                          "dx[i, j] = (dy[i, j] * (1 / z[i]) + dz[i]) * e[i, j]"]
    assert out[0] is None and out[2] is None


def test_the_reader_s_index_names_replace_the_writers():
    r = {"p": 4, "q": 5}
    sts = [st("de[i,j] = dy[i,j] * j", {"i": 4, "j": 5}),
           st("dx[p,q] = de[p,q] * e[q,p+0]", r)]
    out, gone = vjp_inline.inline(sts, SHAPES, DTYPES, {"de"})
    assert gone == {"de"}
    assert texts(out) == ["dx[p, q] = dy[p, q] * q * e[q, p+0]"]
    # the reader's names swap the writer's: renamed all at once, not one after the other
    sts = [st("de[i,j] = dy[i,j] + 2 * j", {"i": 4, "j": 5}),
           st("dx[j,i] = de[j,i] * e[i,j]", {"j": 4, "i": 5})]
    out, gone = vjp_inline.inline(sts, SHAPES, DTYPES, {"de"})
    assert texts(out) == ["dx[j, i] = (dy[j, i] + 2 * i) * e[i, j]"]


@pytest.mark.parametrize("case", [
    "read twice", "a writer sums", "a writer covers part", "overwritten between",
    "the reader's dtype", "not a candidate", "read at a shift", "a gather",
    "the reader writes what a writer reads", "read before the last writer"])
def test_what_is_not_inlined(case):
    r = {"i": 4, "j": 5}
    sts = softmax_statements()
    dtypes, cands = dict(DTYPES), {"de", "dz"}
    if case == "read twice":
        sts[3] = st("dx[i,j] = de[i,j] * e[i,j] + de[i,j]", r)
    elif case == "a writer sums":
        sts[0] = st("de[i,j] = dy[i,j] * w[i,k]", {**r, "k": 3})
    elif case == "a writer covers part":
        sts[0] = st("de[i,j] = dy[i,j] * (1 / z[i])", {"i": 4, "j": 4})
    elif case == "overwritten between":
        sts.insert(3, st("z[i] = dq[i,j]", r))      # a writer read z; z changes before dx
    elif case == "the reader's dtype":
        dtypes["dx"] = np.dtype(np.float32)
    elif case == "not a candidate":
        cands = {"dz"}
    elif case == "read at a shift":
        sts[3] = st("dx[i,j] = de[i,j+1] * e[i,j]", {"i": 4, "j": 4})
    elif case == "a gather":
        sts[0] = st("de[i,j] = dy[J[i],j]", r)
    elif case == "the reader writes what a writer reads":
        sts[3] = st("dy[i,j] = de[i,j] * e[i,j]", r)
        dtypes["dy"] = F64
    elif case == "read before the last writer":
        sts = [sts[0], sts[3], sts[2]]
    out, gone = vjp_inline.inline(sts, SHAPES, dtypes, cands)
    assert "de" not in gone
    assert out == sts


# ----------------------------------------------------------------------------- whole chains
SOFTMAX = """(max) m[i] := x[i,j]
             e[i,j] := exp(x[i,j] - m[i])
             z[i] := e[i,j]
             y[i,j] := e[i,j] / z[i]"""
# t is read by u and y: dt has two readers.  dv is read by du's statement only and du by
# one of dt's: both inlined, du's statement first becoming dv's reader
TWICE = """t[i,j] := x[i,j] * w[j]
           u[i,j] := t[i,j] * t[i,j] * 2
           v[i,j] := sin(u[i,j])
           y[i] := v[i,j] * t[i,j]"""


def chain(text, **opt):
    return chain_mod.Chain(text, kernel(text, **opt).options)


def run_vjp(k, inline, cot, **arrays):
    """k.vjp with chain_grad.INLINE set to `inline` (read when the vjp is planned)."""
    old = chain_grad.INLINE
    chain_grad.INLINE = inline
    try:
        return k.vjp(cot, **arrays), k.gradient_plan
    finally:
        chain_grad.INLINE = old


@pytest.mark.parametrize("shape", [(7, 13), (64, 33), (1, 1)])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_softmax_vjp_inlined_equals_the_plain_statements(shape, layout):
    R = np.random.default_rng(sum(shape))
    x = R.standard_normal((shape[0] * 2, shape[1] * 2))
    x = {"C": np.ascontiguousarray(x[:shape[0], :shape[1]]),
         "F": np.asfortranarray(x[:shape[0], :shape[1]]), "strided": x[::2, ::2]}[layout]
    dy = R.standard_normal(shape)
    on = chain(SOFTMAX, nograd=("m",))
    off = chain(SOFTMAX, nograd=("m",))
    got, plan = run_vjp(on, True, dy, x=x)
    want, plan_off = run_vjp(off, False, dy, x=x)
    assert "de" in {a.name for a in plan_off.arrays}
    assert "de" not in {a.name for a in plan.arrays}
    np.testing.assert_allclose(got["x"], want["x"], rtol=1e-13, atol=1e-15)
    y = np.exp(x - x.max(1, keepdims=True))
    y /= y.sum(1, keepdims=True)
    np.testing.assert_allclose(got["x"], y * (dy - (dy * y).sum(1, keepdims=True)),
                               rtol=1e-12, atol=1e-14)
    # the printed statements are the ones written, `de` included
    assert any(t.startswith("de[i, j]") for t in on.gradient_equations)


def test_a_chain_with_a_temporary_read_twice():
    R = np.random.default_rng(2)
    x, w, dy = R.standard_normal((9, 6)), R.standard_normal(6), R.standard_normal(9)
    on, off = chain(TWICE), chain(TWICE)
    got, plan = run_vjp(on, True, dy, x=x, w=w)
    want, _ = run_vjp(off, False, dy, x=x, w=w)
    for n in ("x", "w"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-12, atol=1e-14)
    names = {a.name for a in plan.arrays}
    assert "dt" in names and not {"du", "dv"} & names
    # finite differences of sum(y * dy) in x
    eps, k = 1e-6, (3, 2)
    xp, xm = x.copy(), x.copy()
    xp[k] += eps
    xm[k] -= eps
    fd = (on(x=xp, w=w) @ dy - on(x=xm, w=w) @ dy) / (2 * eps)
    assert abs(fd - got["x"][k]) < 1e-6 * max(1, abs(fd))


def test_the_plan_is_the_same_for_the_same_signature():
    x = np.random.default_rng(0).standard_normal((5, 8))
    a, b = chain(SOFTMAX, nograd=("m",)), chain(SOFTMAX, nograd=("m",))
    _, p1 = run_vjp(a, True, x, x=x)
    _, p2 = run_vjp(b, True, x, x=x)
    assert p1 == p2


def test_fuse_false_runs_the_printed_statements():
    x = np.random.default_rng(1).standard_normal((5, 8))
    k = chain(SOFTMAX, nograd=("m",), fuse=False)
    _, plan = run_vjp(k, True, x, x=x)
    assert "de" in {a.name for a in plan.arrays}
