"""Gradients that simplify to zero are zeros (never a missing key), and abs/real/imag of complex
arrays are real: the forward's dtype is numpy's, and the gradient of a real output with respect
to a complex input agrees with torch.autograd and with finite differences."""
import numpy as np
import pytest

from tullio_py import Tape, kernel

from test_grad import crand, finite_difference, rand

ZERO = [  # (statement, the input whose gradient is zero)
    ("y[i] := x[i] + 0*w[i]", "w"),
    ("y[i] := x[i] * (w[i] > 0)", "w"),
    ("y[i] := where(w[i] > 0, x[i], 0.0)", "w"),
    ("y[i] := 0*w[i] + 2.0", "w"),
]


@pytest.mark.parametrize("expr,zero", ZERO, ids=[z[0] for z in ZERO])
def test_zero_gradient_is_an_array_of_zeros(expr, zero):
    arrays = dict(x=rand(5), w=rand(5))
    k = kernel(expr)
    arrays = {n: a for n, a in arrays.items() if n in k.equation.arrays}
    cot = rand(5)
    g = k.vjp(cot, **arrays)
    assert set(g) == set(arrays)
    for name, a in arrays.items():
        assert g[name].shape == a.shape and g[name].dtype == a.dtype
        np.testing.assert_allclose(g[name], finite_difference(k, arrays, name, cot), atol=1e-8)
    np.testing.assert_array_equal(g[zero], 0)
    assert k.gradient_equations[zero] == []      # nothing to run: the zeros they start from


def test_zero_gradient_in_torch_and_on_the_tape():
    torch = pytest.importorskip("torch")
    for expr, zero in ZERO:
        k = kernel(expr)
        x = torch.tensor(rand(5), requires_grad=True)
        w = torch.tensor(rand(5), requires_grad=True)
        given = {n: t for n, t in dict(x=x, w=w).items() if n in k.equation.arrays}
        k(**given).sum().backward()
        for name, t in given.items():
            assert t.grad is not None and t.grad.shape == t.shape, (expr, name)
        assert torch.count_nonzero(w.grad) == 0, expr
        if "x" in given:
            np.testing.assert_allclose(x.grad.numpy(), kernel(expr).vjp(
                np.ones(5), **{n: t.detach().numpy() for n, t in given.items()})["x"])
    xs, ws = rand(5), rand(5)
    with Tape() as tape:
        y = kernel(ZERO[1][0])(x=xs, w=ws)
    tape.backward(y, np.ones(5))
    np.testing.assert_array_equal(tape.grad(ws), 0)
    np.testing.assert_array_equal(tape.grad(xs), ws > 0)


# (statement, numpy reference, torch reference); z complex, x real
REAL = [
    ("y[i,j] := abs(z[i,j])", lambda z, x: abs(z), lambda z, x: z.abs()),
    ("y[i,j] := real(z[i,j])", lambda z, x: z.real, lambda z, x: z.real),
    ("y[i,j] := imag(z[i,j])", lambda z, x: z.imag, lambda z, x: z.imag),
    ("y[i,j] := abs(z[i,j])**2 * x[i,j] + real(z[i,j] * x[i,j])",
     lambda z, x: abs(z) ** 2 * x + (z * x).real, lambda z, x: z.abs() ** 2 * x + (z * x).real),
    ("s[i] := abs(z[i,j]) * x[i,j]", lambda z, x: (abs(z) * x).sum(1),
     lambda z, x: (z.abs() * x).sum(1)),
    ("(max) m[i] := abs(z[i,j])", lambda z, x: abs(z).max(1), lambda z, x: z.abs().max(1).values),
    ("y[i,j] := where(real(z[i,j]) > 0, imag(z[i,j]), abs(z[i,j]))",
     lambda z, x: np.where(z.real > 0, z.imag, abs(z)),
     lambda z, x: torch_where(z.real > 0, z.imag, z.abs())),
]


def torch_where(c, a, b):
    import torch
    return torch.where(c, a, b)


@pytest.mark.parametrize("expr,ref,_", REAL, ids=[r[0] for r in REAL])
def test_real_valued_functions_of_complex_are_real(expr, ref, _):
    k = kernel(expr)
    for zdt, xdt in ((np.complex128, np.float64), (np.complex64, np.float32),
                     (np.complex64, np.float64)):
        z, x = crand(3, 4).astype(zdt), rand(3, 4).astype(xdt)
        arrays = {n: a for n, a in dict(z=z, x=x).items() if n in k.equation.arrays}
        want = np.asarray(ref(z, x))
        got = k(**arrays)
        assert got.dtype == want.dtype, (expr, zdt, xdt)
        single = zdt == np.complex64 or xdt == np.float32   # rounds where numpy may not
        np.testing.assert_allclose(got, want, rtol=1e-5 if single else 1e-13)
    assert kernel("y[i] := abs(z[i]) * z[i]")(z=z[0]).dtype == np.complex64   # still complex


@pytest.mark.parametrize("expr,_,tref", REAL, ids=[r[0] for r in REAL])
def test_gradient_of_real_output_wrt_complex_input(expr, _, tref):
    torch = pytest.importorskip("torch")
    k = kernel(expr)
    arrays = {n: a for n, a in dict(z=crand(3, 4), x=rand(3, 4)).items() if n in k.equation.arrays}
    out = k(**arrays)
    cot = rand(*out.shape)
    g = k.vjp(cot, **arrays)
    leaves = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    want = tref(leaves["z"], leaves.get("x"))
    want.backward(torch.tensor(cot))
    via_frontend = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    y = k(**via_frontend)
    assert y.dtype == want.dtype
    y.backward(torch.tensor(cot))
    for name, a in arrays.items():
        assert g[name].dtype == a.dtype
        np.testing.assert_allclose(g[name], leaves[name].grad.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(via_frontend[name].grad.numpy(), g[name], rtol=1e-12, atol=1e-12)
        fd = finite_difference(k, arrays, name, cot)
        assert np.abs(g[name] - fd).max() <= 1e-6 * max(np.abs(fd).max(), 1e-12), name
