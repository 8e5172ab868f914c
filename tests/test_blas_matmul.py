"""Contractions of two reads as one batched matrix product (blas.Matmul): results equal
np.einsum in float64 for every grouping of the indices (batch, m, k, n, several indices per
group, transposed output orders), odd sizes, strided and transposed inputs, scale factors and
the in-place forms; `:=` results are C-ordered in the left-hand order; torch tensors take
torch's batched gemm (frontends/torch.torch_gemm) forward and backward, and fall back to numpy
where torch cannot view an array."""
import numpy as np
import pytest

from tullio_py import blas, kernel
from tullio_py.parse import parse

R = np.random.default_rng(11)

# statement, einsum of the product, shapes of the two reads (work above blas.MIN_WORK, so no
# loops are compiled)
CASES = {
    "attention_scores": ("s[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d] * scale", "bhid,bhjd->bhij",
                         {"q": (2, 3, 29, 17), "k": (2, 3, 27, 17)}),
    "attention_values": ("o[b,h,i,d] := p[b,h,i,j] * v[b,h,j,d]", "bhij,bhjd->bhid",
                         {"p": (2, 3, 29, 27), "v": (2, 3, 27, 17)}),
    "transposed_out": ("y[k,b,i] := A[b,i,j] * B[b,j,k]", "bij,bjk->kbi",
                       {"A": (5, 23, 31), "B": (5, 31, 29)}),
    "batch_last": ("C[i,k,b] := A[i,j,b] * B[b,j,k]", "ijb,bjk->ikb",
                   {"A": (23, 31, 5), "B": (5, 31, 29)}),
    "grouped": ("y[b,i1,i2,n] := A[b,i1,k1,i2,k2] * B[k2,b,n,k1]", "bxzyw,wbnz->bxyn",
                {"A": (3, 5, 7, 6, 9), "B": (9, 3, 13, 7)}),
    "matrix_vector": ("y[b,i] := A[b,i,j] * x[b,j]", "bij,bj->bi",
                      {"A": (7, 101, 103), "x": (7, 103)}),
    "plain_matmul": ("C[k,i] := A[i,j] * B[j,k]", "ij,jk->ki", {"A": (67, 45), "B": (45, 53)}),
    "dot": ("s := x[i] * y[i] * 2.0", "i,i->", {"x": (70001,), "y": (70001,)}),
}
KERNELS = {name: kernel(expr) for name, (expr, _, _) in CASES.items()}


def _inputs(shapes, dtype, layout):
    out = {}
    for n, s in shapes.items():
        if layout == "strided":         # every axis strided: a slice of a larger array
            big = R.standard_normal(tuple(2 * d for d in s)).astype(dtype)
            a = big[tuple(slice(None, None, 2) for _ in s)]
        elif layout == "transposed":    # axes in reverse memory order
            a = R.standard_normal(s[::-1]).astype(dtype).T
        else:
            a = R.standard_normal(s).astype(dtype)
        if dtype == np.complex128:
            a = a + 1j * R.standard_normal(a.shape)
        out[n] = a
    return out


def _expected(name, arrays, scale):
    expr, spec, shapes = CASES[name]
    a, b = (arrays[n] for n in shapes)
    ref = np.einsum(spec, a.astype(np.complex128 if np.iscomplexobj(a) else np.float64), b)
    return ref * (scale if "scale" in expr else 1) * (2.0 if "2.0" in expr else 1)


@pytest.mark.parametrize("name", list(CASES))
def test_every_grouping_is_one_matmul(name):
    c = blas.contraction(parse(CASES[name][0]))
    assert c is not None and c.matmul is not None


@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_einsum(name, dtype, layout):
    expr, _, shapes = CASES[name]
    arrays = _inputs(shapes, dtype, layout)
    scale = 0.37
    got = KERNELS[name](**arrays, **({"scale": scale} if "scale" in expr else {}))
    ref = _expected(name, arrays, scale)
    tol = 2e-4 if dtype == np.float32 else 1e-10
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())
    if got.ndim:
        assert got.flags.c_contiguous       # the left-hand order, C-ordered


@pytest.mark.parametrize("assign", ["=", "+=", "-="])
def test_in_place_forms_into_a_strided_output(assign):
    k = kernel(f"y[k,b,i] {assign} A[b,i,j] * B[b,j,k] * alpha")
    A, B = R.standard_normal((5, 23, 31)), R.standard_normal((5, 31, 29))
    big = R.standard_normal((29, 10, 23))
    y = big[:, ::2, :]                      # not contiguous: the product is written through it
    old = y.copy()
    k(y=y, A=A, B=B, alpha=-1.5)
    prod = -1.5 * np.einsum("bij,bjk->kbi", A, B)
    ref = {"=": prod, "+=": old + prod, "-=": old - prod}[assign]
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(big[:, 1::2, :], big[:, 1::2, :])


def test_torch_forward_and_backward_match_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    from tullio_py.frontends import torch as frontend
    ran = []
    gemm = frontend.torch_gemm
    monkeypatch.setattr(frontend, "torch_gemm", lambda *a: ran.append(1) or gemm(*a))
    # (torch's BLAS taken whatever this machine measures: gemm_rate.py, test_gemm_rate.py)
    monkeypatch.setattr(frontend, "_TORCH_BLAS", dict.fromkeys(range(1, 65), (2.0, 1.0)))
    _, spec, shapes = CASES["attention_scores"]
    k = KERNELS["attention_scores"]
    for dtype in (torch.float64, torch.float32):
        base = {n: torch.randn(*s, dtype=dtype) for n, s in shapes.items()}
        # a transposed k: its rows are strided, torch views it without copying
        base["k"] = base["k"].transpose(-1, -2).contiguous().transpose(-1, -2)
        mine = {n: t.clone().requires_grad_() for n, t in base.items()}
        ref = {n: t.clone().requires_grad_() for n, t in base.items()}
        y = k(**mine, scale=0.3)
        y_ref = torch.einsum(spec, ref["q"], ref["k"]) * 0.3
        g = torch.randn_like(y_ref)
        y.backward(g)
        y_ref.backward(g)
        tol = 1e-4 if dtype == torch.float32 else 1e-11
        assert y.is_contiguous()
        torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
        for n, t in mine.items():
            torch.testing.assert_close(t.grad, ref[n].grad, rtol=tol, atol=tol)
    assert len(ran) == 6        # per dtype: the forward, dq and dk through torch's gemm


def test_torch_gemm_falls_back_where_torch_cannot_view():
    torch = pytest.importorskip("torch")
    from tullio_py.frontends.torch import torch_gemm
    a, b = R.standard_normal((4, 30, 20)), R.standard_normal((4, 20, 25))
    out = np.empty((4, 30, 25))
    assert not torch_gemm(a[:, ::-1], b, out, 1.0, 0)           # a negative stride
    ro = a.copy()
    ro.flags.writeable = False
    assert not torch_gemm(ro, b, out, 1.0, 0)                   # read-only
    assert not torch_gemm(a.astype(np.float32), b, out, 1.0, 0)  # mixed dtypes
    wide = R.standard_normal((4, 30, 25))
    assert not torch_gemm(wide[:, :, :20], b, wide, 1.0, 0)     # the output overlaps an input
    assert torch_gemm(a, b, out, 2.0, 0)
    np.testing.assert_allclose(out, 2.0 * a @ b, rtol=1e-12)
    acc = out.copy()
    assert torch_gemm(a, b, out, -1.0, 1)
    np.testing.assert_allclose(out, acc - a @ b, rtol=1e-12, atol=1e-12)
    # a kernel call with a read-only numpy operand among torch tensors still runs (numpy)
    q = torch.randn(2, 3, 29, 17, dtype=torch.float64)
    kk = R.standard_normal((2, 3, 27, 17))
    kk.flags.writeable = False
    got = KERNELS["attention_scores"](q=q, k=kk, scale=0.5)
    np.testing.assert_allclose(got.numpy(), 0.5 * np.einsum("bhid,bhjd->bhij", q.numpy(), kk),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_torch_gemm_into_column_major_outputs(batch):
    """torch_gemm into an output whose columns are contiguous (each matrix transposed in
    memory, as a conv1d's output y[b,o,i] is for a product over (i, o)) computes out^T =
    b^T a^T into rows, and into matrices with padded rows through a new block; stored (beta
    0) and added (beta 1), with a batch of operands broadcast (length 1) or not, equal to
    numpy's matmul."""
    pytest.importorskip("torch")
    from tullio_py.frontends.torch import torch_copy, torch_gemm
    a = R.standard_normal(batch + (7, 5))
    b = R.standard_normal(tuple(1 for _ in batch) + (5, 9))
    mem = R.standard_normal(batch + (9, 7))
    out = mem.swapaxes(-1, -2)                     # (..., 7, 9), column-major
    start = out.copy()
    assert torch_gemm(a, b, out, 0.5, 1)
    np.testing.assert_allclose(out, start + 0.5 * (a @ b), rtol=1e-12, atol=1e-12)
    assert torch_gemm(a, b, out, 1.0, 0)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)
    # matrices with padded rows (not one block of memory): stored and added, scaled
    padded = R.standard_normal(batch + (7, 12))[..., 1:10]
    start = padded.copy()
    assert torch_gemm(a, b, padded, -2.0, 1)
    np.testing.assert_allclose(padded, start - 2.0 * (a @ b), rtol=1e-12, atol=1e-12)
    assert torch_gemm(a, b, padded, 0.5, 0)
    np.testing.assert_allclose(padded, 0.5 * (a @ b), rtol=1e-12, atol=1e-12)
    # torch_copy: an overlapping (im2col) view copied, and what it leaves to numpy
    x = R.standard_normal(40)
    col = np.lib.stride_tricks.as_strided(x, (36, 5), (8, 8))
    dst = np.empty((36, 5))
    assert torch_copy(dst, col)
    np.testing.assert_array_equal(dst, col)
    assert not torch_copy(dst, col[::-1])                        # a negative stride
    assert not torch_copy(dst.astype(np.float32), col)           # mixed dtypes
    assert not torch_copy(dst[:, :3], dst[:, 1:4])               # overlapping memory
