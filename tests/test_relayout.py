"""relayout.py: a statement reading copies of some arrays in another axis order, so that its
loops run register-blocked -- the rule on its worked example and its refusals, and a Kernel
called on its own (not only the vjp's plan) running such statements: the same numbers as
numpy and as its plain loops (to rounding), the same bits as the moved statement on explicit
copies and as the vjp, one choice per call signature."""
import numpy as np
import pytest

from tullio_py import kernel, memo, relayout, tullio
from tullio_py.parse import parse

from test_grad_equations import run_printed

LAYER_DW = "dW[c1,i,j,c2,s,t] += dout[s,t,c2,b] * x[s+i,t+j,c1,b]"
MATMUL_DA = "dA[i,j] += dC[i,k] * B[j,k]"


def rnd(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _layer_arrays(S=13, T=21, C1=3, C2=9, B=7, K=3, dtype=np.float32, order="C"):
    x = rnd(S, T, C1, B, dtype=dtype)
    dout = rnd(S - K + 1, T - K + 1, C2, B, seed=1, dtype=dtype)
    dW = np.zeros((C1, K, K, C2, S - K + 1, T - K + 1), dtype)
    if order == "F":
        x, dout = np.asfortranarray(x), np.asfortranarray(dout)
    elif order == "strided":
        x = np.repeat(x, 2, axis=3)[..., ::2]
        dout = np.repeat(dout, 2, axis=1)[:, ::2]
    return x, dout, dW


def _layer_numpy(x, dout, K=3):
    x, dout = x.astype(np.float64), dout.astype(np.float64)
    S, T = dout.shape[:2]
    dW = np.zeros((x.shape[2], K, K, dout.shape[2], S, T))
    for i in range(K):
        for j in range(K):
            dW[:, i, j] = np.einsum("stdb,stcb->cdst", dout, x[i:i + S, j:j + T])
    return dW


# ----------------------------------------------------------------------------- the rule
def test_axes_on_the_worked_example():
    """t, dW's last index, is axis 1 of dout and of x: both copied with it last; the moved
    statement reads the copies."""
    eq = parse(LAYER_DW)
    x, dout, dW = _layer_arrays(S=32, T=32, C1=8, C2=16, B=16)
    rng = kernel(LAYER_DW).ranges(x=x, dout=dout, dW=dW)
    order = relayout.axes(eq, rng, {"x": x, "dout": dout, "dW": dW})
    assert order == {"dout": (0, 2, 3, 1), "x": (0, 2, 3, 1)}
    assert str(relayout.moved(eq, order)) == \
        "dW[c1, i, j, c2, s, t] += dout[s, c2, b, t] * x[s+i, c1, b, t+j]"
    copies = relayout.copies({"x": x, "dout": dout}, order)
    assert copies["x"].flags.c_contiguous and copies["x"].ctypes.data % 64 == 0
    assert np.array_equal(copies["x"], x.transpose(0, 2, 3, 1))
    assert relayout.copies({"x": x}, {"x": (0, 2, 3, 1)}, run=False)["x"].shape == (32, 8, 16, 32)


@pytest.mark.parametrize("expr,arrays,why", [
    ("y[i,j] := A[i,k] * B[k,j]", dict(A=rnd(64, 64), B=rnd(64, 64)), "j already last"),
    ("y[i,j+1] := A[i,k] * B[j,k]", dict(A=rnd(64, 64), B=rnd(64, 64)), "last index shifted"),
    ("y[i,j] := A[i,k] * B[j,k] * B[k,j]", dict(A=rnd(64, 64), B=rnd(64, 64)),
     "read along j in two axes"),
    ("y[i,j] := A[i,k] * B[j,k]", dict(A=rnd(4, 4), B=rnd(4, 4)), "copies large next to work"),
    ("y[i,j] := A[i,k] * B[J[j],k]", dict(A=rnd(64, 64), B=rnd(64, 64),
                                          J=np.arange(64)), "a gather"),
])
def test_axes_refusals(expr, arrays, why):
    eq = parse(expr)
    rng = kernel(expr).ranges(**arrays)
    assert relayout.axes(eq, rng, arrays) == {}, why


# ----------------------------------------------------------------------------- a Kernel's own call
@pytest.mark.parametrize("order", ["C", "F", "strided"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_call_runs_relaid_like_numpy_and_its_plain_loops(order, dtype, monkeypatch):
    """A locally connected layer's dW called on its own reads relaid copies (explain says so),
    gives numpy's numbers, the same bits as the moved statement run on explicit copies, and its
    plain loops' numbers to rounding; every call of the signature the same bits."""
    k = kernel(LAYER_DW)
    x, dout, dW = _layer_arrays(dtype=dtype, order=order)
    got = k(x=x, dout=dout, dW=dW.copy())
    again = k(x=x, dout=dout, dW=dW.copy())
    assert np.array_equal(got, again)
    rng = k.ranges(x=x, dout=dout, dW=dW)
    order_, moved, _ = relayout.choose(k, k.kernel_for, {"x": x, "dout": dout, "dW": dW}, rng, dW)
    assert order_ == {"dout": (0, 2, 3, 1), "x": (0, 2, 3, 1)}
    copied = relayout.copies({"x": x, "dout": dout}, order_)
    by_hand = tullio(str(moved), dW=dW.copy(), **copied)
    assert np.array_equal(got, by_hand)
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, _layer_numpy(x, dout), rtol=tol, atol=tol)
    monkeypatch.setattr(relayout, "choose", lambda *a, **o: None)
    plain = kernel(LAYER_DW, threads=2)       # (another kernel: nothing remembered)
    want = plain(x=x, dout=dout, dW=dW.copy())
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_a_relaid_call_is_replayed_with_the_arrays_of_each_call(monkeypatch):
    """The fast path remembers a call that ran on relaid copies: later calls with the same
    signature run the copies and the moved loops again on their own arrays (no binding, no
    relayout choice: `choose` is not asked again), accumulate into the given dW, and give
    the same bits as a kernel that runs every call in full."""
    x, dout, dW = _layer_arrays()
    k = kernel(LAYER_DW)
    k(x=x, dout=dout, dW=dW.copy())                 # remembered
    known = len(k.call_cache.entries)
    asked = []
    choose = relayout.choose
    monkeypatch.setattr(relayout, "choose", lambda *a, **o: asked.append(1) or choose(*a, **o))
    for seed in (2, 3):
        x2, dout2 = rnd(*x.shape, seed=seed), rnd(*dout.shape, seed=seed + 10)
        acc = dW.copy()
        assert k(x=x2, dout=dout2, dW=acc) is acc
        assert k(x=x2, dout=dout2, dW=acc) is acc   # += twice
        assert not asked                            # replayed, not chosen again
        want = k._call_full({"x": x2, "dout": dout2, "dW": dW.copy()})
        want = k._call_full({"x": x2, "dout": dout2, "dW": want})
        asked.clear()                               # (the full calls chose)
        assert np.array_equal(acc, want)
        np.testing.assert_allclose(acc, 2 * _layer_numpy(x2, dout2), rtol=1e-4, atol=1e-4)
    assert len(k.call_cache.entries) == known


def test_a_relaid_replay_gives_up_where_an_input_meets_the_output():
    """An input that shares memory with the in-place output: the replay hands the call to
    the full path, which reads a snapshot (the same numbers as on separate arrays)."""
    k = kernel("dA[i,j] += dC[i,k] * B[j,k]", blas=False)
    dC, B = rnd(37, 37), rnd(37, 37, seed=1)
    k(dC=dC, B=B, dA=np.zeros((37, 37), np.float32))      # remembered
    dA = rnd(37, 37, seed=2)
    want = dA.astype(np.float64) + dC.astype(np.float64) @ dA.T.astype(np.float64)
    got = k(dC=dC, B=dA, dA=dA)                           # B is dA
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_relaid_replay_allocates_a_new_output_each_call():
    k = kernel("C[i,j] := A[i,k] * B[j,k]", blas=False)
    A, B = rnd(40, 33), rnd(50, 33, seed=1)
    assert "copy of B with axes (1, 0)" in k.explain(A=A, B=B).detail
    first = k(A=A, B=B)
    second = k(A=A, B=B)
    assert first is not second and np.array_equal(first, second)
    A2 = rnd(40, 33, seed=5)
    np.testing.assert_allclose(k(A=A2, B=B), A2.astype(np.float64) @ B.T.astype(np.float64),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(first, second)          # an earlier output left alone


def test_explain_names_the_copies():
    k = kernel(LAYER_DW)
    x, dout, dW = _layer_arrays(S=32, T=32, C1=8, C2=16, B=16)
    e = k.explain(x=x, dout=dout, dW=dW)
    assert e.path == "loops"
    assert "copy of dout with axes (0, 2, 3, 1)" in e.detail
    assert "copy of x with axes (0, 2, 3, 1)" in e.detail
    assert "register-blocked" in e.detail


def test_matmul_gradient_with_blas_off_relays_the_transposed_read():
    """dA[i,j] += dC[i,k] * B[j,k] with blas=False: B copied as B.T, the row form then
    register-blocked; numpy's numbers, and a non-contiguous B alike."""
    k = kernel(MATMUL_DA, blas=False)
    dC, B = rnd(67, 45), rnd(53, 45, seed=1)
    for b in (B, np.asfortranarray(B), np.repeat(B, 2, axis=1)[:, ::2]):
        rng = k.ranges(dC=dC, B=b, dA=np.zeros((67, 53), np.float32))
        got = relayout.choose(k, k.kernel_for, {"dC": dC, "B": b}, rng,
                              np.zeros((67, 53), np.float32))
        assert got is not None and got[0] == {"B": (1, 0)}
        dA = k(dC=dC, B=b, dA=np.zeros((67, 53), np.float32))
        np.testing.assert_allclose(dA, dC.astype(np.float64) @ b.T.astype(np.float64),
                                   rtol=1e-4, atol=1e-4)


def test_printed_gradient_reproduces_the_vjp_bit_for_bit():
    """The layer's gradient: the vjp's plan reads relaid copies for dW; its printed statements,
    run one by one with tullio(), make the same choice and so the same bits."""
    k = kernel("out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[c1,i,j,c2,s,t]")
    x, dout, _ = _layer_arrays(S=18, T=20, C1=3, C2=5, B=4)
    W = rnd(3, 3, 3, 5, 16, 18, seed=3)
    out = k(x=x, W=W)
    g = k.vjp(dout, x=x, W=W)
    assert any(s.relayout for s in k.gradient_side().last_plan.statements)
    p = run_printed(k, dout, dict(x=x, W=W), out)
    assert np.array_equal(p["W"], g["W"]) and np.array_equal(p["x"], g["x"])


@pytest.mark.parametrize("fuse", [True, False])
def test_gradient_code_names_the_copies_either_way(fuse):
    """With fuse=True the vjp's plan reads B.T; with fuse=False dA's own kernel does (its
    call's relayout): the printed gradient code says so in both, and the numbers agree."""
    k = kernel("C[i,k] := A[i,j] * B[j,k]", blas=False, fuse=fuse)
    A, B = rnd(70, 45), rnd(45, 38, seed=1)
    cot = rnd(70, 38, seed=2)
    g = k.vjp(cot, A=A, B=B)
    np.testing.assert_allclose(g["A"], cot.astype(np.float64) @ B.T.astype(np.float64),
                               rtol=1e-4, atol=1e-4)
    code = k.gradient_code
    assert "# reads a C-ordered copy of B with axes (1, 0) (relayout.py)" in code
    assert "dC[i, k] * B[k, j]" in code      # the statement that ran (fuse: as '=')


# ----------------------------------------------------------------------------- padded copies
CONV1D_DX = "dx[b, c, p] += dy[b, o, pad(p-j)] * w[o, c, j]"
NCHW_DX = "dx[b, c, p, q] += dy[b, o, pad(p-i), pad(q-j)] * w[o, c, i, j]"
NHWC_DX = "dx[b, p, q, c] += dy[b, pad(p-i), pad(q-j), o] * w[i, j, c, o]"


def _conv_dx_case(name, dtype=np.float32, layout="C"):
    """(statement, arrays, numpy's dx in float64) of a convolution's input gradient."""
    if name == "conv1d":
        dy, w = rnd(5, 12, 70, dtype=dtype), rnd(12, 9, 5, seed=1, dtype=dtype)
        dyp = np.pad(dy.astype(np.float64), ((0, 0), (0, 0), (4, 4)))
        want = sum(np.einsum("bop,oc->bcp", dyp[:, :, 4 - j:78 - j], w[:, :, j].astype(np.float64))
                   for j in range(5))
        expr, arrays = CONV1D_DX, {"dy": dy, "w": w, "dx": np.zeros((5, 9, 74), dtype)}
    elif name == "nchw":
        dy, w = rnd(3, 10, 19, 21, dtype=dtype), rnd(10, 6, 3, 3, seed=1, dtype=dtype)
        dyp = np.pad(dy.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)))
        want = sum(np.einsum("bopq,oc->bcpq", dyp[:, :, 2 - i:23 - i, 2 - j:25 - j],
                             w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))
        expr, arrays = NCHW_DX, {"dy": dy, "w": w, "dx": np.zeros((3, 6, 21, 23), dtype)}
    else:
        dy, w = rnd(3, 19, 21, 10, dtype=dtype), rnd(3, 3, 20, 10, seed=1, dtype=dtype)
        dyp = np.pad(dy.astype(np.float64), ((0, 0), (2, 2), (2, 2), (0, 0)))
        want = sum(np.einsum("bpqo,co->bpqc", dyp[:, 2 - i:23 - i, 2 - j:25 - j],
                             w[i, j].astype(np.float64)) for i in range(3) for j in range(3))
        expr, arrays = NHWC_DX, {"dy": dy, "w": w, "dx": np.zeros((3, 21, 23, 20), dtype)}
    if layout == "strided":
        arrays["dy"] = np.repeat(arrays["dy"], 2, axis=1)[:, ::2]
    elif layout == "F":
        arrays["dy"] = np.asfortranarray(arrays["dy"])
    return expr, arrays, want


def test_pads_on_the_worked_example():
    """conv1d's dx: p-j runs from -4 to 73 on dy's 70 along axis 2: 4 pad values before and
    after; the moved statement reads p-j+4; the copy holds dy inside and 0 around it."""
    expr, arrays, _ = _conv_dx_case("conv1d")
    k = kernel(expr)
    rng = k.ranges(**arrays)
    assert relayout.pads(parse(expr), rng, arrays) == {"dy": ((0, 0), (0, 0), (4, 4))}
    got = relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"])
    assert got is not None
    order, moved, _ = got
    assert str(moved) == "dx[b, c, p] += dy[b, o, p-j+4] * w[o, c, j]"
    assert order["dy"].describe("dy") == "a copy of dy padded with 0 (4 before and 4 after axis 2)"
    copy = relayout.copies(arrays, order)["dy"]
    assert copy.shape == (5, 12, 78) and copy.flags.c_contiguous
    assert np.array_equal(copy[:, :, 4:74], arrays["dy"])
    assert not copy[:, :, :4].any() and not copy[:, :, 74:].any()
    assert relayout.in_bounds(moved, rng, relayout.copies(arrays, order, run=False))
    assert not relayout.in_bounds(moved, rng, arrays)       # dy itself is too short


# Every layout of dy gives the same C-contiguous padded copy (and the same moved kernel): the
# layouts differ only in the copy's source and in the plain loops', so each layout is run once
# per statement, float64 on C order (each case compiles its plain loops anew).
_PADDED_CASES = [(name, dtype, layout) for name in ("conv1d", "nchw", "nhwc")
                 for dtype, layout in ((np.float32, "C"), (np.float32, "F"),
                                       (np.float32, "strided"), (np.float64, "C"))]


@pytest.mark.parametrize("name,dtype,layout", _PADDED_CASES)
def test_padded_copy_call_equals_numpy_and_the_plain_loops(name, dtype, layout, monkeypatch):
    """A convolution's input gradient called on its own (blas=False: the loops, on a padded
    copy of dy) gives numpy's numbers, the moved statement's bits on explicit copies, the same
    bits call after call, and its plain loops' numbers to rounding (relayout switched off)."""
    expr, arrays, want = _conv_dx_case(name, dtype, layout)
    k = kernel(expr, blas=False)
    rng = k.ranges(**arrays)
    order, moved, _ = relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"])
    assert any(lo or hi for lo, hi in relayout.Copy.of(order["dy"]).pads)
    assert "padded with 0" in k.explain(**{**arrays, "dx": arrays["dx"].copy()}).detail
    got = k(**{**arrays, "dx": arrays["dx"].copy()})
    assert np.array_equal(got, k(**{**arrays, "dx": arrays["dx"].copy()}))
    by_hand = tullio(str(moved), blas=False, dx=arrays["dx"].copy(),
                     **relayout.copies({"dy": arrays["dy"], "w": arrays["w"]}, order))
    assert np.array_equal(got, by_hand)
    tol = 2e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    monkeypatch.setattr(relayout, "choose", lambda *a, **o: None)
    plain = kernel(expr, blas=False, threads=2)(**{**arrays, "dx": arrays["dx"].copy()})
    np.testing.assert_allclose(got, plain, rtol=tol, atol=tol)


def test_padded_copy_with_a_pad_value_and_accumulation():
    """pad=1.5: the loops read 1.5 outside dy, and so does a copy filled with it; the moved
    statement on that copy, accumulating onto dx, gives numpy's numbers.  (Such a call keeps
    its own loops: with a pad value that is not 0 the read is no guard, and they are
    register-blocked already.)"""
    expr, arrays, _ = _conv_dx_case("conv1d", np.float64)
    k = kernel(expr, blas=False, pad=1.5)
    rng = k.ranges(**arrays)
    assert relayout.padded(k, rng, arrays) == {"dy": ((0, 0), (0, 0), (4, 4))}
    assert relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"]) is None
    order = {"dy": relayout.Copy((0, 1, 2), ((0, 0), (0, 0), (4, 4)), 1.5)}
    copy = relayout.copies(arrays, order)["dy"]
    assert (copy[:, :, :4] == 1.5).all() and (copy[:, :, 74:] == 1.5).all()
    start = rnd(*arrays["dx"].shape, seed=5, dtype=np.float64)
    moved = relayout.moved(parse(expr), order)
    by_hand = tullio(str(moved), blas=False, dx=start.copy(), dy=copy, w=arrays["w"])
    dyp = np.pad(arrays["dy"], ((0, 0), (0, 0), (4, 4)), constant_values=1.5)
    want = start + sum(np.einsum("bop,oc->bcp", dyp[:, :, 4 - j:78 - j], arrays["w"][:, :, j])
                       for j in range(5))
    np.testing.assert_allclose(by_hand, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k(**{**arrays, "dx": start.copy()}), want, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_other_factor_keeps_the_guarded_loops(bad, monkeypatch):
    """Under a sum with pad 0 the loops skip the terms outside dy; a copy would add 0 * w
    there, NaN for an infinite or NaN w.  Such a call keeps its loops (the same NaNs and
    values as with relayout switched off); the next finite call pads again."""
    expr, arrays, _ = _conv_dx_case("conv1d", np.float64)
    k = kernel(expr, blas=False)
    rng = k.ranges(**arrays)
    w = arrays["w"].copy()
    w[3, 2, 4] = bad
    odd = {**arrays, "w": w}
    assert relayout.choose(k, k.kernel_for, odd, rng, arrays["dx"]) is None
    got = k(**{**odd, "dx": arrays["dx"].copy()})
    assert relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"]) is not None
    monkeypatch.setattr(relayout, "choose", lambda *a, **o: None)
    want = kernel(expr, blas=False)(**{**odd, "dx": arrays["dx"].copy()})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got, want)


def test_choice_is_weighed_once_per_signature_and_values_checked_per_call(monkeypatch):
    """choose weighs a signature once (the values padded() checks taken as finite) and
    checks those values on every call: a later call with an infinite w keeps the guarded
    loops, and the finite call after it pads again without being weighed anew."""
    expr, arrays, _ = _conv_dx_case("conv1d", np.float64)
    k = kernel(expr, blas=False)
    rng = k.ranges(**arrays)
    # the kernel is shared with the tests above, which may have weighed this signature already
    monkeypatch.setattr(relayout, "_CHOICES", memo.Memo("test.choices", 8))
    weighed = []
    inner = relayout._choose
    monkeypatch.setattr(relayout, "_choose", lambda *a: weighed.append(a[6]) or inner(*a))
    first = relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"])
    assert first is not None and weighed == [True]
    assert relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"]) == first
    assert weighed == [True]
    w = arrays["w"].copy()
    w[1, 2, 0] = np.inf
    assert relayout.choose(k, k.kernel_for, {**arrays, "w": w}, rng, arrays["dx"]) is None
    assert weighed == [True, False]
    assert relayout.choose(k, k.kernel_for, arrays, rng, arrays["dx"]) == first
    assert weighed == [True, False]


@pytest.mark.parametrize("expr,why", [
    ("dx[b, c, p] += dy[b, o, pad(p-j)] * w[o, c, j] * v[c]", "three factors under pad 0"),
    ("dx[b, c, p] += dy[b, o, pad(p-j, 4, 4)] * w[o, c, j]", "a pad with bounds of its own"),
])
def test_padded_copy_refusals(expr, why):
    _, arrays, _ = _conv_dx_case("conv1d", np.float64)
    if "v[c]" in expr:
        arrays["v"] = np.ones(9)
    else:
        arrays["dx"] = np.zeros((5, 9, 82))
    k = kernel(expr, blas=False)
    assert relayout.padded(k, k.ranges(**arrays), arrays) == {}, why


def test_pad_value_that_the_array_cannot_hold_is_refused():
    """An integer dy cannot hold the pad value 1.5: no padded copy (the loops read 1.5 as a
    float)."""
    _, arrays, _ = _conv_dx_case("conv1d", np.float64)
    arrays["dy"] = np.arange(arrays["dy"].size).reshape(arrays["dy"].shape) % 7
    k = kernel(CONV1D_DX, blas=False, pad=1.5)
    assert relayout.padded(k, k.ranges(**arrays), arrays) == {}
    assert relayout.padded(kernel(CONV1D_DX, blas=False, pad=2.0),
                           k.ranges(**arrays), arrays) != {}


def test_shifted_left_side_runs_as_the_padded_gather():
    """dx[b,c,i+j] += dy[b,o,i] * w[o,c,j] (conv1d's gradient as the vjp holds it) runs as the
    gather its loops run, the mask its pad read implies dropped, on a padded copy of dy: the
    printed statement's bits; the vjp's dx and the printed gradient run alone agree bit for
    bit, with numpy's numbers; gradient_code names the copy."""
    _, arrays, want = _conv_dx_case("conv1d", np.float64)
    scatter = kernel("dx[b, c, i+j] += dy[b, o, i] * w[o, c, j]", blas=False)
    rng = scatter.ranges(**arrays)
    order, moved, mrng = relayout.choose(scatter, scatter.kernel_for, arrays, rng, arrays["dx"])
    assert str(moved) == "dx[b, c, p] += dy[b, o, p-j+4] * w[o, c, j]"
    assert set(mrng) == {"b", "c", "p", "o", "j"} and len(mrng["p"]) == 74
    got = scatter(**{**arrays, "dx": arrays["dx"].copy()})
    printed = kernel(CONV1D_DX, blas=False)(**{**arrays, "dx": arrays["dx"].copy()})
    assert np.array_equal(got, printed)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    fwd = kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", blas=False)
    x = rnd(5, 9, 74, seed=4, dtype=np.float64)
    y = fwd(x=x, w=arrays["w"])
    for fuse in (True, False):
        k = kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]", blas=False, fuse=fuse)
        g = k.vjp(arrays["dy"], x=x, w=arrays["w"])
        p = run_printed(k, arrays["dy"], dict(x=x, w=arrays["w"]), y)
        assert np.array_equal(g["x"], p["x"]) and np.array_equal(g["x"], got)
        assert "# reads a copy of dy padded with 0 (4 before and 4 after axis 2)" in \
            k.gradient_code


def test_part_of_the_range_keeps_the_mask_and_the_loops():
    """Over part of i (a dask block), the rewritten gather keeps its mask (it is not the pad
    read's guard): no padded copy, and the plain loops' numbers."""
    _, arrays, _ = _conv_dx_case("conv1d", np.float64)
    scatter = kernel("dx[b, c, i+j] += dy[b, o, i] * w[o, c, j]", blas=False)
    rng = dict(scatter.ranges(**arrays))
    rng["i"] = range(10, 40)
    assert relayout.choose(scatter, scatter.kernel_for, arrays, rng, arrays["dx"]) is None
    out = np.zeros_like(arrays["dx"])
    scatter.run_with_ranges({"dy": arrays["dy"], "w": arrays["w"]}, rng, out, {})
    want = np.zeros_like(out)
    for j in range(5):
        want[:, :, 10 + j:40 + j] += np.einsum("boi,oc->bci", arrays["dy"][:, :, 10:40],
                                               arrays["w"][:, :, j])
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-11)


# ----------------------------------------------------------------------------- scratch output
NCHW_WIDE = "dx[b, c, p, q] {op} dy[b, o, pad(p-i), pad(q-j)] * w[o, c, i, j]"


def _nchw_wide(dtype, seed=5):
    """conv2d NCHW's input gradient with rows of 34 (tiles of 32 float32 / 16 float64 waste
    1.88 / 1.41) and 32 channels of dx: relayout's scratch output applies."""
    dy, w = rnd(2, 8, 32, 32, seed=seed, dtype=dtype), rnd(8, 32, 3, 3, seed=seed + 1, dtype=dtype)
    dyp = np.pad(dy.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)))
    want = sum(np.einsum("bopq,oc->bcpq", dyp[:, :, 2 - i:36 - i, 2 - j:36 - j],
                         w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))
    return dy, w, want


@pytest.mark.parametrize("op,dtype", [("+=", np.float32), ("-=", np.float32),
                                      ("=", np.float32), ("+=", np.float64)])
def test_scratch_output_equals_numpy_and_the_plain_loops(op, dtype, monkeypatch):
    """Rows that waste their tiles run on a scratch output with the channels in the lanes
    (explain says so): numpy's numbers for every assignment (the old values of dx added,
    subtracted or overwritten), the same bits call after call and as the moved statement run
    by hand on explicit copies, and the plain (unscratched) loops' numbers to rounding."""
    dy, w, conv = _nchw_wide(dtype)
    old = rnd(2, 32, 34, 34, seed=9, dtype=dtype)
    expr = NCHW_WIDE.format(op=op)
    k = kernel(expr, blas=False)
    args = {"dy": dy, "w": w, "dx": old}
    rng = k.ranges(**args)
    order, moved, _ = relayout.choose(k, k.kernel_for, args, rng, old)
    assert order["dx"] == relayout.Output((0, 2, 3, 1))
    assert str(moved) == "dx[b, p, q, c] := dy[b, p-i+2, q-j+2, o] * w[i, j, o, c]"
    assert "a scratch of dx with axes (0, 2, 3, 1)" in k.explain(
        **{n: (v.copy() if n == "dx" else v) for n, v in args.items()}).detail

    def call(kern):
        return kern(**{n: (v.copy() if n == "dx" else v) for n, v in args.items()})
    got = call(k)
    assert np.array_equal(got, call(k))
    scratch = tullio(str(moved), **relayout.copies({"dy": dy, "w": w}, order))
    back = np.transpose(scratch, (0, 3, 1, 2))
    by_hand = {"+=": old + back, "-=": old - back, "=": back}[op]
    assert np.array_equal(got, by_hand)
    want = {"+=": old + conv, "-=": old - conv, "=": conv}[op]
    tol = 3e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    monkeypatch.setattr(relayout, "WASTE", float("inf"))
    plain = kernel(expr, blas=False)
    assert "scratch" not in plain.explain(
        **{n: (v.copy() if n == "dx" else v) for n, v in args.items()}).detail
    np.testing.assert_allclose(got, call(plain), rtol=tol, atol=tol)


def test_scratch_output_needs_the_whole_output_and_enough_values():
    """No scratch over part of the output (a block of p), nor for 16 channels (fewer than
    SCRATCH_ROW): the padded copy alone."""
    dy, w, _ = _nchw_wide(np.float32)
    k = kernel(NCHW_WIDE.format(op="+="), blas=False)
    dx = np.zeros((2, 32, 34, 34), np.float32)
    rng = dict(k.ranges(dy=dy, w=w, dx=dx))
    rng["p"] = range(0, 20)
    got = relayout.choose(k, k.kernel_for, {"dy": dy, "w": w, "dx": dx}, rng, dx)
    assert got is None or "dx" not in got[0]
    k16 = kernel(NCHW_WIDE.format(op="+="), blas=False)
    arrays = {"dy": dy, "w": np.ascontiguousarray(w[:, :16]), "dx": dx[:, :16].copy()}
    got = relayout.choose(k16, k16.kernel_for, arrays, k16.ranges(**arrays), arrays["dx"])
    assert got is not None and "dx" not in got[0]


def test_vjp_on_a_scratch_output_equals_the_printed_gradient_bit_for_bit():
    """conv2d NCHW's vjp: its dx (a shifted left side, run as the padded gather on a scratch
    output) equals the printed gradient run alone bit for bit, and numpy's numbers;
    gradient_code names the scratch."""
    dy, w, want = _nchw_wide(np.float64)
    x = rnd(2, 32, 34, 34, seed=7, dtype=np.float64)
    k = kernel("y[b,o,h,v] := x[b,c,h+i,v+j] * w[o,c,i,j]", blas=False)
    y = k(x=x, w=w)
    g = k.vjp(dy, x=x, w=w)
    p = run_printed(k, dy, dict(x=x, w=w), y)
    assert np.array_equal(g["x"], p["x"])
    np.testing.assert_allclose(g["x"], want, rtol=1e-11, atol=1e-11)
    assert "a scratch of dx with axes (0, 2, 3, 1)" in k.gradient_code


def test_scratch_is_weighed_against_blas_in_place_of_the_padded_copy():
    """On one thread (a budget of one, as under torch at one thread) the padded copy's loops
    (tiles of 32 over rows of 34) lose to BLAS in the cost model, while the scratch's do not:
    BLAS is weighed against the loops that would run, the scratch's, and the call takes them
    (before, the padded copy's loss sent the statement to its own BLAS plan: 6.5-8.5 ms
    against the scratch's 4.9 ms on an AMD Zen 5)."""
    from tullio_py import jit
    dy, w = rnd(16, 64, 32, 32, seed=3), rnd(64, 32, 3, 3, seed=4)
    dx = np.zeros((16, 32, 34, 34), np.float32)
    k = kernel(NCHW_WIDE.format(op="+="), threads=1)
    args = {"dy": dy, "w": w, "dx": dx}
    with jit.thread_budget(1, 0):
        got = relayout.choose(k, k.kernel_for, args, k.ranges(**args), dx)
    assert got is not None and got[0]["dx"] == relayout.Output((0, 2, 3, 1))


# ----------------------------------------------------------------------------- short rows
NCHW_DW = "dW[o,c,i,j] := dy[b,o,p,q] * x[b,c,p+i,q+j]"
CONV1D_DW = "dw[o,c,j] := dy[b,o,i] * x[b,c,i+j]"


def _dw_want(expr, dy, x):
    dy, x = dy.astype(np.float64), x.astype(np.float64)
    if expr == NCHW_DW:
        K = x.shape[2] - dy.shape[2] + 1
        sw = np.lib.stride_tricks.sliding_window_view(x, dy.shape[2:], axis=(2, 3))[:, :, :K, :K]
        return np.einsum("bopq,bcijpq->ocij", dy, sw)
    K = x.shape[2] - dy.shape[2] + 1
    sw = np.lib.stride_tricks.sliding_window_view(x, dy.shape[2], axis=2)[:, :, :K]
    return np.einsum("boi,bcji->ocj", dy, sw)


@pytest.mark.parametrize("expr,shapes,order,dtype", [   # (each case compiles 4 kernels)
    (NCHW_DW, ((3, 23, 9, 10), (3, 60, 11, 12)), {"x": (0, 2, 3, 1)}, np.float32),
    (CONV1D_DW, ((4, 23, 40), (4, 60, 44)), {"x": (0, 2, 1)}, np.float64),
])
def test_short_row_scratch_equals_numpy_and_the_plain_loops(expr, shapes, order, dtype,
                                                            monkeypatch):
    """A weight gradient whose last index (the kernel's width) is too short for the lanes
    runs on a scratch output with the input channels there (c: 60 values, o: 23, leaving
    remainders of the tiles and of the jam factor), reading x copied with c last and dy as it is: numpy's numbers,
    the same bits call after call and as the moved statement run by hand, the plain loops'
    numbers to rounding; BLAS off (a kernel with BLAS weighs it, below)."""
    dy, x = rnd(*shapes[0], seed=1, dtype=dtype), rnd(*shapes[1], seed=2, dtype=dtype)
    k = kernel(expr, blas=False)
    out = np.zeros(_dw_want(expr, dy, x).shape, dtype)
    args = {"dy": dy, "x": x}
    order_got, moved, _ = relayout.choose(k, k.kernel_for, args, k.ranges(**args), out)
    c = len(out.shape) - 1
    assert {n: v for n, v in order_got.items() if n != k.equation.output} == \
        {n: relayout.Copy(a, (), 0) for n, a in order.items()}
    assert order_got[k.equation.output] == relayout.Output(
        tuple(d for d in range(c + 1) if d != 1) + (1,))
    assert "on a scratch of d" in k.explain(**args).detail
    got = k(**args)
    assert np.array_equal(got, k(**args))
    scratch = tullio(str(moved), **relayout.copies(args, order_got))
    assert np.array_equal(got, np.moveaxis(scratch, -1, 1))
    tol = 2e-4 if dtype == np.float32 else 1e-11
    want = _dw_want(expr, dy, x)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    monkeypatch.setattr(relayout, "SCRATCH_ROW", 1 << 20)     # (a key of the choice)
    plain = kernel(expr, blas=False)
    assert "scratch" not in plain.explain(**args).detail
    np.testing.assert_allclose(got, plain(**args), rtol=tol, atol=tol * np.abs(want).max())


def test_short_row_scratch_refusals():
    """Not where the statement's own loops already block (conv2d NHWC's dW, o last and long),
    nor where no left index has SCRATCH_ROW values (16 channels each side)."""
    dy, x = rnd(2, 9, 10, 40), rnd(2, 11, 12, 33, seed=1)
    k = kernel("dW[i,j,c,o] := dy[b,p,q,o] * x[b,p+i,q+j,c]", blas=False)
    out = np.zeros((3, 3, 33, 40), np.float32)
    assert relayout.choose(k, k.kernel_for, {"dy": dy, "x": x}, k.ranges(dy=dy, x=x), out) \
        is None
    dy, x = rnd(3, 16, 9, 10), rnd(3, 16, 11, 12, seed=1)
    k = kernel(NCHW_DW, blas=False)
    out = np.zeros((16, 16, 3, 3), np.float32)
    assert relayout.choose(k, k.kernel_for, {"dy": dy, "x": x}, k.ranges(dy=dy, x=x), out) \
        is None


def test_conv_gradient_on_short_row_scratch_equals_printed_and_gradcheck():
    """conv2d NCHW's vjp (dW on the short-row scratch, dx on the padded copy's): the printed
    gradient run alone reproduces it bit for bit, and torch's gradcheck passes in float64."""
    torch = pytest.importorskip("torch")
    x, w = rnd(2, 60, 11, 12, seed=3, dtype=np.float64), rnd(23, 60, 3, 3, seed=4,
                                                            dtype=np.float64)
    k = kernel("y[b,o,p,q] := x[b,c,p+i,q+j] * w[o,c,i,j]")
    y = k(x=x, w=w)
    dy = rnd(*y.shape, seed=5, dtype=np.float64)
    g = k.vjp(dy, x=x, w=w)
    assert "a scratch of dw" in k.gradient_code
    p = run_printed(k, dy, dict(x=x, w=w), y)
    assert np.array_equal(g["w"], p["w"]) and np.array_equal(g["x"], p["x"])
    np.testing.assert_allclose(g["w"], _dw_want(NCHW_DW, dy, x), rtol=1e-11, atol=1e-10)
    xt = torch.tensor(x[:1, :, :7, :6], requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: k(x=a, w=b), (xt, wt))
