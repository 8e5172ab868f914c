"""Consecutive statements sharing a row index run block of rows by block of rows
(codegen/rows.py's rule; vjp_rows.py groups a vjp plan's steps so): the rule on statements,
and gradients run so against the same statements run one by one (fuse=False, bit for bit),
numpy, and torch, on odd sizes, strided inputs, NaN and inf, on 1 and 2 threads."""
import numpy as np
import pytest

from tullio_py import jit, kernel
from tullio_py.codegen.rows import block_rows, row_index
from tullio_py.parse import parse

SOFTMAX = ["(max) m[i] := x[i,j]", "e[i,j] := exp(x[i,j] - m[i])", "z[i] := e[i,j]",
           "y[i,j] := e[i,j] / z[i]"]


def members(texts, ranges=None):
    ranges = ranges or [{"i": range(0, 7), "j": range(0, 5)}] * len(texts)
    return [([parse(t)], r) for t, r in zip(texts, ranges)]


@pytest.mark.parametrize("texts,want", [
    (SOFTMAX, "i"),                                                   # the docstring's example
    (SOFTMAX[:1] + ["e[i,j] := exp(x[i,j] - m[i+1])"], None),         # m's next row: not yet
    (SOFTMAX[:3] + ["y[i,j] := e[j,i] / z[i]"], None),                # e read with i elsewhere
    (SOFTMAX[:2] + ["g[j] := e[i,j]"], None),                         # a column sum
    (["y[i,j] := x[i+1,j] * w[j-i]", "z[i] := y[i,j]"], "i"),        # inputs: read anywhere
    (["m[i] := x[i,j]", "y[i] := w[k] * (k == m[i])"], "i"),
    (["m[i] := x[i,j]", "y[i] := w[J[i]]", "J[i] := x[i,j]"], None),  # J, written, in a gather
    (["y[j,i] := x[i,j]", "z[i] := y[j,i]"], "i"),                     # i second, as written
    (["y[j,i] := x[i,j]", "z[i] := y[i,j]"], None),                    # y read transposed
    (["y[i,i] := x[i]", "z[i] := y[i,i]"], None),                      # i twice on the left
    (SOFTMAX[:1], None),                                               # nothing to group
    (SOFTMAX[:2] + ["g[j] += e[i,j]"], "i"),        # a column sum added to: block partials
    (["m[i] := x[i,j]", "g[j] += x[i,j]", "y[i,j] := x[i,j] * g[j]"], None),  # ... read
    (["m[i] := x[i,j]", "g[j] += x[i,j]", "g[j] := x[0,j]"], None),   # ... also stored
    (["g[j] += x[i,j]", "h[j] += x[i,j] * 2"], "j"),                  # rows of j, not columns
    (["s += x[i]", "t += x[i] * 2"], None),                            # column sums only
    (["y[i,j] := x[i,j]", "g[J[i]] += y[i,j]"], None),                 # a scatter
    (["s += x[i]", "y[i] += x[i] * s"], None),                         # 0-d, read as a scalar
])
def test_rule(texts, want):
    assert row_index(members(texts)) == want


def test_rule_needs_the_same_range():
    a, b = {"i": range(0, 7), "j": range(0, 5)}, {"i": range(1, 7), "j": range(0, 5)}
    assert row_index(members(SOFTMAX[:2], [a, a])) == "i"
    assert row_index(members(SOFTMAX[:2], [a, b])) is None
    assert row_index(members(SOFTMAX[:2], [a, {"j": range(0, 5)}])) is None   # i fixed in code


def test_block_rows():
    assert block_rows(4096, 8 * 2048) == 16
    assert block_rows(5, 8) == 5 and block_rows(100, 1 << 30) == 1 and block_rows(0, 8) == 1


@pytest.mark.parametrize("rows", [1, 3, 16, 255])
@pytest.mark.parametrize("shape,dtype", [((4096,), np.float32), ((9, 3), np.float64),
                                         ((9, 5), np.complex64), ((9, 16), np.float32),
                                         ((9, 0), np.float32)])
def test_the_rows_two_threads_write_are_a_cache_line_apart(rows, shape, dtype):
    """A block-local buffer (vjp_rows.local_buffers): a slot per thread holding a block's rows;
    rows shorter than a cache line get unused rows after them, so that the bytes two threads
    write are at least a line apart wherever the buffer starts (numpy's 16-byte alignment
    included): no line is written by two threads."""
    from types import SimpleNamespace

    from tullio_py import memory, vjp_rows
    from tullio_py.codegen.rows import local_arg
    like = np.empty(shape, dtype)
    f = SimpleNamespace(consts=(("_rows", rows),), local=("t",))
    row = like.itemsize * int(np.prod(shape[1:]))
    for empty in (np.empty, memory.empty):
        bufs = vjp_rows.local_buffers(f, {"t": like}, empty)
        assert list(bufs) == [local_arg("t")]
        buf = bufs[local_arg("t")]
        assert buf.shape[0] == jit.max_threads() and buf.shape[2:] == shape[1:]
        assert buf.dtype == dtype and buf.flags.c_contiguous and buf.shape[1] >= rows
        if 0 < row < memory.ALIGN:
            assert buf.strides[0] - rows * row >= memory.ALIGN     # the gap between slots
            assert buf.shape[1] < rows + memory.ALIGN
        else:
            assert buf.shape[1] == rows


def test_column_sum_groups_keep_their_own_block_size(monkeypatch):
    """A row group with column sums takes blocks of SUMS_BLOCK_BYTES (each block adds a
    partial array), the others blocks of BLOCK_BYTES."""
    from tullio_py import chain as chain_mod, chain_grad
    monkeypatch.setattr(chain_grad, "BLOCK_BYTES", 1 << 11)
    monkeypatch.setattr(chain_grad, "SUMS_BLOCK_BYTES", 1 << 14)
    args, dy = _ln_data("c", np.float64)
    k = chain_mod.Chain(LN, kernel(LN).options)
    k.vjp(dy, **args)
    (step,) = k.gradient_plan.steps
    assert step.rows.partial == ("dg", "dbb")
    per_row = dict(step.rows.consts)["_rows"]
    monkeypatch.setattr(chain_grad, "SUMS_BLOCK_BYTES", 1 << 11)
    k2 = chain_mod.Chain(LN, kernel(LN).options)
    k2.vjp(dy, **args)
    assert dict(k2.gradient_plan.steps[0].rows.consts)["_rows"] * 4 <= per_row
    sm = chain_mod.Chain("; ".join(SOFTMAX), kernel("; ".join(SOFTMAX), nograd=("m",)).options)
    x = np.random.default_rng(3).standard_normal((53, 19))
    sm.vjp(x, x=x)
    (step,) = [s for s in sm.gradient_plan.steps if s.rows]
    assert not step.rows.partial
    # a row of dy, e and dx, an element of z and dz (de is inlined into dx: vjp_inline.py)
    row = 3 * 19 * 8 + 2 * 8
    assert dict(step.rows.consts)["_rows"] == block_rows(53, row, 1 << 11) == (1 << 11) // row


# ----------------------------------------------------------------------------- gradients
# The argmax helper of a (max) and the gradient reading it; with a second input, a helper
# and a fused nest of two gradients (codegen/fused.py) as the group's members.
MAX = "(max) m[i] := x[i,j]"
MAXW = "(max) y[i] := x[i,j] * w[i,j]"
K_MAX, K_MAX0 = kernel(MAX, threads=True), kernel(MAX, threads=True, fuse=False)
K_MAXW, K_MAXW0 = kernel(MAXW, threads=True), kernel(MAXW, threads=True, fuse=False)


def data(layout, shape=(37, 23), seed=0):
    r = np.random.default_rng(seed)
    if layout == "transposed":
        x = r.standard_normal(shape[::-1]).T
    elif layout == "strided":
        x = r.standard_normal((shape[0], 2 * shape[1]))[:, ::2]
    else:
        x = r.standard_normal(shape)
    x[3, 5] = np.nan
    x[4, :] = -np.inf
    x[5, 2] = np.inf
    x[6, 1] = x[6, 7] = 9.0         # a tie: the first one gets the gradient
    return x, r


def first_argmax(v):
    return np.argmax(v)             # the first NaN, else the first maximal element


@pytest.fixture
def grouped(monkeypatch):
    """Row groups on (vjp_rows.ENABLED: off by default) for a fresh kernel's plans."""
    from tullio_py import vjp_rows
    monkeypatch.setattr(vjp_rows, "ENABLED", True)


def test_row_groups_are_off_by_default():
    x, r = data("c", shape=(29, 17), seed=3)       # a signature no grouped test plans
    k = kernel(MAX, threads=True)
    k.vjp(r.standard_normal(x.shape[0]), x=x)
    assert [s.kind for s in k.gradient_side().last_plan.steps] == ["loops", "loops"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["c", "transposed", "strided"])
def test_argmax_gradient_runs_by_rows(layout, threads, grouped):
    x, r = data(layout)
    dm = r.standard_normal(x.shape[0])
    with jit.thread_budget(threads):
        got = K_MAX.vjp(dm, x=x)["x"]
        plain = K_MAX0.vjp(dm, x=x)["x"]
    steps = K_MAX.gradient_side().last_plan.steps
    assert [s.kind for s in steps] == ["rows"]
    assert [s.kind for s in K_MAX0.gradient_side().last_plan.steps] == ["loops", "loops"]
    assert np.array_equal(got, plain, equal_nan=True)
    want = np.zeros_like(x)
    for i in range(x.shape[0]):
        want[i, first_argmax(x[i])] = dm[i]
    assert np.array_equal(got, want)
    assert "(rows)" in K_MAX.gradient_code and "_tullio_rows" in K_MAX.gradient_code


@pytest.mark.parametrize("threads", [1, 2])
def test_helper_and_fused_nest_run_by_rows(threads, grouped):
    x, r = data("strided", (41, 19), seed=1)
    w = r.standard_normal((41, 19))
    dy = r.standard_normal(41)
    with jit.thread_budget(threads):
        got = K_MAXW.vjp(dy, x=x, w=w)
        plain = K_MAXW0.vjp(dy, x=x, w=w)
    plan = K_MAXW.gradient_side().last_plan
    assert [s.kind for s in plan.steps] == ["rows"] and len(plan.steps[0].members) == 3
    for n in "xw":
        assert np.array_equal(got[n], plain[n], equal_nan=True)
    p = x * w
    wx, ww = np.zeros_like(x), np.zeros_like(w)
    for i in range(x.shape[0]):
        j = first_argmax(p[i])
        wx[i, j], ww[i, j] = dy[i] * w[i, j], dy[i] * x[i, j]
    assert np.array_equal(got["x"], wx, equal_nan=True)
    assert np.array_equal(got["w"], ww, equal_nan=True)


def test_rows_gradient_through_torch(grouped):
    torch = pytest.importorskip("torch")
    x, r = data("c", (33, 21), seed=2)
    x = x[np.isfinite(x).all(axis=1) & (np.arange(33) != 6)]     # torch's max: no ties, no NaN
    xt = torch.tensor(x, requires_grad=True)
    g = torch.tensor(r.standard_normal(x.shape[0]))
    K_MAX(x=xt).backward(g)
    xr = xt.detach().clone().requires_grad_(True)
    xr.max(dim=1).values.backward(g)
    assert torch.equal(xt.grad, xr.grad)


# ----------------------------------------------------------------------------- spread gradients
# A gradient constant along some dimensions (vjp_plan.spread_dims) runs without them: numpy
# gets an array of its own, torch an expanded tensor (as torch's own sum backward).
K_MEAN, K_MEAN0 = kernel("mu[i] := x[i,j] * inv_n"), kernel("mu[i] := x[i,j] * inv_n", fuse=False)
SM = [kernel(t) for t in ["(max) m[i] := x[i,j]", "e[i,j] := exp(x[i,j] - m[i])",
                          "z[i] := e[i,j]", "y[i,j] := e[i,j] / z[i]"]]


def test_spread_gradient_numpy():
    x, r = data("strided", (29, 13), seed=3)
    dmu = r.standard_normal(29)
    got = K_MEAN.vjp(dmu, x=x, inv_n=1 / 13)["x"]
    (a,) = K_MEAN.gradient_side().last_plan.arrays
    assert a.spread == ((29, 13), (1,)) and a.shape == (29,)
    assert got.flags.c_contiguous and got.flags.writeable
    assert np.array_equal(got, K_MEAN0.vjp(dmu, x=x, inv_n=1 / 13)["x"])
    assert np.array_equal(got, np.repeat((dmu * (1 / 13))[:, None], 13, axis=1))
    assert K_MEAN.gradient_equations == {"x": ["dx[i, j] += dmu[i] * inv_n"]}
    assert "stride 0" in K_MEAN.gradient_code and "dx_[i_] = " in K_MEAN.gradient_code


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["c", "transposed"])
def test_softmax_layer_through_torch(layout, threads):
    """The softmax of bench_layers (four statements) forward and backward against torch's,
    float64, NaN and inf rows included: z's gradient of e arrives as an expanded tensor."""
    torch = pytest.importorskip("torch")
    x, r = data(layout, (31, 17), seed=4)
    x[6, 7] = 8.0
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        xt = torch.tensor(x, requires_grad=True) if layout == "c" else \
            torch.tensor(x.T.copy()).T.requires_grad_(True)
        g = torch.tensor(r.standard_normal(x.shape))
        m = SM[0](x=xt).detach()
        e = SM[1](x=xt, m=m)
        y = SM[3](e=e, z=SM[2](e=e))
        y.backward(g)
        xr = xt.detach().clone().requires_grad_(True)
        yr = torch.softmax(xr, -1)
        yr.backward(g)
    finally:
        torch.set_num_threads(old)
    ok = torch.isfinite(xr.grad).all(dim=1)
    assert not ok.all()                           # the NaN and inf rows are there
    assert torch.equal(torch.isnan(y), torch.isnan(yr))
    assert torch.allclose(y[ok], yr[ok], rtol=1e-12, atol=1e-14)
    assert torch.allclose(xt.grad[ok], xr.grad[ok], rtol=1e-10, atol=1e-12)
    assert torch.equal(torch.isnan(xt.grad).any(dim=1), ~ok)


# ----------------------------------------------------------------------------- column sums
# Layer norm's gradient: dx's rows (dmu, dvar per row) and the column sums dg, dbb in one
# pass over blocks of rows, each block adding into partial sums of its own (codegen/rows.py).
LN = ("mu[i] := x[i,j] * inv_n; var[i] := (x[i,j] - mu[i])**2 * inv_n; "
      "y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]")


def _ln_chain(monkeypatch, rows=True, partial_bytes=None):
    from tullio_py import chain as chain_mod, chain_grad, vjp_rows
    monkeypatch.setattr(chain_grad, "BLOCK_BYTES", 1 << 12)      # several blocks, small sizes
    monkeypatch.setattr(chain_grad, "SUMS_BLOCK_BYTES", 1 << 12)
    monkeypatch.setattr(chain_grad, "ROWS", rows)
    if partial_bytes is not None:
        monkeypatch.setattr(vjp_rows, "PARTIAL_BYTES", partial_bytes)
    return chain_mod.Chain(LN, kernel(LN).options)          # plans of its own


def _ln_data(layout, dtype, shape=(53, 19), seed=11):
    x, r = data(layout, shape, seed)
    x = np.where(np.isfinite(x), x, 0.5).astype(dtype)
    args = dict(x=x, inv_n=1 / shape[1], eps=1e-5, g=r.standard_normal(shape[1]).astype(dtype),
                bb=r.standard_normal(shape[1]).astype(dtype))
    return args, r.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["c", "transposed", "strided"])
def test_column_sums_join_the_row_group(layout, dtype, monkeypatch):
    """One rows step with dg, dbb as per-block partials: every gradient equals the plan
    without row groups to rounding and numpy's layer norm gradient; the same bits on 1 and 2
    threads (the blocks, not the threads, decide the partial sums)."""
    args, dy = _ln_data(layout, dtype)
    plain = _ln_chain(monkeypatch, rows=False).vjp(dy, **args)
    k = _ln_chain(monkeypatch)
    with jit.thread_budget(2):
        got = k.vjp(dy, **args)
    (step,) = k.gradient_plan.steps
    assert step.kind == "rows" and step.rows.partial == ("dg", "dbb")
    assert dict(step.rows.consts)["_rows"] < args["x"].shape[0] // 2    # several blocks
    with jit.thread_budget(1):
        one = k.vjp(dy, **args)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for n in ("x", "g", "bb"):
        assert np.array_equal(got[n], one[n]), n
        np.testing.assert_allclose(got[n], plain[n], rtol=tol, atol=tol)
    x, g = args["x"].astype(np.float64), args["g"].astype(np.float64)
    mu = x.mean(1, keepdims=True)
    s = 1 / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    xh, dyg = (x - mu) * s, dy * g
    dx = s * (dyg - dyg.mean(1, keepdims=True) - xh * (dyg * xh).mean(1, keepdims=True))
    for n, want in [("x", dx), ("g", (dy * xh).sum(0)), ("bb", dy.sum(0))]:
        np.testing.assert_allclose(got[n], want, rtol=10 * tol, atol=10 * tol)


def test_column_sums_over_the_partial_budget_stay_apart(monkeypatch):
    """Partials that would take more than vjp_rows.PARTIAL_BYTES: no group with the column
    sums (the fused nest and the row group of the rest, as before), the same gradients."""
    args, dy = _ln_data("c", np.float64, seed=12)
    want = _ln_chain(monkeypatch).vjp(dy, **args)
    k = _ln_chain(monkeypatch, partial_bytes=64)
    got = k.vjp(dy, **args)
    assert [s.kind for s in k.gradient_plan.steps] == ["fused", "rows"]
    assert not any(s.rows.partial for s in k.gradient_plan.steps if s.rows)
    for n in ("x", "g", "bb"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text,dtype", [
    ("y[i,j] := tanh(x[i,j] * w[j] + b[j]); z[i,j] := y[i,j] * x[i,j]", np.float64),
    ("y[i,j,k] := x[i,j,k] * w[j,k]; z[i,k] := y[i,j,k]", np.complex128),
], ids=["two column sums", "complex, 3-d"])
def test_chains_with_column_sums(text, dtype, monkeypatch):
    """Other chains whose gradients have column sums (dw, db): one rows step with them as
    partials, the gradients of the plan without row groups to rounding, the same bits on 1
    and 2 threads."""
    from tullio_py import chain as chain_mod, chain_grad
    monkeypatch.setattr(chain_grad, "BLOCK_BYTES", 1 << 11)
    monkeypatch.setattr(chain_grad, "SUMS_BLOCK_BYTES", 1 << 11)
    r = np.random.default_rng(13)
    shape = (37, 11, 5) if "k]" in text else (37, 11)

    def rnd(*s):
        a = r.standard_normal(s) + (1j * r.standard_normal(s) if dtype == np.complex128 else 0)
        return a.astype(dtype)
    args = {"x": rnd(*shape), "w": rnd(*shape[1:])}
    if "b[j]" in text:
        args["b"] = rnd(shape[1])
    k = chain_mod.Chain(text, kernel(text).options)
    dy = rnd(*k(**args).shape)
    with jit.thread_budget(2):
        got = k.vjp(dy, **args)
    with jit.thread_budget(1):
        one = k.vjp(dy, **args)
    (step,) = k.gradient_plan.steps
    assert step.kind == "rows" and set(step.rows.partial) == {"dw", "db"} & {
        f"d{n}" for n in args}
    monkeypatch.setattr(chain_grad, "ROWS", False)
    plain = chain_mod.Chain(text, kernel(text).options).vjp(dy, **args)
    for n in args:
        assert np.array_equal(got[n], one[n]), n
        np.testing.assert_allclose(got[n], plain[n], rtol=1e-11, atol=1e-11)
    if "tanh" in text:      # and numpy's, derived by hand: z = tanh(x w + b) x
        x, w, b = args["x"], args["w"], args["b"]
        y = np.tanh(x * w + b)
        du = dy * x * (1 - y ** 2)
        for n, want in [("x", dy * y + du * w), ("w", (du * x).sum(0)), ("b", du.sum(0))]:
            np.testing.assert_allclose(got[n], want, rtol=1e-11, atol=1e-11)
