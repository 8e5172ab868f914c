"""torch frontend: tensors in/out, autograd (gradcheck against finite differences, and equality
with the numpy path), dtype rules, views, in-place forms, version counters, torch.compile."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tullio_py import kernel  # noqa: E402
from tullio_py.frontends import torch as tf, vjp as vjp_mod  # noqa: E402

G = torch.Generator().manual_seed(7)


def rand(*shape, grad=True, dtype=torch.float64):
    return torch.randn(*shape, generator=G, dtype=dtype).requires_grad_(grad)


def positional(k, names, extra=None):
    """The kernel `k` as a function of its tensors in the order of `names` (the form gradcheck,
    gradgradcheck and torch.func's transforms differentiate), with `extra` keyword arguments."""
    extra = extra or {}
    return lambda *tensors: k(**dict(zip(names, tensors)), **extra)


# expression, inputs (name -> tensor factory), extra non-tensor arguments
CASES = {
    "matmul": ("C[i,k] := A[i,j] * B[j,k]", lambda: dict(A=rand(3, 4), B=rand(4, 5)), {}),
    "local conv": ("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
                   lambda: dict(x=rand(4, 4, 2, 2), W=rand(4, 4, 2, 2, 2, 3)), {}),
    "stride 2": ("y[i] := x[2i+k] * w[k]", lambda: dict(x=rand(9), w=rand(3)), {}),
    "max": ("(max) m[i] := A[i,j] * B[j]", lambda: dict(A=rand(3, 6), B=rand(6)), {}),
    "finaliser": ("n[i] := A[i,j]**2 |> sqrt", lambda: dict(A=rand(3, 4)), {}),
    "gather": ("y[i] := x[J[i]] * w[i]",
               lambda: dict(x=rand(5), w=rand(6), J=torch.tensor([4, 0, 4, 2, 1, 0])), {}),
    "scalar": ("y[i] := c * x[i,j]**2 + x[i,j]", lambda: dict(x=rand(3, 4)), dict(c=1.5)),
    "one no grad": ("C[i,k] := A[i,j] * B[j,k]",
                    lambda: dict(A=rand(3, 4), B=rand(4, 5, grad=False)), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck_and_numpy_path(case):
    expr, make, extra = CASES[case]
    k = kernel(expr)
    inputs = make()
    names = list(inputs)

    f = positional(k, names, extra)
    tensors = [inputs[n] for n in names]
    assert torch.autograd.gradcheck(f, tensors)
    # the same numbers as the numpy path, forward and gradients
    out = f(*tensors)
    np_in = {n: t.detach().numpy() for n, t in inputs.items()}
    ref = k(**np_in, **extra)
    assert torch.equal(out.detach(), torch.from_numpy(ref))
    cot = torch.randn(out.shape, generator=G, dtype=out.dtype)
    grads = torch.autograd.grad(out, [t for t in tensors if t.requires_grad], cot)
    want = [n for n in names if inputs[n].requires_grad]
    ref_grads = k.vjp(cot.numpy(), **np_in, **extra)
    for n, g in zip(want, grads):
        assert torch.equal(g, torch.from_numpy(ref_grads[n])), n


def test_backward_runs_only_the_needed_gradients(monkeypatch):
    k = kernel("y[i] := x[i,j] * w[j]")
    seen = []
    real = vjp_mod.vjp
    monkeypatch.setattr(vjp_mod, "vjp", lambda *a, **kw: seen.append(set(a[3])) or real(*a, **kw))
    x, w = rand(3, 4), rand(4, grad=False)
    y = k(x=x, w=w)
    # only what dx reads (w) is kept alive by the graph, not x
    assert [t.shape for t in y.grad_fn.saved_tensors] == [w.shape]
    y.sum().backward()
    assert seen == [{"x"}] and x.grad is not None and w.grad is None
    seen.clear()
    x2 = rand(3, 4, grad=False)
    w2 = rand(4)
    y = k(x=x2, w=w2)
    (gw,) = torch.autograd.grad(y.sum(), [w2])
    assert seen == [{"w"}]
    assert torch.allclose(gw, x2.detach().sum(0))


def test_views_no_copy_and_strides():
    k = kernel("C[i,k] := A[i,j] * B[j,k]")
    A = torch.randn(8, 6, dtype=torch.float64)[::2, 1:].t()    # (5, 4), no contiguous dim
    B = torch.randn(4, 3, dtype=torch.float64).t().contiguous().t()
    assert not A.is_contiguous()
    assert tf.to_numpy(A).__array_interface__["data"][0] == A.data_ptr()
    C = k(A=A, B=B)
    assert torch.allclose(C, A @ B, atol=1e-12)
    # lazy conj / neg bits are resolved before the loops see the memory
    z = torch.randn(3, 4, dtype=torch.complex128)
    zc = z.conj()
    assert zc.is_conj()
    y = kernel("y[i] := z[i,j]")(z=zc)
    assert torch.allclose(y, z.conj().resolve_conj().sum(1), atol=1e-12)
    n = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(kernel("y[i] := z[i,j]")(z=n), n.sum(1), atol=1e-12)


def test_result_dtype_follows_torch():
    A = torch.randn(3, 4)
    assert kernel("y[i] := A[i,j] * c")(A=A, c=2.0).dtype == torch.float32
    assert kernel("y[i] := I[i] / 2")(I=torch.arange(4)).dtype == torch.get_default_dtype()
    assert kernel("y[i] := A[i,j] * B[j]")(A=A, B=torch.randn(4, dtype=torch.float64)).dtype \
        == torch.float64
    h = torch.randn(3, 4, dtype=torch.float16)
    y = kernel("y[i] := A[i,j]")(A=h)
    assert y.dtype == torch.float16 and torch.allclose(y.float(), h.float().sum(1), atol=1e-2)
    c = torch.tensor(2.0, dtype=torch.float64)           # a 0-d tensor parameter
    assert kernel("y[i] := A[i,j] * c")(A=A, c=c).dtype == torch.float32


def test_no_grad_and_inference_mode_skip_autograd():
    k = kernel("C[i,k] := A[i,j] * B[j,k]")
    A, B = rand(3, 4), rand(4, 5)
    with torch.no_grad():
        assert k(A=A, B=B).grad_fn is None
    with torch.inference_mode():
        assert k(A=A, B=B).grad_fn is None
    assert k(A=A, B=B).grad_fn is not None


def test_double_backward_through_a_clamp_scatter_matches_torch_ops():
    """The gradient statement dx[clamp(i+a-1)] += ... has no ':=' form; under create_graph it
    runs in place into zeros (torch_inplace.py), so it is differentiable once more: the
    second derivatives equal those of the same layer in torch ops (advanced indexing)."""
    k = kernel("y[i] := x[clamp(i+a-1)] * w[a] * z[i]")
    x, w, z = rand(5), rand(3), rand(5)
    idx = (torch.arange(5)[:, None] + torch.arange(3)[None] - 1).clamp(0, 4)

    def second(f):
        (gx,) = torch.autograd.grad(f(x, w, z).pow(2).sum(), [x], create_graph=True)
        return torch.autograd.grad((gx * torch.arange(5.0, dtype=gx.dtype)).sum(), [x, w, z])
    got = second(lambda x, w, z: k(x=x, w=w, z=z))
    want = second(lambda x, w, z: (x[idx] * w).sum(1) * z)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


def test_mutation_after_forward_is_caught():
    k = kernel("C[i,k] := A[i,j] * B[j,k]")
    A, B = rand(3, 4), rand(4, 5)
    C = k(A=A, B=B)
    with torch.no_grad():
        B.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        C.sum().backward()


def test_in_place_writes_tensor_memory():
    k = kernel("C[i,k] += A[i,j] * B[j,k]")
    A, B = torch.randn(3, 4), torch.randn(4, 5)
    base = torch.ones(5, 3)
    C = base.t()                                    # a non-contiguous output
    v = C._version
    assert k(C=C, A=A, B=B) is C
    assert torch.allclose(base.t(), 1 + A @ B, atol=1e-5) and C._version > v
    A.requires_grad_()
    k(C=C, A=A, B=B)          # differentiable in place (tests/test_torch_ad.py checks gradients)
    C.sum().backward()
    assert torch.allclose(A.grad, torch.ones(3, 5) @ B.t(), atol=1e-5)
    with torch.no_grad():                           # e.g. a parameter update
        k(C=C, A=A, B=B)


def test_cuda_tensors():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.randn(9, device="cuda")
    w = torch.randn(3, device="cuda")
    y = kernel("y[i] := x[2i+k] * w[k]")(x=x, w=w)
    assert y.is_cuda
    ref = kernel("y[i] := x[2i+k] * w[k]")(x=x.cpu(), w=w.cpu())
    assert torch.allclose(y.cpu(), ref, atol=1e-5)


def test_torch_compile_fullgraph():
    """One small kernel through torch.compile, forward and backward, in one graph."""
    k = kernel("y[i] := x[2i+k] * w[k]")

    def f(x, w):
        return (k(x=x, w=w).sin() * 2.0).sum()

    x, w = rand(11), rand(3)
    for _ in range(2):      # remembered numpy calls: traced through the kernel's own __call__
        k(x=x.detach().numpy(), w=w.detach().numpy())
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    r = cf(x, w)
    r.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    r2 = f(x, w)
    r2.backward()
    assert torch.equal(r, r2) and torch.equal(gx, x.grad) and torch.equal(gw, w.grad)


def test_complex_gradcheck():
    k = kernel("y[i] := z[i,j] * w[j]")
    z, w = rand(3, 4, dtype=torch.complex128), rand(4, dtype=torch.complex128)
    assert torch.autograd.gradcheck(lambda z, w: k(z=z, w=w), (z, w))


def test_parameter_requiring_grad_gets_its_gradient():
    """A 0-d tensor read as a scalar parameter is differentiable (tests/test_torch_ad.py checks
    the values with gradcheck); under no_grad it is a plain constant."""
    x = rand(2, 3)
    c = torch.tensor(2.0, requires_grad=True, dtype=torch.float64)
    y = kernel("y[i] := c * x[i,j]")(x=x, c=c)
    y.sum().backward()
    assert torch.allclose(c.grad, x.detach().sum())
    with torch.no_grad():
        assert kernel("y[i] := c * x[i,j]")(x=x, c=c).grad_fn is None


def test_compile_falls_back_where_shapes_depend_on_values():
    from tullio_py.frontends import torch_ops
    assert torch_ops._static_shape(kernel("y[i] := x[J[i]] * w[i]"))
    assert not torch_ops._static_shape(kernel("H[J[i]] := x[i]"))
    assert not torch_ops._static_shape(kernel("y[i] := x[J[i]+k] * w[k]"))
