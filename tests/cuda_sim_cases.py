"""CUDA target on numba-cuda's simulator.  Not collected by a plain `pytest` run: the simulator
must be switched on before numba is imported, so tests/test_cuda_sim.py runs this file in its
own process with NUMBA_ENABLE_CUDASIM=1 (or run it so yourself).

Every forward entry of the expression table and the gradient equations of every differentiable
entry run on target="cuda" and are compared with the CPU code (target="python": the CPU
generator's code, uncompiled) and the reference interpreter; then the CUDA-only paths: scatters
with atomics, block reductions, flattened grids, multi-block grid-stride loops, device arrays in
and out, and the errors.
"""
import os
import sys
import warnings

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("run with NUMBA_ENABLE_CUDASIM=1 (tests/test_cuda_sim.py does)",
                allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
from test_table import IDS, TABLE, _assert_same, _differentiable, _expected  # noqa: E402

from numba import cuda  # noqa: E402
from tullio_py import TullioError, kernel, tullio  # noqa: E402


def _quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **kw)


def test_simulator_is_on():
    assert cuda.simulator_enabled if hasattr(cuda, "simulator_enabled") else True
    assert type(cuda.to_device(np.zeros(1))).__name__ == "FakeCUDAArray"


@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_forward_table(n):
    t = TABLE[n]
    arrays, expected, ranges, eq = _expected(n)
    fresh = lambda: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    inputs = fresh()
    got = _quiet(tullio, t.expr, **{**t.opts, "target": "cuda"}, **inputs)
    cpu = _quiet(tullio, t.expr, **{**t.opts, "target": "python"}, **fresh())
    if eq.assign != ":=":
        assert got is inputs[eq.output]
    _assert_same(np.asarray(got), expected)
    _assert_same(np.asarray(got), np.asarray(cpu))
    assert kernel(t.expr, **{**t.opts, "target": "cuda"})._last.source.text.startswith("#")


def _gradient_case(n):
    """(arrays, cotangent, CPU vjp, gradient equations) of entry n, or None if it has none."""
    entry = _differentiable(n)
    if entry is None:
        return None
    t, arrays, expected, eq = entry
    k = kernel(t.expr, **{**t.opts, "target": "python"})
    dout = np.random.default_rng(n).standard_normal(expected.shape).astype(expected.dtype)
    try:
        grads = _quiet(k.vjp, dout, **arrays)
    except (TullioError, NotImplementedError):    # entries without a gradient (or not yet)
        return None
    return arrays, dout, grads, k.gradient_equations


@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_gradient_equations_table(n):
    """The printed gradient equations, run with tullio(target="cuda"), give the CPU vjp."""
    case = _gradient_case(n)
    if case is None:
        pytest.skip("no gradient for this entry")
    arrays, dout, grads, equations = case
    eq = TABLE[n]
    out_name = kernel(eq.expr, **{**eq.opts, "target": "python"}).equation.output
    out = _quiet(tullio, eq.expr, **{**eq.opts, "target": "python"}, **arrays)
    for name, eqs in equations.items():
        if name not in grads:
            continue
        ns = {**arrays, out_name: out, "d" + out_name: dout,
              "d" + name: np.zeros(np.shape(arrays[name]), grads[name].dtype)}
        for text in eqs:
            k = kernel(text, target="cuda")
            e = k.equation
            wanted = list(e.arrays) + list(e.params) + ([e.output] if e.assign != ":=" else [])
            ns[e.output] = _quiet(k, **{w: ns[w] for w in wanted})
        tol = 1e-5 if grads[name].dtype == np.float32 else 1e-10
        np.testing.assert_allclose(ns["d" + name], grads[name], rtol=tol, atol=tol)


@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_vjp_on_the_device(n):
    """Kernel.vjp with device arrays: gradients computed on the device, returned as device
    arrays, equal to the CPU vjp; numpy arrays with target="cuda" come back as numpy."""
    case = _gradient_case(n)
    if case is None:
        pytest.skip("no gradient for this entry")
    arrays, dout, grads, _ = case
    t = TABLE[n]
    tol = 1e-5 if dout.dtype == np.float32 else 1e-10
    k = kernel(t.expr, **t.opts)                    # target "auto": device arrays pick cuda
    on_dev = {n_: cuda.to_device(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
              for n_, v in arrays.items()}
    got = _quiet(k.vjp, cuda.to_device(dout), **on_dev)
    assert set(got) == set(grads)
    for name, g in got.items():
        assert type(g).__name__ == "FakeCUDAArray"
        np.testing.assert_allclose(g.copy_to_host(), grads[name], rtol=tol, atol=tol)
    host = _quiet(kernel(t.expr, **{**t.opts, "target": "cuda"}).vjp, dout, **arrays)
    for name, g in host.items():
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, grads[name], rtol=tol, atol=tol)


@pytest.mark.parametrize("expr", ["C[i,k] := A[i,j] * Z[j,k]",
                                  "C[i,k] := abs(Z[i,j])**2 * A[j,k] + real(Z[i,j])"])
def test_vjp_on_the_device_real_input_of_a_complex_statement(expr):
    """The real input's gradient is the real part (printed as real(...)), as on the CPU."""
    rng = np.random.default_rng(5)
    A, Z = rng.standard_normal((3, 3)), rng.standard_normal((3, 3)) + 1j * rng.standard_normal((3, 3))
    cpu = kernel(expr, target="python")
    out = cpu(A=A, Z=Z)
    dout = rng.standard_normal(out.shape) + (1j * rng.standard_normal(out.shape)
                                            if out.dtype.kind == "c" else 0)
    want = cpu.vjp(dout, A=A, Z=Z)
    got = kernel(expr).vjp(cuda.to_device(dout), A=cuda.to_device(A), Z=cuda.to_device(Z))
    assert set(got) == {"A", "Z"}
    for name, g in got.items():
        assert g.dtype == want[name].dtype
        np.testing.assert_allclose(g.copy_to_host(), want[name], rtol=1e-12, atol=1e-12)
    assert any(line.startswith("dA") and "real(" in line for line in cpu.gradient_equations["A"])


def test_vjp_on_the_device_mixed_memory_is_an_error():
    k = kernel("y[i] := x[i+j] * w[j]")
    x, w = np.arange(5.0), np.ones(2)
    with pytest.raises(TullioError, match="host memory"):
        k.vjp(cuda.to_device(np.ones(4)), x=cuda.to_device(x), w=w)


# ----------------------------------------------------------------------------- CUDA-only paths
r = np.random.default_rng(7)
J = np.array([1, 3, 3, 0, 3, 1, 4, 4, 4])
EXTRA = [
    # scatters that stay scatters: atomics (add, max, min), := and = starting from identity
    ("H[J[i]] := w[i]", dict(w=r.standard_normal(9), J=J), {}),
    ("(max) H[J[i]] := w[i, k]", dict(w=r.standard_normal((9, 2)), J=J), {}),
    ("(min) H[J[i]] = w[i, k] * (k != 1)", dict(H=np.full(5, 9.0), w=r.standard_normal((9, 3)), J=J),
     {}),
    ("(max) H[J[i]] = w[i, k]", dict(H=np.zeros(5, np.int64), w=r.integers(-9, 9, (9, 2)), J=J), {}),
    ("H[J[i]] -= w[i, k]", dict(H=np.ones(5, np.float32), w=r.standard_normal((9, 3)).astype(np.float32),
                                J=J), {}),
    ("H[J[i], c] += 2", dict(H=np.zeros((5, 2), np.int32), J=J), {"ranges": {"c": 2}}),
    # scalar reductions: one atomic per block, or per-block partials for (*) and complex
    ("s := x[i] * y[i]", dict(x=r.standard_normal(300), y=r.standard_normal(300)), {"threads": 32}),
    ("(max) m := A[i,j]", dict(A=r.integers(-99, 99, (13, 40))), {"threads": 64}),
    ("(*) p := x[i]", dict(x=r.uniform(0.9, 1.1, 200)), {"threads": 32}),
    ("z := Z[i,j] * Z[j,i]", dict(Z=r.standard_normal((9, 9)) + 1j * r.standard_normal((9, 9))), {}),
    ("s := A[i,j,k,l] * (i <= j)", dict(A=r.standard_normal((3, 4, 2, 5))), {}),
    ("s := x[i]**2 |> sqrt", dict(x=r.standard_normal(50).astype(np.float32)), {"threads": 16}),
    # grids: 3-D, flattened (4 and 5 left indices), several blocks per dimension
    ("C[i,j,k] := A[i,j] * B[j,k] * (i != k)", dict(A=r.standard_normal((5, 6)),
                                                    B=r.standard_normal((6, 7))), {"threads": 32}),
    ("Y[a,b,c,d] := X[d,c,b,a] + X[a,b,c,d] * (a <= d)", dict(X=r.standard_normal((3, 3, 3, 3))), {}),
    ("Y[a,b,c,d,e] := X[a,b,c,d,e,f]", dict(X=r.standard_normal((2, 3, 2, 2, 3, 4))), {}),
    ("y[i] := x[i+j] * h[j]", dict(x=r.standard_normal(200), h=r.standard_normal(5)), {"threads": 32}),
    ("C[i,k] := A[i,j] * B[j,k]", dict(A=r.standard_normal((40, 7)), B=r.standard_normal((7, 70))),
     {"threads": 64}),
    ("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]",
     dict(x=r.standard_normal((5, 5, 2, 3)), W=r.standard_normal((5, 5, 3, 3, 2, 2))), {}),
    # user names that are the names of the CUDA code's modules and builtins
    ("cuda[math] := range[math, k] * range[pad(math+1), k] * (k <= math)",
     dict(range=r.standard_normal((5, 4))), {}),
    ("(max) math[i] := cuda[i, cmath[k]] * len", dict(cuda=r.standard_normal((3, 3)),
                                                     cmath=np.array([2, 0, 2]), len=1.5), {}),
    ("range[cmath[i]] += math[i]", dict(range=np.zeros(3), math=r.standard_normal(9),
                                         cmath=r.integers(0, 3, 9)), {}),
    ("min := max[np] * max[np]", dict(max=r.standard_normal(40)), {"threads": 16}),
]


@pytest.mark.parametrize("expr,arrays,opts", EXTRA, ids=[e[0] for e in EXTRA])
def test_cuda_paths(expr, arrays, opts):
    copy = lambda: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    got = _quiet(tullio, expr, target="cuda", **opts, **copy())
    want = _quiet(tullio, expr, target="python", **opts, **copy())
    assert np.asarray(got).dtype == np.asarray(want).dtype
    tol = 1e-5 if np.asarray(want).dtype in (np.float32, np.complex64) else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_kinds_and_atomics():
    """Which code each path generates: atomics only where a scatter or a block result needs
    them; more than three thread indices flatten the grid."""
    def src(expr, **arrays):
        k = kernel(expr, target="cuda")
        _quiet(k, **arrays)
        return k._last.source
    s = src("C[i,k] := A[i,j] * B[j,k]", A=np.ones((2, 3)), B=np.ones((3, 4)))
    assert (s.kind, s.atomic, s.threaded) == ("map", False, ("i", "k"))
    assert "atomic" not in s.text and "cuda.grid(1)" not in s.text
    s = src("H[J[i]] += w[i]", H=np.zeros(5), w=np.ones(9), J=J)
    assert (s.kind, s.atomic) == ("scatter", True) and "cuda.atomic.add" in s.text
    s = src("s := x[i]", x=np.ones(5))
    assert (s.kind, s.atomic, s.partials) == ("scalar", True, False)
    assert "cuda.syncthreads()" in s.text
    s = src("(*) p := x[i]", x=np.ones(5))
    assert (s.kind, s.atomic, s.partials) == ("scalar", False, True) and "atomic" not in s.text
    s = src("Y[a,b,c,d] := X[a,b,c,d]", X=np.ones((2, 2, 2, 2)))
    assert s.threaded == ("a", "b", "c", "d") and "cuda.grid(1)" in s.text


def test_device_arrays_in_device_array_out():
    A, B = r.standard_normal((4, 3)), r.standard_normal((3, 5))
    dA, dB = cuda.to_device(A), cuda.to_device(B)
    C = tullio("C[i,k] := A[i,j] * B[j,k]", A=dA, B=dB)          # target="auto" picks cuda
    assert type(C).__name__ == "FakeCUDAArray"
    np.testing.assert_allclose(C.copy_to_host(), A @ B, rtol=1e-12, atol=1e-12)
    dC = cuda.to_device(np.ones((4, 5)))
    assert tullio("C[i,k] += A[i,j] * B[j,k]", C=dC, A=dA, B=dB) is dC
    np.testing.assert_allclose(dC.copy_to_host(), 1 + A @ B, rtol=1e-12, atol=1e-12)
    s = tullio("s := A[i,j]", A=dA)
    np.testing.assert_allclose(np.asarray(s.copy_to_host()).reshape(()), A.sum(), rtol=1e-12, atol=1e-12)


def test_device_output_aliasing_an_input_reads_its_snapshot():
    Y = 0.5 + r.random((4, 4))
    dY = cuda.to_device(Y)
    assert tullio("A[i,k] += B[i,j] * C[j,k]", A=dY, B=dY, C=dY) is dY
    np.testing.assert_allclose(dY.copy_to_host(), Y + Y @ Y, rtol=1e-12, atol=1e-12)
    Z = 0.5 + r.random((8, 4))
    dZ = cuda.to_device(Z)
    tullio("A[i,k] = B[i,j] * C[j,k]", A=dZ[:4], B=dZ[1:5], C=dZ[4:])    # overlapping, disjoint
    np.testing.assert_allclose(dZ.copy_to_host()[:4], Z[1:5] @ Z[4:], rtol=1e-12, atol=1e-12)


def test_auto_with_host_arrays_stays_on_cpu():
    k = kernel("y[i] := 2 * x[i]")
    k(x=np.arange(3.0))
    assert not hasattr(k._last.source, "kind")       # a CPU Source, not a CudaSource


def test_mixed_host_and_device_is_an_error():
    with pytest.raises(TullioError, match=r"GPU memory \(A\) and in host memory \(B\)"):
        tullio("C[i,k] := A[i,j] * B[j,k]", A=cuda.to_device(np.ones((2, 2))), B=np.ones((2, 2)))


def test_errors_read_as_on_cpu():
    with pytest.raises(TullioError, match="'A' has 1 dimension but is indexed with 2"):
        tullio("C[i,k] := A[i,j] * B[j,k]", A=cuda.to_device(np.ones(2)),
               B=cuda.to_device(np.ones((2, 2))))
    with pytest.raises(TullioError, match="out of bounds"):
        tullio("G[k] := A[J[k]]", A=cuda.to_device(np.ones(3)), J=cuda.to_device(np.array([0, 3])))


def test_scatter_without_an_atomic_is_an_error():
    with pytest.raises(TullioError, match="cannot combine a scattered"):
        tullio("H[J[i]] += w[i]", H=np.zeros(5, complex), w=np.ones(9, complex), J=J, target="cuda")


NAN_A = r.standard_normal((9, 40))
NAN_A[1, 0] = NAN_A[2, 39] = NAN_A[3, 17] = np.nan
NAN_A[5, :] = np.nan
NAN_J = np.array([1, 3, 3, 0, 3, 1, 4, 2, 4])
NAN_CASES = [
    ("(max) M[i] := A[i,j]", lambda A: A.max(1), {}),                   # map
    ("(min) M[j] := A[i,j]", lambda A: A.min(0), {}),
    ("(max) m := A[i,j]", lambda A: A.max(), {"threads": 64}),          # scalar, atomic
    ("(min) m := A[i,j]", lambda A: A.min(), {"threads": 64}),
    ("(max) H[J[i]] := A[i,j]",                                         # scatter, atomic
     lambda A: np.array([A[NAN_J == h].max() for h in range(5)]), {}),
    ("y[i,j] := max(A[i,j], -A[8-i,j]) + relu(A[i,j]) + min(A[i,j], 0.5)",
     lambda A: np.maximum(A, -A[::-1]) + np.maximum(A, 0) + np.minimum(A, 0.5), {}),
]


@pytest.mark.parametrize("expr,want,opts", NAN_CASES, ids=[c[0] for c in NAN_CASES])
def test_nan_propagates(expr, want, opts):
    """(max)/(min) and max/min/relu propagate NaN as numpy does, through the block
    reductions and the atomics (CUDA's float atomic max ignores a NaN value)."""
    A = NAN_A.astype(np.float32)
    for a in (NAN_A, A):
        got = _quiet(tullio, expr, target="cuda", **opts, A=a, **({"J": NAN_J} if "J" in expr else {}))
        np.testing.assert_array_equal(got, want(a))
    A[:] = np.nan
    got = _quiet(tullio, "(max) m := A[i,j]", target="cuda", threads=64, A=A)
    assert np.isnan(got)


DTYPE_CASES = [(np.array([2**62, 3], np.uint64), np.array([4, 1], np.int64)),
               (np.array([10, 2, 100], np.int8), np.array([20, 3, 100], np.int8)),
               (np.array([2**63 + 1, 1], np.uint64), np.array([True, True])),
               (np.array([16777217, 3], np.int64), np.array([1.0, 2.5], np.float32))]


@pytest.mark.parametrize("x,y", DTYPE_CASES, ids=[f"{x.dtype}-{y.dtype}" for x, y in DTYPE_CASES])
def test_elements_follow_numpy_dtypes(x, y):
    """Each product in numpy's dtype (int8 wraps, uint64 x int64 is float64), then reduced in
    the result dtype, as on the CPU targets."""
    with np.errstate(all="ignore"):
        p = x * y
        for expr, want in (("s := x[i] * y[i]", np.add.reduce(p, dtype=p.dtype)),
                           ("(max) m := x[i] * y[i]", p.max())):
            got = _quiet(tullio, expr, target="cuda", x=x, y=y)
            assert got.dtype == want.dtype and got == want, (expr, got, want)


@pytest.mark.parametrize("expr,opts,shapes", [
    ("y[i] := x[clamp(i+k-1)] * w[k]", {"ranges": {"i": 6}}, dict(x=6, w=3)),
    ("y[i] := x[mod(i+k-1)] * w[k]", {"ranges": {"i": 6}}, dict(x=6, w=3)),
    ("y[n,i] := x[pad(J[n]+i-1, 1, 1)] * w[i]", {}, dict(x=6, w=3)),
])
def test_many_to_one_gradients_on_the_device(expr, opts, shapes):
    """Gradients of clamp/mod/padded-gather reads (left-hand wrapped scatters, with atomics;
    a left-hand pad drops writes outside) on the device equal the CPU vjp."""
    r = np.random.default_rng(3)
    arrays = {n: r.standard_normal(s) for n, s in shapes.items()}
    if "J" in expr:
        arrays["J"] = np.array([0, 3, 5, 5, 1])
    k = kernel(expr, **opts)
    out = _quiet(k, **arrays)
    cot = r.standard_normal(out.shape)
    ref = _quiet(kernel(expr, target="python", **opts).vjp, cot, **arrays)
    got = _quiet(k.vjp, cuda.to_device(cot), **{n: cuda.to_device(v) for n, v in arrays.items()})
    assert set(got) == {"x", "w"}
    for name, g in got.items():
        np.testing.assert_allclose(g.copy_to_host(), ref[name], rtol=1e-10, atol=1e-12)
