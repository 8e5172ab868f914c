"""Tape: reverse mode through in-place statements, checked against finite differences of the
whole recorded program (float64)."""
import warnings

import numpy as np
import pytest

from tullio_py import OverwriteWarning, Tape, TullioError, tullio
from tullio_py.errors import OverwriteError


def finite_difference(program, inputs: dict, wrt: str, eps=1e-6):
    """d(program(**inputs))/d inputs[wrt] by central differences; program works on copies."""
    x = inputs[wrt]
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        vals = []
        for h in (eps, -eps):
            trial = {k: np.array(v, copy=True) for k, v in inputs.items()}
            trial[wrt][idx] += h
            vals.append(float(program(**trial)))
        g[idx] = (vals[0] - vals[1]) / (2 * eps)
    return g


def taped(program, inputs: dict):
    """Run program on copies under a Tape; return (tape, the copies, loss array)."""
    arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverwriteWarning)
        with Tape() as tape:
            loss = program(**arrays, _keep=True)
    tape.backward(loss, np.ones_like(loss))
    return tape, arrays


def check_program(program, inputs, wrt=None, rtol=1e-6):
    tape, arrays = taped(program, inputs)
    for name in wrt or inputs:
        want = finite_difference(lambda **a: program(**a).sum(), inputs, name)
        np.testing.assert_allclose(tape.grad(arrays[name]), want, rtol=rtol, atol=1e-8,
                                   err_msg=f"gradient of {name}")


def test_warp_two_writes_to_y_dead_write_warned_and_exact():
    xa, xb, y = np.array([1., 2, 3]), np.array([4., 5, 6]), np.zeros(3)
    with pytest.warns(OverwriteWarning, match=r"statement 0.*dead|dead"):
        with Tape() as tape:
            tullio("y[i] = 2.0 * xa[i]", y=y, xa=xa)
            tullio("y[i] = 3.0 * xb[i]", y=y, xb=xb)
    tape.backward(y, np.ones_like(y))
    np.testing.assert_array_equal(tape.grad(xa), 0)
    np.testing.assert_array_equal(tape.grad(xb), 3)
    np.testing.assert_array_equal(tape.grad(y), 0)


def test_in_place_scale_of_c_gets_minus_1_3_not_1_minus_1_3():
    A, B, C = (np.random.default_rng(k).standard_normal((3, 3)) for k in range(3))
    with Tape() as tape:
        tullio("C[i,k] = -1.3 * C[i,k]", C=C)
        tullio("C[i,k] += 0.5 * A[i,j] * B[j,k]", C=C, A=A, B=B)
    tape.backward(C, np.ones_like(C))
    np.testing.assert_allclose(tape.grad(C), -1.3)
    np.testing.assert_allclose(tape.grad(A), 0.5 * np.ones((3, 3)) @ B.T)


def test_square_in_place_gives_2y0():
    y0 = np.array([1.0, -2.0, 3.5])
    y = y0.copy()
    with Tape() as tape:
        tullio("y[i] = y[i] * y[i]", y=y)
    tape.backward(y, np.ones(3))
    np.testing.assert_allclose(tape.grad(y), 2 * y0)
    assert tape.saved_bytes == y0.nbytes          # the old y was kept once


def test_chain_matmul_tanh_loss():
    rng = np.random.default_rng(1)
    inputs = dict(W=rng.standard_normal((4, 3)), x=rng.standard_normal(3))

    def program(W, x, _keep=False):
        h = tullio("h[i] := W[i,j] * x[j]", W=W, x=x)
        o = tullio("o[i] := tanh(h[i])", h=h)
        return tullio("L[0] := o[i]", o=o)
    check_program(program, inputs)


def test_explicit_euler_ten_in_place_steps():
    rng = np.random.default_rng(2)
    inputs = dict(x=rng.standard_normal(4), M=0.3 * rng.standard_normal((4, 4)))

    def program(x, M, _keep=False):
        for _ in range(10):
            f = tullio("f[i] := tanh(M[i,j] * x[j])", M=M, x=x)
            tullio("x[i] = x[i] + 0.1 * f[i]", x=x, f=f)
        return tullio("L[0] := x[i] * x[i]", x=x)
    check_program(program, inputs)


def test_disjoint_halves_no_warning():
    y, a, b = np.zeros(6), np.arange(6.0), np.arange(6.0) + 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", OverwriteWarning)
        with Tape() as tape:
            tullio("y[i] = a[i]", y=y, a=a, ranges={"i": range(0, 3)})
            tullio("y[i] = b[i]", y=y, b=b, ranges={"i": range(3, 6)})
    tape.backward(y, np.ones(6))
    np.testing.assert_array_equal(tape.grad(a), [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(tape.grad(b), [0, 0, 0, 1, 1, 1])


def test_strict_tape_raises_on_dead_write():
    y, a = np.zeros(3), np.ones(3)
    with pytest.raises(OverwriteError, match="dead"):
        with Tape(strict=True):
            tullio("y[i] = a[i]", y=y, a=a)
            tullio("y[i] = 2.0 * a[i]", y=y, a=a)


def test_warp_write_after_read_example():
    a, c, b = np.array([1., 2, 3]), np.array([-1., -2, -3]), np.zeros(3)
    with Tape() as tape:
        tullio("b[i] = a[i]**2", a=a, b=b)
        tullio("a[i] = c[i]", a=a, c=c)
        loss = tullio("loss[0] := b[i]", b=b)
    tape.backward(loss, np.ones(1))
    np.testing.assert_allclose(tape.grad(a), [2, 4, 6])     # Warp prints [-2, -4, -6]
    np.testing.assert_allclose(tape.grad(c), 0)


def test_mutation_outside_the_tape_is_detected():
    x, y = np.array([1., 2, 3]), None
    with Tape() as tape:
        y = tullio("y[i] := x[i] * x[i]", x=x)
    x[0] = 10.0
    with pytest.raises(TullioError, match="changed outside the tape"):
        tape.backward(y, np.ones(3))


def test_nested_tapes_inner_records_and_same_tape_twice_is_an_error():
    x = np.array([1., 2.])
    outer = Tape()
    with outer:
        with Tape() as inner:
            y = tullio("y[i] := 3.0 * x[i]", x=x)
        z = tullio("z[i] := 2.0 * x[i]", x=x)
    assert len(inner.records) == 1 and len(outer.records) == 1
    inner.backward(y, np.ones(2))
    np.testing.assert_allclose(inner.grad(x), 3)
    outer.backward(z, np.ones(2))
    np.testing.assert_allclose(outer.grad(x), 2)
    with pytest.raises(TullioError, match="already active"):
        with outer:
            with outer:
                pass


def test_zero_and_reset():
    x = np.array([1., 2.])
    with Tape() as tape:
        y = tullio("y[i] := 3.0 * x[i]", x=x)
    tape.backward(y, np.ones(2))
    tape.zero()
    np.testing.assert_array_equal(tape.grad(x), 0)
    tape.backward(y, np.ones(2))
    np.testing.assert_allclose(tape.grad(x), 3)
    tape.reset()
    assert tape.records == [] and tape.saved_bytes == 0


def test_product_update_multiplies_the_adjoint():
    rng = np.random.default_rng(3)
    inputs = dict(y=rng.uniform(0.5, 1.5, 3), a=rng.uniform(0.5, 1.5, 3))

    def program(y, a, _keep=False):
        tullio("y[i] *= a[i] * a[i]", y=y, a=a)
        return tullio("L[0] := y[i]", y=y)
    check_program(program, inputs)


def test_product_update_over_a_reduction():
    """y[i] *= A[i,j] with zeros in A: the inputs get y_old * (product of the other factors),
    the old y gets the product (no division by a factor that may be 0)."""
    y0, A = np.array([1.0, 2.0, 3.0]), np.array([[2.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    y = y0.copy()
    with Tape() as tape:
        tullio("y[i] *= A[i,j]", y=y, A=A)
    g = np.array([1.0, -2.0, 0.5])
    tape.backward(y, g)
    others = np.stack([A[:, 1], A[:, 0]], 1)
    np.testing.assert_array_equal(tape.grad(A), (g * y0)[:, None] * others)
    np.testing.assert_array_equal(tape.grad(y), g * A.prod(1))


def test_torch_tensors_on_a_tape():
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    y = torch.zeros(3, dtype=torch.float64)
    with Tape() as tape:
        tullio("y[i] = x[i] * x[i]", y=y, x=x)
    tape.backward(y, torch.ones(3, dtype=torch.float64))
    g = tape.grad(x)
    assert isinstance(g, torch.Tensor)
    np.testing.assert_allclose(g.numpy(), 2 * x.numpy())
