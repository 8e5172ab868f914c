"""Every kernel of the expression table (forward, and the gradient equations of the
differentiable entries) compiled to PTX for compute capability 9.0 by numba-cuda's NVVM: no
GPU needed.  Kernels that need no atomics must contain no atomic instruction; the ones that
combine with atomics must contain one.  The sources are checked for numerical results on the
simulator (test_cuda_sim.py); this checks that the real compiler accepts them."""
import importlib.util
import os
import re
import sys
import warnings

import numpy as np
import pytest

pytestmark = [pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda") is None or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
    reason="needs numba-cuda (extra 'cuda'), not the simulator"),
    pytest.mark.filterwarnings("ignore::UserWarning")]

sys.path.insert(0, os.path.dirname(__file__))
from test_table import IDS, TABLE, _differentiable, _expected  # noqa: E402

from tullio_py import TullioError, kernel  # noqa: E402

ATOMIC = re.compile(r"^\s*(?:@%p\d+\s+)?(?:atom|red)\.", re.M)
_SEEN: set = set()


def _check(k, arrays):
    from tullio_py.frontends import cuda as cuda_frontend
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src, ptxs = cuda_frontend.ptx(k, arrays, cc=(9, 0))
    for name, text in ptxs.items():
        assert ".target sm_90" in text and ".entry" in text
        has_atomic = bool(ATOMIC.search(text))
        needs = src.atomic and name == "_tullio_kernel"
        assert has_atomic == needs, f"{name}: atomic instruction {'missing' if needs else 'found'}"
    return src


@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_forward_compiles_to_ptx(n):
    t = TABLE[n]
    arrays, expected, ranges, eq = _expected(n)
    _check(kernel(t.expr, **{**t.opts, "target": "cuda"}), arrays)


def _gradient_inputs(n):
    entry = _differentiable(n)
    if entry is None:
        return None
    t, arrays, expected, eq = entry
    k = kernel(t.expr, **{**t.opts, "target": "python"})
    dout = np.ones(expected.shape, expected.dtype)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads = k.vjp(dout, **arrays)
            out = k(**arrays)
    except (TullioError, NotImplementedError):
        return None
    return arrays, out, dout, grads, k.gradient_equations, eq.output


@pytest.mark.parametrize("n", range(len(TABLE)), ids=IDS)
def test_gradients_compile_to_ptx(n):
    case = _gradient_inputs(n)
    if case is None:
        pytest.skip("no gradient for this entry")
    arrays, out, dout, grads, equations, out_name = case
    for name, eqs in equations.items():
        if name not in grads:
            continue
        ns = {**arrays, out_name: out, "d" + out_name: dout, "d" + name: np.zeros_like(grads[name])}
        for text in eqs:
            if text in _SEEN:
                continue
            _SEEN.add(text)
            k = kernel(text, target="python")
            e = k.equation
            wanted = list(e.arrays) + list(e.params) + ([e.output] if e.assign != ":=" else [])
            use = {w: ns[w] for w in wanted}
            _check(kernel(text, target="cuda"), use)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ns[e.output] = k(**use)          # helpers feed the later equations


def test_a_scatter_and_a_block_reduction_use_atomics():
    J = np.array([1, 3, 3, 0])
    src = _check(kernel("H[J[i]] += w[i]", target="cuda"), dict(H=np.zeros(4), w=np.ones(4), J=J))
    assert src.atomic
    src = _check(kernel("s := x[i]", target="cuda"), dict(x=np.ones(4, np.float32)))
    assert src.atomic and src.kind == "scalar"
    src = _check(kernel("(*) p := x[i]", target="cuda"), dict(x=np.ones(4)))
    assert not src.atomic and src.partials


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_nan_propagating_max_min_compile(dtype):
    """(max)/(min) with their NaN checks (and the plain store of a NaN beside the atomic),
    and the written-out elementwise max/min/relu, compile for the device."""
    A, J = np.ones((9, 4), dtype), np.array([1, 3, 3, 0, 3, 1, 4, 2, 4])
    for expr in ("(max) M[i] := A[i,j]", "(min) m := A[i,j]", "(max) H[J[i]] := A[i,j]",
                 "y[i,j] := max(A[i,j], A[8-i,j]) + relu(A[i,j]) + min(A[i,j], 2)"):
        src = _check(kernel(expr, target="cuda"), dict(A=A, **({"J": J} if "J" in expr else {})))
        assert ("_w != _w" in src.text) == (src.atomic and dtype != np.int32 and "max(" not in expr)
