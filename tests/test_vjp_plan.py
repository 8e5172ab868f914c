"""The plan of a vjp call (vjp_plan.py), checked against expectations worked out here from the
statements themselves, and run (vjp_run.run) by a frontend that evaluates every statement with
the reference interpreter, against finite differences."""
import dataclasses
import warnings

import numpy as np
import pytest
from reference import evaluate
from test_grad import finite_difference

from tullio_py import kernel, vjp_plan, vjp_run
from tullio_py.blas import MIN_WORK
from tullio_py.gradient_kernel import Gradient

R = np.random.default_rng(11)
CONV = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"      # local (untied) conv
MATMUL = "C[i,k] := A[i,j] * B[j,k]"
M, N = 40, 64               # M*N*M >= MIN_WORK: large enough for BLAS
assert M * N * M >= MIN_WORK


def conv_arrays():
    return dict(x=R.standard_normal((6, 6, 2, 3)).astype(np.float32),
                W=R.standard_normal((6, 6, 3, 3, 2, 4)).astype(np.float32))


def conv_reference(x, W, cot):
    """The local convolution's output and its gradients (dx, dW) for cotangent `cot`, in numpy
    (float64): out[s,t,c2,b] = sum over i, j, c1 of x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]."""
    x, W, cot = (np.asarray(a, np.float64) for a in (x, W, cot))
    S, T = x.shape[0] - W.shape[2] + 1, x.shape[1] - W.shape[3] + 1
    out = np.zeros((S, T, W.shape[5], x.shape[3]))
    dx, dW = np.zeros_like(x), np.zeros_like(W)
    for i in range(W.shape[2]):
        for j in range(W.shape[3]):
            xs, Ws = x[i:i + S, j:j + T], W[i:i + S, j:j + T, i, j]     # (s,t,c1,b), (s,t,c1,c2)
            out += np.einsum("stcb,stcd->stdb", xs, Ws)
            dx[i:i + S, j:j + T] += np.einsum("stdb,stcd->stcb", cot, Ws)
            dW[i:i + S, j:j + T, i, j] += np.einsum("stdb,stcb->stcd", cot, xs)
    return out, dx, dW


def matmul_arrays():
    return dict(A=R.standard_normal((M, N)), B=R.standard_normal((N, M)))


def plan_of(expr, options, arrays, gradient=None):
    k = kernel(expr, **options)
    g = gradient or k.gradient_side()
    out = k(**arrays)
    cot = R.standard_normal(np.shape(out)).astype(np.asarray(out).dtype)
    grads = g.vjp(cot, **arrays)
    return k, g.last_plan, cot, grads


def kinds(plan):
    """[(kind, texts of its statements)] in run order."""
    return [(s.kind, [plan.statements[m].text.split("[")[0] for m in s.members])
            for s in plan.steps]


# The local convolution's two gradient statements iterate the same tuples and accumulate
# into their own arrays: fused into one nest when fuse=True.  Its weights are indexed by
# position, so neither statement is a contraction BLAS could run: blas changes nothing.
# (These arrays are small: no threads, so no register blocking.)  The matmul's are pure
# contractions over whole arrays: BLAS when blas=True, whatever fuse says; else one by one,
# both register-blocked: dB[j,k] += A[i,j] * dC[i,k] as it is, dA[i,j] += dC[i,k] * B[j,k]
# (with fuse=True) reading a copy of B with j last (vjp_plan.relaid), not fused with dB.
@pytest.mark.parametrize("expr,arrays,options,want", [
    (CONV, conv_arrays, dict(fuse=True, blas=True), [("fused", ["dx", "dW"])]),
    (CONV, conv_arrays, dict(fuse=True, blas=False), [("fused", ["dx", "dW"])]),
    (CONV, conv_arrays, dict(fuse=False, blas=True), [("loops", ["dx"]), ("loops", ["dW"])]),
    (CONV, conv_arrays, dict(fuse=False, blas=False), [("loops", ["dx"]), ("loops", ["dW"])]),
    (MATMUL, matmul_arrays, dict(fuse=True, blas=True), [("blas", ["dA"]), ("blas", ["dB"])]),
    (MATMUL, matmul_arrays, dict(fuse=False, blas=True), [("blas", ["dA"]), ("blas", ["dB"])]),
    (MATMUL, matmul_arrays, dict(fuse=True, blas=False), [("loops", ["dA"]), ("loops", ["dB"])]),
    (MATMUL, matmul_arrays, dict(fuse=False, blas=False), [("loops", ["dA"]), ("loops", ["dB"])]),
], ids=["conv-fuse-blas", "conv-fuse", "conv-blas", "conv", "mm-fuse-blas", "mm-blas",
        "mm-fuse", "mm"])
def test_steps_of_a_gradient(expr, arrays, options, want):
    arrays = arrays()
    k, plan, cot, grads = plan_of(expr, options, arrays)
    assert kinds(plan) == want
    fused = [s for s in plan.steps if s.kind == "fused"]
    assert all(s.fused is not None and "def _tullio_fused" in s.fused.source.text for s in fused)
    assert all(s.fused is None for s in plan.steps if s.kind != "fused")
    # what the steps write: one zeroed array per input, its shape and dtype
    assert [(a.name, a.input, a.shape, a.dtype) for a in plan.arrays] == [
        ("d" + n, n, v.shape, v.dtype) for n, v in arrays.items()]
    # every statement iterates the forward's ranges (no bare index here leaves its array)
    fwd = {n: (range(r) if isinstance(r, int) else r) for n, r in k.ranges(**arrays).items()}
    assert plan.ranges == tuple((n, r.start, r.stop, r.step) for n, r in fwd.items())
    assert all(vjp_plan.as_ranges(s.ranges) == fwd for s in plan.statements)
    assert plan.cotangent == "d" + k.equation.output
    # and the steps give the gradient (numpy's, for either statement)
    if expr == MATMUL:
        np.testing.assert_allclose(grads["A"], cot @ arrays["B"].T, rtol=1e-12)
        np.testing.assert_allclose(grads["B"], arrays["A"].T @ cot, rtol=1e-12)
    else:
        out, dx, dW = conv_reference(arrays["x"], arrays["W"], cot)
        assert cot.shape == out.shape
        np.testing.assert_allclose(k(**arrays), out, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads["x"], dx, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads["W"], dW, rtol=1e-4, atol=1e-5)


def _fields(obj):
    """Every value inside a plan (dataclass fields and tuples, recursively)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _fields(getattr(obj, f.name))
    elif isinstance(obj, tuple):
        for v in obj:
            yield from _fields(v)
    else:
        yield obj


def test_plan_is_deterministic_frozen_data():
    arrays = conv_arrays()
    k = kernel(CONV)
    plans = []
    for _ in range(2):      # two fresh Gradient objects plan the same call independently
        g = Gradient(k)
        plans.append(plan_of(CONV, {}, arrays, gradient=g)[1])
    a, b = plans
    assert a is not b and a == b and hash(a) == hash(b)
    for obj in [a, a.steps[0], a.statements[0], a.arrays[0], a.steps[0].fused]:
        assert dataclasses.is_dataclass(obj)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, dataclasses.fields(obj)[0].name, None)
    values = list(_fields(a))
    assert not [v for v in values if isinstance(v, (np.ndarray, list, dict, set)) or callable(v)]
    # planned once per call signature: the same plan again, a new one for another layout
    g = Gradient(k)
    _, first, cot, _ = plan_of(CONV, {}, arrays, gradient=g)
    g.vjp(cot, **arrays)
    assert g.last_plan is first
    g.vjp(np.asfortranarray(cot), **arrays)
    assert g.last_plan is not first


class Reference:
    """A vjp_run frontend evaluating each statement with the reference interpreter."""

    def zeros(self, a):
        return np.zeros(a.shape, a.dtype)

    def launch(self, plan, step, ns):
        for m in step.members:
            s = plan.statements[m]
            ns[s.output][...] = evaluate(s.equation, {**ns, **dict(plan.params)},
                                         vjp_plan.as_ranges(s.ranges), out=ns[s.output])


@pytest.mark.parametrize("expr,arrays", [
    (CONV, conv_arrays),
    ("(max) y[i] := x[i,j] * w[j]", lambda: dict(x=R.standard_normal((5, 4)), w=R.standard_normal(4))),
    ("y[i] := s * x[i,j]", lambda: dict(s=np.array(1.5), x=R.standard_normal((3, 4)))),
    ("y[i] := exp(x[i+k] - m) * w[k]", lambda: dict(x=R.standard_normal(7), m=0.5, w=R.standard_normal(3))),
], ids=["conv", "max", "scalar-param", "shifted"])
def test_running_a_plan_gives_the_gradient(expr, arrays):
    arrays = arrays()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k, plan, cot, grads = plan_of(expr, {}, arrays)
    ns = {**arrays, plan.cotangent: cot}
    if vjp_plan.reads(k.gradient_side().last[0], k.equation.output):
        ns[k.equation.output] = k(**arrays)
    got = vjp_run.run(plan, Reference(), ns)
    assert set(got) == set(grads) == {n for n, v in arrays.items() if isinstance(v, np.ndarray)}
    # helpers (the argmax of a (max) reduction) are allocated and run before the gradients
    helpers = [a.name for a in plan.arrays if a.input is None]
    assert bool(helpers) == expr.startswith("(max)")
    assert [s.output for s in plan.statements[:len(helpers)]] == helpers
    assert plan.arrays[:len(helpers)] == tuple(a for a in plan.arrays if a.input is None)
    wide = {n: v.astype(np.float64) if isinstance(v, np.ndarray) else v for n, v in arrays.items()}
    for name, g in got.items():
        tol = 1e-3 if arrays[name].dtype == np.float32 else 1e-6
        ref = finite_difference(kernel(expr), wide, name, cot.astype(np.float64))
        np.testing.assert_allclose(g, ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(grads[name], ref, rtol=tol, atol=tol)


LAYER_NORM = "y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]"


@pytest.mark.parametrize("fuse", [True, False])
def test_column_sums_fuse_with_per_block_partials(fuse, monkeypatch):
    """The layer norm's five gradients run as one nest split over rows i: dg[j] and dbb[j]
    (no i on the left) sum each block of rows into a partial array, added after the loops.
    Odd sizes, a strided x; against numpy's closed forms."""
    from tullio_py import schedule
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)
    x = R.standard_normal((131, 46))[:, 1::2]
    mu, var = x.mean(1), x.var(1)
    arrays = dict(x=x, mu=mu, var=var, eps=1e-5, g=R.standard_normal(23),
                  bb=R.standard_normal(23))
    k, plan, cot, grads = plan_of(LAYER_NORM, dict(fuse=fuse), arrays)
    if fuse:
        assert kinds(plan) == [("fused", ["dx", "dmu", "dvar", "dg", "dbb"])]
        text = plan.steps[0].fused.source.text
        assert "_p3[_c, j_] +=" in text and "_p4[_c, j_] +=" in text, text
    else:
        assert [kd for kd, _ in kinds(plan)] == ["loops"] * 5
    assert [a.name for a in plan.arrays if a.written] == ["dx"]     # assigned, not zeroed
    s = 1 / np.sqrt(var + 1e-5)
    xh = (x - mu[:, None]) * s[:, None]
    dxh = cot * arrays["g"]
    np.testing.assert_allclose(grads["x"], dxh * s[:, None], rtol=1e-10)
    np.testing.assert_allclose(grads["mu"], -(dxh * s[:, None]).sum(1), rtol=1e-10)
    np.testing.assert_allclose(grads["var"], -0.5 * (dxh * xh).sum(1) / (var + 1e-5),
                               rtol=1e-10)
    np.testing.assert_allclose(grads["g"], (cot * xh).sum(0), rtol=1e-10)
    np.testing.assert_allclose(grads["bb"], cot.sum(0), rtol=1e-10)


@pytest.mark.parametrize("expr,arrays,options,written,want", [
    ("y[i,j] := exp(x[i,j] - m[i])",
     lambda: dict(x=R.standard_normal((7, 10))[:, ::2], m=R.standard_normal(7)), {}, ["dx"],
     lambda a, c: {"x": c * np.exp(a["x"] - a["m"][:, None]),
                   "m": -(c * np.exp(a["x"] - a["m"][:, None])).sum(1)}),
    ("y[i,j] := x[i,j] * (j <= i)", lambda: dict(x=R.standard_normal((5, 5))), {}, [],
     lambda a, c: {"x": np.tril(c)}),
    ("y[i] := x[i+k] * w[k]", lambda: dict(x=R.standard_normal(9), w=R.standard_normal(3)),
     {}, [], lambda a, c: {"x": np.convolve(c, a["w"]),
                           "w": np.array([c @ a["x"][k:k + 7] for k in range(3)])}),
    ("y[i,j] := x[i,j] * w[j]", lambda: dict(x=R.standard_normal((5, 4)), w=R.standard_normal(4)),
     dict(ranges={"i": range(0, 3)}), ["dx"],
     lambda a, c: {"x": np.vstack([c * a["w"], np.zeros((2, 4))]),
                   "w": (c * a["x"][:3]).sum(0)}),
], ids=["exp", "mask", "shift", "ranges"])
def test_gradient_written_without_zeroing(expr, arrays, options, written, want, monkeypatch):
    """A gradient array whose one statement writes each element at most once (no reduction,
    mask or shift summing several tuples into one element) is allocated unfilled (NaN here)
    and assigned (`=`), the elements it never writes (rows 3 and 4 of dx under the narrower
    range) zeroed alone; the others accumulate into zeros.  Gradients against numpy."""
    monkeypatch.setattr(vjp_run.Host, "empty", staticmethod(lambda shape, dtype: np.full(
        shape, np.nan, dtype)))
    a = arrays()
    k, plan, cot, grads = plan_of(expr, options, a)
    assert [x.name for x in plan.arrays if x.written] == written
    for s in plan.statements:
        assert (s.equation.assign == "=") == (s.output in written)
        assert " += " in s.text                      # printed and recorded as derived
    for n, g in want(a, cot).items():
        np.testing.assert_allclose(grads[n], g, rtol=1e-12, atol=1e-12)


def test_blas_gradient_written_without_zeroing(monkeypatch):
    """A gradient whose one statement BLAS runs as a contraction over whole arrays is
    allocated unfilled (NaN here: BLAS must write every element) and assigned; two statements
    into one array (dA of A*A) keep zeroing."""
    real = vjp_run.Host.zeros
    monkeypatch.setattr(vjp_run.Host, "zeros", lambda self, a: np.full(a.shape, np.nan, a.dtype)
                        if a.written else real(self, a))
    arrays = matmul_arrays()
    _, plan, cot, grads = plan_of(MATMUL, {}, arrays)
    assert kinds(plan) == [("blas", ["dA"]), ("blas", ["dB"])]
    assert [a.name for a in plan.arrays if a.written] == ["dA", "dB"]
    assert all(s.equation.assign == "=" and " += " in s.text for s in plan.statements)
    np.testing.assert_allclose(grads["A"], cot @ arrays["B"].T, rtol=1e-12)
    np.testing.assert_allclose(grads["B"], arrays["A"].T @ cot, rtol=1e-12)
    A = R.standard_normal((N, N))
    _, plan, cot, grads = plan_of("C[i,k] := A[i,j] * A[j,k]", {}, dict(A=A))
    assert not any(a.written for a in plan.arrays)
    np.testing.assert_allclose(grads["A"], cot @ A.T + A.T @ cot, rtol=1e-12)
