"""Causal attention in six statements (as benchmarks/bench_layers.py writes it): forward and
backward through torch autograd against torch's own formulation in float64, on odd sizes and
strided inputs; the exponential's gradient reads the statement's output (grad.py: a partial
that contains the whole body of an elementwise statement) and equals the recomputed one, its
printed equations reproduce the vjp, and torch.autograd.gradcheck passes on the statement."""
import numpy as np
import pytest

from tullio_py import kernel, tullio

torch = pytest.importorskip("torch")

ATT_S = kernel("s[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d] * scale")
ATT_M = kernel("(max) m[b,h,i] := s[b,h,i,j] * (j <= i)")
ATT_E = kernel("e[b,h,i,j] := exp(s[b,h,i,j] - m[b,h,i]) * (j <= i)")
ATT_Z = kernel("z[b,h,i] := e[b,h,i,j]")
ATT_P = kernel("p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]")
ATT_O = kernel("o[b,h,i,d] := p[b,h,i,j] * v[b,h,j,d]")
# the same six statements as one chain (chain.py): one autograd node, the four softmax
# statements one pass over blocks of rows, forward and backward
ATT = kernel("""s[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d] * scale
                (max) m[b,h,i] := s[b,h,i,j] * (j <= i)
                e[b,h,i,j] := exp(s[b,h,i,j] - m[b,h,i]) * (j <= i)
                z[b,h,i] := e[b,h,i,j]
                p[b,h,i,j] := e[b,h,i,j] / z[b,h,i]
                o[b,h,i,d] := p[b,h,i,j] * v[b,h,j,d]""", nograd=("m",))


def attention(q, k, v, scale):
    s = ATT_S(q=q, k=k, scale=scale)
    e = ATT_E(s=s, m=ATT_M(s=s).detach())
    return ATT_O(p=ATT_P(e=e, z=ATT_Z(e=e)), v=v)


def reference(q, k, v, scale):
    T = q.shape[2]
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.einsum("bhij,bhjd->bhid", s.masked_fill(mask, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("shape,layout", [((2, 3, 37, 29), "contiguous"),
                                          ((2, 3, 37, 29), "strided"),
                                          ((1, 2, 64, 16), "transposed")])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_attention_forward_and_backward(shape, layout, dtype):
    gen = torch.Generator().manual_seed(3)
    B, H, T, D = shape

    def make():
        if layout == "strided":         # every other row and column of a larger tensor
            return torch.randn(B, H, 2 * T, 2 * D, generator=gen, dtype=torch.float64)[
                :, :, ::2, 1::2]
        if layout == "transposed":      # d outer in memory
            return torch.randn(B, H, D, T, generator=gen, dtype=torch.float64).transpose(2, 3)
        return torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    base = {n: make() for n in "qkv"}
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    scale = 1 / D ** 0.5
    mine = {n: t.detach().clone().to(dtype).requires_grad_() for n, t in base.items()}
    ref = {n: t.detach().clone().requires_grad_() for n, t in base.items()}
    y = attention(mine["q"], mine["k"], mine["v"], scale)
    y.backward(g.to(dtype))
    y_ref = reference(ref["q"], ref["k"], ref["v"], scale)
    y_ref.backward(g)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
    for n, t in mine.items():
        torch.testing.assert_close(t.grad.double(), ref[n].grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_attention_as_one_chain(dtype):
    """The chain against torch in float64.  Its softmax statements run as one row group
    although a member's loops collapse (h, b) into one parallel loop (vjp_rows: a collapsed
    loop's bounds are the block's), forward and backward; the gradients BLAS writes whole
    (dp, dv, dq, dk) are gemms into unzeroed arrays (chain_grad: vjp_written.whole_blas); de is
    inlined into its one reader (vjp_inline.py)."""
    gen = torch.Generator().manual_seed(4)
    B, H, T, D = 2, 3, 37, 29
    base = {n: torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for n in "qkv"}
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    mine = {n: t.clone().to(dtype).requires_grad_() for n, t in base.items()}
    ref = {n: t.clone().requires_grad_() for n, t in base.items()}
    y = ATT(**mine, scale=1 / D ** 0.5)
    y.backward(g.to(dtype))
    assert ATT.last_groups == ((0,), (1, 2, 3, 4), (5,))
    plan = ATT.gradient_plan
    assert [s.kind for s in plan.steps] == ["blas", "blas", "rows", "blas", "blas"]
    assert {a.name for a in plan.arrays if a.written} == {"dp", "dv", "dq", "dk"}
    # de, written element by element and read once, is computed where ds reads it
    assert "de" not in {a.name for a in plan.arrays}
    y_ref = reference(ref["q"], ref["k"], ref["v"], 1 / D ** 0.5)
    y_ref.backward(g)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
    for n, t in mine.items():
        torch.testing.assert_close(t.grad.double(), ref[n].grad, rtol=tol, atol=tol)


def test_exp_gradient_reads_the_output():
    """ds = de * e * (j <= i): the same values as de * exp(s - m) recomputed, numpy in and
    out; the printed equations run with tullio() reproduce the vjp."""
    R = np.random.default_rng(5)
    s, m = R.standard_normal((2, 3, 11, 11)), R.standard_normal((2, 3, 11))
    assert ATT_E.gradient_equations["s"] == [
        "ds[b, h, i, j] += de[b, h, i, j] * e[b, h, i, j] * (j <= i)"]
    e = ATT_E(s=s, m=m)
    de = R.standard_normal(e.shape)
    got = ATT_E.vjp(de, s=s, m=m)
    want = de * np.exp(s - m[..., None]) * np.tril(np.ones((11, 11)))
    np.testing.assert_allclose(got["s"], want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(got["m"], -want.sum(-1), rtol=1e-12, atol=1e-12)
    for name, x in (("s", s), ("m", m)):
        dx = np.zeros_like(x)
        for eq in ATT_E.gradient_equations[name]:
            tullio(eq, e=e, de=de, **{"d" + name: dx})
        np.testing.assert_allclose(dx, got[name], rtol=1e-13, atol=1e-13)   # (sum order)


def test_exp_statement_gradcheck():
    gen = torch.Generator().manual_seed(8)
    s = torch.randn(1, 2, 5, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    m = torch.randn(1, 2, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, m: ATT_E(s=s, m=m), (s, m))
