"""The printed gradient equations: run through tullio() into zeroed arrays they give vjp's
numbers exactly; vjp matches finite differences; no equation keeps a shifted left-hand side."""
import numpy as np
import pytest

from tullio_py import kernel, tullio
from tullio_py.ir import Affine

from test_grad import finite_difference

RNG = np.random.default_rng(2)


def r(*shape):
    return RNG.standard_normal(shape)


def c(*shape):
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


TABLE = [
    ("local convolution", "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]", {},
     dict(x=r(5, 5, 2, 2), W=r(5, 5, 3, 3, 2, 2))),
    ("stride-2 convolution", "y[i] := x[2i+k] * w[k]", {}, dict(x=r(11), w=r(3))),
    ("dilated convolution", "y[i] := x[i+2k] * w[k]", {}, dict(x=r(10), w=r(3))),
    ("full convolution as a scatter", "y[i+j] := x[i] * h[j]", {}, dict(x=r(6), h=r(3))),
    ("2-D convolution with pad", "y[i,j] := x[pad(i+a-1,1,1), pad(j+b-1,1,1)] * w[a,b]", {},
     dict(x=r(4, 5), w=r(3, 3))),
    ("max-pool", "(max) y[i] := x[2i+k]", {"ranges": {"k": 2}}, dict(x=r(11))),
    ("batched matmul, permuted batch", "C[b,i,k] := A[i,j,b] * B[j,b,k]", {},
     dict(A=r(3, 4, 2), B=r(4, 2, 3))),
    ("ranges= on a shifted index", "y[i] := x[i+k] * w[k]", {"ranges": {"i": 3}},
     dict(x=r(8), w=r(3))),
    ("max over two indices", "(max) m[i] := A[i,j,k] * w[k]", {}, dict(A=r(3, 4, 2), w=r(2))),
    ("finaliser", "n[i] := A[i,j]**2 |> sqrt", {}, dict(A=r(3, 4))),
    # a term without j and k is still summed over them: dx carries the factor len_j * len_k
    ("indices lost from a term", "y[i] := x[i]**2 + w[j]*v[k]", {},
     dict(x=r(3), w=r(4), v=r(5))),
    ("scalar output, lost index", "s := x[i] + w[j]", {}, dict(x=r(3), w=r(4))),
    # complex statements reading real inputs: their gradients are printed as real(...)
    ("complex matmul, real input", "C[i,k] := A[i,j] * Z[j,k]", {}, dict(A=r(2, 3), Z=c(3, 2))),
    ("real output of complex input", "y[i] := abs(z[i,j])**2 * x[j] + real(z[i,j] * x[j])",
     {}, dict(z=c(2, 3), x=r(3))),
    ("max of abs, real weight", "(max) m[i] := abs(z[i,j]) * x[j]", {},
     dict(z=c(2, 3), x=np.abs(r(3)) + 0.5)),
]


def run_printed(k, cot, arrays, out):
    """Run k.gradient_equations with tullio() and no options, into zero-initialised arrays."""
    eq = k.equation
    result = {}
    for name, lines in k.gradient_equations.items():
        ns = {**arrays, "d" + eq.output: cot, eq.output: out, "d" + name: np.zeros_like(arrays[name])}
        run_statements(lines, ns)
        result[name] = ns["d" + name]
    return result


def run_statements(lines, ns: dict) -> dict:
    """Run printed statements in order with tullio() and no options, reading and writing the
    arrays of `ns` (a `:=` statement adds its result to it)."""
    for line in lines:
        e = kernel(line).equation
        reads = {n: ns[n] for n in (*e.arrays, *e.params)}
        if e.assign == ":=":
            ns[e.output] = tullio(line, **reads)
        else:
            tullio(line, **{e.output: ns[e.output]}, **reads)
    return ns


@pytest.mark.filterwarnings("ignore::tullio_py.errors.SummationWarning")
@pytest.mark.parametrize("title,expr,options,arrays", TABLE, ids=[t[0] for t in TABLE])
def test_printed_equations_reproduce_vjp(title, expr, options, arrays):
    k = kernel(expr, **options)
    out = k(**arrays)
    cot = r(*out.shape) + (1j * r(*out.shape) if out.dtype.kind == "c" else 0)
    grads = k.vjp(cot, **arrays)
    assert set(grads) == set(arrays)
    for name, g in grads.items():
        ref = finite_difference(k, arrays, name, cot)
        assert np.abs(g - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1e-12), (name, g, ref)
    printed = run_printed(k, cot, arrays, out)
    one_by_one = kernel(expr, fuse=False, **options).vjp(cot, **arrays)
    for name in grads:
        # one kernel per statement: the printed statements' own loops, bit for bit; the fused
        # default sums in another order where statements share a loop nest
        np.testing.assert_array_equal(printed[name], one_by_one[name], err_msg=f"{title}: d{name}")
        np.testing.assert_allclose(printed[name], grads[name], rtol=1e-13,
                                   atol=1e-13 * np.abs(grads[name]).max(), err_msg=title)
    # no shifted or gathered left-hand side once the rewrite applies
    for name, lines in k.gradient_equations.items():
        for line in lines:
            lhs = kernel(line).equation.lhs
            assert all(isinstance(s, Affine) and (s.is_bare or not s.terms) for s in lhs.indices), line
    assert "def _tullio_kernel" in k.gradient_code or "def _tullio_fused" in k.gradient_code


def test_local_convolution_equations_read_well():
    fresh = kernel("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]", verbose=0, pad=0)
    if fresh._gradient()._last is None:     # before any call: the mask on s is implied too
        assert fresh.gradient_equations["x"] == [
            "dx[p, q, c1, b] += dout[pad(p-i), pad(q-j), c2, b] * W[p, q, i, j, c1, c2]"]
    k = kernel("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]")
    x, W = r(5, 5, 2, 2), r(5, 5, 3, 3, 2, 2)
    k.vjp(r(3, 3, 2, 2), x=x, W=W)
    assert k.gradient_equations["x"] == [
        "dx[p, q, c1, b] += dout[pad(p-i), pad(q-j), c2, b] * W[p, q, i, j, c1, c2]"]
    assert "threads" in k.gradient_code or "range" in k.gradient_code


def test_softmax_as_two_statements():
    """y = exp(x) / s with s = sum_j exp(x): the chained vjps match finite differences, and the
    printed equations of both statements reproduce them."""
    x = r(3, 4)
    k1 = kernel("s[i] := exp(x[i,j])")
    k2 = kernel("y[i,j] := exp(x[i,j]) / s[i]")

    def softmax(x):
        return k2(x=x, s=k1(x=x))
    s = k1(x=x)
    y = k2(x=x, s=s)
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-12)
    dy = r(3, 4)
    g2 = k2.vjp(dy, x=x, s=s)
    g1 = k1.vjp(g2["s"], x=x)
    dx = g2["x"] + g1["x"]
    np.testing.assert_allclose(dx, finite_difference(softmax, dict(x=x), "x", dy), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(dx, y * (dy - (dy * y).sum(1, keepdims=True)), rtol=1e-10)
    p2 = run_printed(k2, dy, dict(x=x, s=s), y)
    p1 = run_printed(k1, g2["s"], dict(x=x), s)
    np.testing.assert_array_equal(p2["x"] + p1["x"], dx)


@pytest.mark.parametrize("expr,want", [
    ("e[i,j] := exp(x[i,j] - m[i]) * (j <= i + 1)",
     ["de[i, j] * e[i, j] * (j <= i + 1)", "de[i, j] * -e[i, j] * (j <= i + 1)"]),
    ("s[i] := exp(x[i,j] - m[i])",
     ["ds[i] * exp(x[i, j] - m[i])", "ds[i] * -exp(x[i, j] - m[i])"]),
], ids=["elementwise", "reduction"])
def test_a_partial_equal_to_the_body_reads_the_output(expr, want):
    """Each element of an elementwise ':=' output is the body at one tuple, so a partial that
    is the whole body reads the output (no exp computed again); a reduction's output is a sum,
    so its gradients keep the body.  Against numpy, with and without the output passed."""
    x, m = r(5, 12)[:, ::2], r(5)
    k = kernel(expr)
    out = k(x=x, m=m)
    cot = r(*np.shape(out))
    g = k.vjp(cot, x=x, m=m)
    assert [eq.split(" += ")[1] for eq in k.gradient_equations["x"] + k.gradient_equations["m"]] \
        == want
    mask = np.tril(np.ones((5, 6)), 1) if "<=" in expr else 1.0
    wide = cot if np.ndim(cot) == 2 else cot[:, None]
    dx = wide * np.exp(x - m[:, None]) * mask
    np.testing.assert_allclose(g["x"], dx, rtol=1e-12)
    np.testing.assert_allclose(g["m"], -dx.sum(1), rtol=1e-12)
    given = k.vjp(cot, x=x, m=m, **{k.equation.output: out})
    np.testing.assert_array_equal(given["x"], g["x"])
    np.testing.assert_array_equal(run_printed(k, cot, dict(x=x, m=m), out)["x"], g["x"])
