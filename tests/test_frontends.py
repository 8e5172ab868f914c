"""frontends/registry.py: a call goes to the first frontend, in a fixed order, whose `wants`
takes its arrays; a frontend is one module (wants, call, optional vjp), and one registered at
run time is asked like the built-in ones.  Results are checked against numpy."""
import sys
import types

import numpy as np
import pytest

from tullio_py import kernel
from tullio_py.frontends import registry

K = kernel("C[i,k] := A[i,j] * B[j,k]")
rng = np.random.default_rng(3)
A, B, dC = rng.standard_normal((3, 4)), rng.standard_normal((4, 2)), rng.standard_normal((3, 2))


def test_fixed_order():
    assert registry.names() == ["torch", "dask", "cuda", "numpy"]


def test_numpy_arrays_go_to_the_numpy_frontend():
    for arrays in ({"A": A, "B": B}, {"A": A.tolist(), "B": B}):
        m = registry.pick(K, arrays)
        assert m.__name__ == "tullio_py.frontends.numpy"
        np.testing.assert_allclose(m.call(K, arrays), A @ B, rtol=1e-12)
    assert registry.pick(K, {"A": A, "B": B, "": dC}, "vjp").__name__ == \
        "tullio_py.frontends.numpy"
    g = K.vjp(dC, A=A, B=B)
    np.testing.assert_allclose(g["A"], dC @ B.T, rtol=1e-12)
    np.testing.assert_allclose(g["B"], A.T @ dC, rtol=1e-12)


def test_torch_tensors_go_to_the_torch_frontend():
    torch = pytest.importorskip("torch")
    tA, tB = torch.from_numpy(A), torch.from_numpy(B)
    assert registry.pick(K, {"A": tA, "B": B}).__name__ == "tullio_py.frontends.torch_call"
    out = K(A=tA, B=tB)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), A @ B, rtol=1e-12)
    # the torch frontend has no vjp (autograd gives tensors their gradients): Kernel.vjp on
    # CPU tensors runs where their memory is, on the numpy frontend
    assert registry.pick(K, {"A": tA, "B": tB, "": dC}, "vjp").__name__ == \
        "tullio_py.frontends.numpy"


def test_dask_arrays_go_to_the_dask_frontend():
    da = pytest.importorskip("dask.array")
    dA = da.from_array(A, chunks=2)
    assert registry.pick(K, {"A": dA, "B": B}).__name__ == "tullio_py.frontends.dask"
    out = K(A=dA, B=B)
    assert isinstance(out, da.Array)
    np.testing.assert_allclose(out.compute(), A @ B, rtol=1e-12)
    g = K.vjp(da.from_array(dC, chunks=2), A=dA, B=B)
    np.testing.assert_allclose(g["B"].compute(), A.T @ dC, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(da.compute(g["A"])[0]), dC @ B.T, rtol=1e-12)


def test_target_cuda_goes_to_the_cuda_frontend():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", target="cuda")
    assert registry.pick(k, {"A": A, "B": B}).__name__ == "tullio_py.frontends.cuda_call"
    assert registry.pick(k, {"A": A, "B": B, "": dC}, "vjp").__name__ == \
        "tullio_py.frontends.cuda_call"
    assert registry.pick(kernel("C[i,k] := A[i,j] * B[j,k]", target="cpu"),
                         {"A": A, "B": B}).__name__ == "tullio_py.frontends.numpy"


# ----------------------------------------------------------------------------- a new frontend
class Boxed:
    """A toy array type: a numpy array in a box."""

    def __init__(self, value):
        self.value = value


def _toy_module(launches: list):
    toy = types.ModuleType("tullio_toy_frontend")

    def unbox(arrays):
        return {n: v.value if isinstance(v, Boxed) else v for n, v in arrays.items()}

    def wants(arrays, kernel=None):
        return any(isinstance(v, Boxed) for v in arrays.values())

    def call(kernel, arrays):
        launches.append(("call", kernel))
        return Boxed(kernel(**unbox(arrays)))

    def vjp(kernel, cotangent, arrays):
        launches.append(("vjp", kernel))
        cot = cotangent.value if isinstance(cotangent, Boxed) else cotangent
        return {n: Boxed(g) for n, g in kernel.vjp(cot, **unbox(arrays)).items()}

    toy.wants, toy.call, toy.vjp = wants, call, vjp
    return toy


@pytest.fixture
def toy(monkeypatch):
    launches = []
    monkeypatch.setitem(sys.modules, "tullio_toy_frontend", _toy_module(launches))
    registry.register("toy", "tullio_toy_frontend", needs="tullio_toy_library")
    yield launches
    registry.unregister("toy")


def test_a_registered_frontend_is_picked_by_type_and_launched(toy, monkeypatch):
    assert registry.names() == ["torch", "dask", "cuda", "toy", "numpy"]
    # asked only once its library is loaded (no Boxed can exist before)
    assert registry.pick(K, {"A": Boxed(A), "B": B}).__name__ == "tullio_py.frontends.numpy"
    monkeypatch.setitem(sys.modules, "tullio_toy_library", types.ModuleType("lib"))
    assert registry.pick(K, {"A": A, "B": B}).__name__ == "tullio_py.frontends.numpy"
    out = K(A=Boxed(A), B=B)
    assert isinstance(out, Boxed) and toy == [("call", K)]
    np.testing.assert_allclose(out.value, A @ B, rtol=1e-12)
    np.testing.assert_allclose(K(A=A, B=B), A @ B, rtol=1e-12)     # numpy: not the toy's
    assert toy == [("call", K)]
    g = K.vjp(Boxed(dC), A=Boxed(A), B=Boxed(B))
    assert toy[-1] == ("vjp", K) and all(isinstance(v, Boxed) for v in g.values())
    np.testing.assert_allclose(g["A"].value, dC @ B.T, rtol=1e-12)
    np.testing.assert_allclose(g["B"].value, A.T @ dC, rtol=1e-12)


def test_built_in_frontends_stay():
    with pytest.raises(ValueError, match="built in"):
        registry.unregister("numpy")
