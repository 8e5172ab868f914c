"""torch.func transforms and forward mode through tullio_py kernels (frontends/torch_autograd.py):
vmap (a batched statement, compiled), jacrev, torch.func.grad, jvp, jacfwd, forward_ad.
Every result is checked against the same layer written in torch ops, a Python loop, or finite
differences."""
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402
from torch.func import grad, jacfwd, jacrev, jvp, vmap  # noqa: E402

from test_torch import positional  # noqa: E402

from tullio_py import kernel  # noqa: E402

F64 = torch.float64
MM = kernel("C[i,k] := A[i,j] * B[j,k]")
CONV = kernel("y[i,c2] := x[2i+a,c1] * w[a,c1,c2]")        # stride-2 1-d convolution
SCALE = kernel("y[i] := s * x[i]")


def mm(a, b):
    return MM(A=a, B=b)


def mm_ref(a, b):
    return a @ b


def conv(x, w):
    return CONV(x=x, w=w)


def conv_ref(x, w):
    # y[i,c2] = sum_{a,c1} x[2i+a,c1] w[a,c1,c2]; x has 2*n+1 rows for a of size 3 (n = rows of y)
    n = (x.shape[0] - w.shape[0]) // 2 + 1
    win = torch.stack([x[2 * i:2 * i + w.shape[0]] for i in range(n)])     # (i, a, c1)
    return torch.einsum("iac,acd->id", win, w)


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, dtype=F64, generator=g)


LAYERS = {"matmul": (mm, mm_ref, lambda: (rand(3, 4), rand(4, 5, seed=1))),
          "conv_stride2": (conv, conv_ref, lambda: (rand(9, 2), rand(3, 2, 3, seed=1)))}


# ----------------------------------------------------------------------------- vmap
@pytest.mark.parametrize("dims", [(0, None), (None, 1), (0, 0), (2, 0)])
def test_vmap_matches_a_loop(dims):
    a, b = rand(3, 4), rand(4, 5, seed=1)
    batch = 4
    args = [torch.stack([x + k for k in range(batch)], d) if d is not None else x
            for x, d in zip((a, b), dims)]
    got = vmap(mm, in_dims=dims)(*args)
    pick = [(lambda x, d: (lambda k: x.select(d, k)))(x, d) if d is not None
            else (lambda x: (lambda k: x))(x) for x, d in zip(args, dims)]
    loop = torch.stack([mm(*[p(k) for p in pick]) for k in range(batch)])
    ref = torch.stack([mm_ref(*[p(k) for p in pick]) for k in range(batch)])
    torch.testing.assert_close(got, loop)
    torch.testing.assert_close(got, ref)


def test_vmap_of_vmap_and_of_a_scalar_parameter():
    xs, ss = rand(2, 3, 5), rand(2, 3, seed=2)
    got = vmap(vmap(lambda s, x: SCALE(s=s, x=x)))(ss, xs)
    torch.testing.assert_close(got, ss[..., None] * xs)


# ----------------------------------------------------------------------------- reverse mode
@pytest.mark.parametrize("jac", [jacrev, jacfwd], ids=["jacrev", "jacfwd"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_jacobian_matches_torch(name, jac):
    """jacrev (reverse mode, the vmap rule of the gradient) and jacfwd (forward mode)."""
    f, ref, make = LAYERS[name]
    args = make()
    got = jac(f, argnums=(0, 1))(*args)
    want = torch.autograd.functional.jacobian(ref, args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", list(LAYERS))
def test_func_grad_and_per_example_grads(name):
    f, ref, make = LAYERS[name]
    a, b = make()

    def loss(fn):
        return lambda x, w: fn(x, w).sin().sum()
    for g, w in zip(grad(loss(f), argnums=(0, 1))(a, b), grad(loss(ref), argnums=(0, 1))(a, b)):
        torch.testing.assert_close(g, w)
    xs = torch.stack([a, a * 2, a - 1])
    got = vmap(grad(loss(f), argnums=1), in_dims=(0, None))(xs, b)
    want = torch.stack([grad(loss(ref), argnums=1)(x, b) for x in xs])
    torch.testing.assert_close(got, want)


def test_grad_of_a_vmapped_layer():
    a, b = rand(3, 4), rand(4, 5, seed=1)
    xs = torch.stack([a, a * 2])

    def loss(fn):
        return lambda w: vmap(fn, in_dims=(0, None))(xs, w).cos().sum()
    torch.testing.assert_close(grad(loss(mm))(b), grad(loss(mm_ref))(b))


# ----------------------------------------------------------------------------- forward mode
@pytest.mark.parametrize("name", list(LAYERS))
def test_jvp_matches_torch_and_finite_differences(name):
    f, ref, make = LAYERS[name]
    args = make()
    tangents = (rand(*args[0].shape, seed=5), rand(*args[1].shape, seed=6))
    out, tan = jvp(f, args, tangents)
    want_out, want_tan = jvp(ref, args, tangents)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(tan, want_tan)
    eps = 1e-6
    plus = f(*[x + eps * t for x, t in zip(args, tangents)])
    minus = f(*[x - eps * t for x, t in zip(args, tangents)])
    torch.testing.assert_close(tan, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)


def test_forward_ad_dual_tensors():
    a, b = rand(3, 4), rand(4, 5, seed=1)
    ta = rand(3, 4, seed=7)
    with fwAD.dual_level():
        out = mm(fwAD.make_dual(a, ta), b)
        tangent = fwAD.unpack_dual(out).tangent
    torch.testing.assert_close(tangent, ta @ b)


# ----------------------------------------------------------------------------- 0-d parameters
SCALED_CONV = kernel("y[i] := s * x[i+a] * w[a] |> sqrt")


def test_scalar_parameter_gradcheck():
    s = torch.tensor(1.5, dtype=F64, requires_grad=True)
    x = rand(5).requires_grad_()
    assert torch.autograd.gradcheck(lambda s, x: SCALE(s=s, x=x), (s, x), check_forward_ad=True)
    y = SCALE(s=s, x=x)
    (gs,) = torch.autograd.grad((y * torch.arange(5.0, dtype=F64)).sum(), [s])
    torch.testing.assert_close(gs, (x.detach() * torch.arange(5.0, dtype=F64)).sum())


@pytest.mark.parametrize("which", ["s", "sxw"])
def test_scalar_parameter_with_a_finaliser_gradcheck(which):
    s = torch.tensor(0.7, dtype=F64)
    x, w = rand(7).abs() + 0.5, rand(3, seed=3).abs() + 0.5
    args = [t.requires_grad_(n in which) for n, t in zip("sxw", (s, x, w))]
    assert torch.autograd.gradcheck(lambda s, x, w: SCALED_CONV(s=s, x=x, w=w), args,
                                    check_forward_ad=True)


def test_scalar_parameter_under_torch_compile():
    def f(s, x):
        return (SCALE(s=s, x=x).sin()).sum()
    s = torch.tensor(1.5, dtype=F64, requires_grad=True)
    x = rand(5).requires_grad_()
    r = torch.compile(f, fullgraph=True, backend="aot_eager")(s, x)
    (gs, gx) = torch.autograd.grad(r, [s, x])
    ws, wx = torch.autograd.grad((s * x).sin().sum(), [s, x])
    torch.testing.assert_close(gs, ws)
    torch.testing.assert_close(gx, wx)


def test_per_example_gradient_of_a_scalar_parameter():
    xs, s = rand(3, 5), torch.tensor(0.3, dtype=F64)
    got = vmap(grad(lambda s, x: SCALE(s=s, x=x).sin().sum()), in_dims=(None, 0))(s, xs)
    want = torch.stack([grad(lambda s, x: (s * x).sin().sum())(s, x) for x in xs])
    torch.testing.assert_close(got, want)


# ----------------------------------------------------------------------------- double backward
def _pos(*shape, seed=0):
    return rand(*shape, seed=seed).abs() + 0.3


SECOND = {
    "matmul": ("C[i,k] := A[i,j] * B[j,k]", lambda: dict(A=rand(2, 3), B=rand(3, 2, seed=1)), {}),
    "local_conv": ("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
                   lambda: dict(x=rand(3, 3, 1, 1), W=rand(3, 3, 2, 2, 1, 2, seed=1)), {}),
    "conv_stride2": ("y[i] := x[2i+a] * w[a]", lambda: dict(x=rand(7), w=rand(3, seed=1)), {}),
    "max": ("(max) y[i] := x[i,j]", lambda: dict(x=rand(2, 3)), {}),
    "sqrt_finaliser": ("y[i] := x[i,j] * x[i,j] |> sqrt", lambda: dict(x=_pos(2, 3)), {}),
    "gather": ("y[i] := x[J[i]] * w[i]", lambda: dict(x=rand(5), w=rand(3, seed=1)),
               {"J": torch.tensor([0, 2, 2])}),
    "scale": ("y[i] := s * x[i]", lambda: dict(s=torch.tensor(1.3, dtype=F64), x=rand(3)), {}),
    "prod": ("(*) y[i] := x[i,j]", lambda: dict(x=_pos(2, 3)), {}),
    "clamp": ("y[i] := x[clamp(i+a-1)] * w[a] * z[i]",
              lambda: dict(x=rand(5), w=rand(3, seed=1), z=rand(5, seed=2)), {}),
    "prod_with_zeros": ("(*) y[i] := x[i,j]",
                        lambda: dict(x=torch.tensor([[0., 1, 2], [0, 0, 3], [1, 2, 3]],
                                                    dtype=F64)), {}),
    "prod_with_zeros_finaliser": ("(*) y[i] := x[i,j] * w[j] |> sin",
                                  lambda: dict(x=torch.tensor([[0., 1, 2], [0, 0, 3], [1, 2, 3]],
                                                              dtype=F64),
                                               w=torch.tensor([0.5, 0, 2], dtype=F64)), {}),
}


@pytest.mark.parametrize("name", list(SECOND))
def test_gradcheck_and_gradgradcheck(name):
    text, make, extra = SECOND[name]
    k = kernel(text)
    values = make()
    names = list(values)
    args = [v.requires_grad_() for v in values.values()]
    f = positional(k, names, extra)
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_third_derivative_through_a_scatter():
    """The clamp gradient's scatter runs as a kernel and index_add (torch_higher._scatter), so
    its gradient is differentiable again: gradgradcheck of the first gradient checks the
    third derivatives against finite differences."""
    text, make, _ = SECOND["clamp"]
    k = kernel(text)
    args = [v.requires_grad_() for v in make().values()]

    def first(x, w, z):
        return torch.autograd.grad(k(x=x, w=w, z=z).pow(2).sum(), [x], create_graph=True)[0]
    assert torch.autograd.gradgradcheck(first, args)


def test_hessian_vector_product_matches_torch():
    """Double backward of a layer written in torch ops gives the same Hessian-vector product."""
    x, w = rand(7), rand(3, seed=1)
    v = rand(7, seed=4)

    def loss(fn):
        return lambda x, w: fn(x, w).sin().sum()
    conv_k = kernel("y[i] := x[2i+a] * w[a]")

    def conv1(x, w):
        return conv_k(x=x, w=w)

    def conv1_ref(x, w):
        return torch.stack([x[2 * i:2 * i + 3] @ w for i in range(3)])
    got = torch.func.jvp(grad(loss(conv1)), (x, w), (v, torch.zeros(3, dtype=F64)))[1]
    xs = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(loss(conv1_ref)(xs, w), [xs], create_graph=True)
    (want,) = torch.autograd.grad(g, [xs], v)
    torch.testing.assert_close(got, want)


# ----------------------------------------------------------------------------- reverse over forward
def _local_conv_ref(x, W):
    """out[s,t,c2,b] = sum x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2], window by window."""
    n, m = x.shape[0] - W.shape[2] + 1, W.shape[2]

    def window(s, t):
        w = torch.stack([torch.stack([W[s + i, t + j, i, j] for j in range(m)])
                         for i in range(m)])                               # (i, j, c1, c2)
        return torch.einsum("ijcb,ijcd->db", x[s:s + m, t:t + m], w)
    return torch.stack([torch.stack([window(s, t) for t in range(n)]) for s in range(n)])


OUTER = {"matmul": (lambda a, b: a @ b), "local_conv": _local_conv_ref}


@pytest.mark.parametrize("name,outer", [("matmul", "jacrev(jacfwd)"), ("matmul", "hessian"),
                                        ("local_conv", "hessian")])
def test_second_order_transforms_match_torch(name, outer):
    """Reverse over forward (jacrev of jacfwd: the tangent statements run as kernels, so the
    tangent is differentiable) and torch.func.hessian (forward over reverse), against the
    same layer in torch ops (the local convolution's reverse over forward: the gradcheck
    below, which compiles fewer batched kernels)."""
    text, make, _ = SECOND[name]
    k = kernel(text)
    values = make()
    names = list(values)

    def loss(fn):
        return lambda a, b: fn(a, b).sin().sum()
    mine = loss(positional(k, names))
    ref = loss(OUTER[name])
    if outer == "hessian":
        T = lambda f: torch.func.hessian(f, argnums=(0, 1))                  # noqa: E731
    else:
        T = lambda f: jacrev(jacfwd(f, argnums=(0, 1)), argnums=(0, 1))      # noqa: E731
    got, want = T(mine)(*values.values()), T(ref)(*values.values())
    for i in range(2):
        for j in range(2):
            torch.testing.assert_close(got[i][j], want[i][j])


@pytest.mark.parametrize("name", ["matmul", "local_conv", "sqrt_finaliser", "prod_with_zeros",
                                  "clamp"])
def test_reverse_over_forward_gradcheck(name):
    """The tangent (forward_ad) as a function of the inputs and their tangents, differentiated
    by backward and checked against finite differences: exact at zeros of (*) (the product
    of the other factors) and through the clamp scatter too."""
    text, make, extra = SECOND[name]
    k = kernel(text)
    values = make()
    names, n = list(values), len(values)

    def tangent(*a):
        with fwAD.dual_level():
            out = k(**{m: fwAD.make_dual(x, t) for m, x, t in zip(names, a[:n], a[n:])}, **extra)
            return fwAD.unpack_dual(out).tangent
    args = [v.requires_grad_() for v in values.values()]
    args += [rand(*v.shape, seed=9).requires_grad_() for v in values.values()]
    assert torch.autograd.gradcheck(tangent, args)


@pytest.mark.parametrize("outer", ["jacrev(jacfwd)", "hessian", "jacrev(jacrev)"])
def test_clamp_second_order_under_torch_func(outer):
    """The clamp read's tangent reads through clamp on the right, its gradient scatters
    through clamp on the left (a kernel and index_add): every second-order composition of
    torch.func matches the layer written with advanced indexing."""
    text, make, _ = SECOND["clamp"]
    k = kernel(text)
    x, w, z = make().values()
    idx = (torch.arange(5)[:, None] + torch.arange(3)[None] - 1).clamp(0, 4)
    f = lambda x, w: k(x=x, w=w, z=z).sin().sum()                    # noqa: E731
    ref = lambda x, w: ((x[idx] * w).sum(1) * z).sin().sum()         # noqa: E731
    T = {"jacrev(jacfwd)": lambda g: jacrev(jacfwd(g, argnums=(0, 1)), argnums=(0, 1)),
         "hessian": lambda g: torch.func.hessian(g, argnums=(0, 1)),
         "jacrev(jacrev)": lambda g: jacrev(jacrev(g, argnums=(0, 1)), argnums=(0, 1))}[outer]
    got, want = T(f)(x, w), T(ref)(x, w)
    for i in range(2):
        for j in range(2):
            torch.testing.assert_close(got[i][j], want[i][j])


# ----------------------------------------------------------------------------- in place
ADD = kernel("y[i] += x[i,j] * w[j]")
SUB = kernel("y[i] -= x[i,j] * w[j]")
SET_READ = kernel("y[2i] = x[i] * y[2i+1]")      # '=' reading other elements of its output
SET_PART = kernel("y[i+1] = x[i] * x[i]")         # '=' writing part of its output
ON_Y = kernel("C[i] := A[i,j] * y[j]")
MUL = kernel("y[i] *= x[i,j] * w[j]")
MUL_OWN = kernel("y[i] *= y[i] * x[i,j]")       # '*=' reading its own old value


def _updated(k, y0, **arrays):
    y = y0 * 1.0                                  # not a leaf: in place is allowed
    k(y=y, **arrays)
    return y


@pytest.mark.parametrize("op", ["add", "sub"])
def test_in_place_update_gradcheck(op):
    k, sign = (ADD, 1.0) if op == "add" else (SUB, -1.0)
    args = [rand(3).requires_grad_(), rand(3, 4, seed=1).requires_grad_(),
            rand(4, seed=2).requires_grad_()]

    def f(y0, x, w):
        return _updated(k, y0, x=x, w=w)
    torch.testing.assert_close(f(*args), args[0] + sign * args[1] @ args[2])
    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("which", ["read", "part"])
def test_in_place_assignment_gradcheck(which):
    """'=' zeroes the old value's gradient on the elements it writes, except through what the
    right side reads (checked by finite differences)."""
    y0, x = rand(6).requires_grad_(), rand(3, seed=3).requires_grad_()
    want = y0.detach().clone()
    if which == "read":
        def f(y0, x):
            return _updated(SET_READ, y0, x=x)
        want[0::2] = x.detach() * want[1::2]
    else:
        def f(y0, x):
            return _updated(SET_PART, y0, x=x)
        want[1:4] = x.detach() ** 2
    torch.testing.assert_close(f(y0, x), want)
    assert torch.autograd.gradcheck(f, (y0, x))


def _zeros_data():
    y0 = torch.tensor([0., 1.5, -2, 0.5], dtype=F64)
    x = torch.tensor([[0., 1, 2], [0, 0, 3], [1, 2, 3], [0.5, -1, 2]], dtype=F64)
    return y0, x


@pytest.mark.parametrize("w", [[0.5, 0, 2], [0.5, 1.1, 2]], ids=["zero_w", "nonzero_w"])
def test_in_place_multiply_gradcheck_with_zeros(w):
    """y *= prod_j x[i,j]*w[j]: the old value's gradient is the factor, the inputs' reads the
    old value; exact with zeros in the old value, in x (one and two per row) and in w."""
    y0, x = _zeros_data()
    args = [y0.requires_grad_(), x.requires_grad_(), torch.tensor(w, dtype=F64).requires_grad_()]

    def f(y0, x, w):
        return _updated(MUL, y0, x=x, w=w)
    torch.testing.assert_close(f(*args), args[0] * (args[1] * args[2]).prod(1))
    assert torch.autograd.gradcheck(f, args)


def test_in_place_multiply_reading_its_own_value_gradcheck():
    y0, x = _zeros_data()
    args = [y0.requires_grad_(), x.requires_grad_()]

    def f(y0, x):
        return _updated(MUL_OWN, y0, x=x)
    torch.testing.assert_close(f(*args), args[0] ** 4 * args[1].prod(1))
    assert torch.autograd.gradcheck(f, args)
    (gy,) = torch.autograd.grad(f(*args).sum(), [args[0]], create_graph=True)
    from tullio_py.errors import GradientError
    with pytest.raises(GradientError, match="double backward"):
        torch.autograd.grad(gy.sum(), [args[1]])


def test_in_place_follows_torch_rules():
    x, w = rand(3, 4, seed=1).requires_grad_(), rand(4, seed=2).requires_grad_()
    leaf = rand(3).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        ADD(y=leaf, x=x, w=w)
    y = rand(4, seed=5).requires_grad_() * 1.0
    C = ON_Y(A=x, y=y)                            # saves y for its gradient
    _ = kernel("y[j] += w[j]")(y=y, w=w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        C.sum().backward()
