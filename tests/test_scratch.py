"""scratch.py: the chains' temporaries and their cotangents reuse memory between calls.  A
reused array never aliases one a caller holds (a kept result, Chain.run's arrays, gradients,
a torch graph's saved temporaries), whatever it held before (NaN here), on two Python threads
at once; the pool's bound.  Values against the statements run one by one (fuse=False)."""
import gc
import os
import signal
import threading

import numpy as np
import pytest

from tullio_py import chain as chain_mod, chain_grad, kernel, scratch, vjp_rows

SM = """(max) m[i] := x[i,j]
e[i,j] := exp(x[i,j] - m[i])
z[i] := e[i,j]
y[i,j] := e[i,j] / z[i]"""
K0 = kernel(SM, nograd=("m",), fuse=False, blas=False)     # one kernel per statement
# its own Chain object (kernel() would share one, and its plans, with other test modules)
K = chain_mod.Chain(SM, kernel(SM, nograd=("m",)).options)
SHAPE = (300, 40)          # float64: 96 kB arrays, above scratch.MIN_BYTES


def data(seed):
    r = np.random.default_rng(seed)
    return r.standard_normal(SHAPE) * 3, r.standard_normal(SHAPE)


def poison():
    """Every idle array of the pool filled with NaN: a value read before it is written shows."""
    for a in scratch.pool.idle():
        a.fill(np.nan)


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch):
    """An empty pool that takes arrays of any size (the buffers of blocks here are small)."""
    scratch.pool.clear()
    monkeypatch.setattr(scratch.pool, "min_bytes", 1)
    yield
    scratch.pool.clear()


def pooled(a) -> bool:
    """a shares memory with an idle array of the pool."""
    return any(np.shares_memory(a, b) for b in scratch.pool.idle())


def same(a: list, b: list) -> bool:
    return sorted(map(id, a)) == sorted(map(id, b))


def test_temporaries_reused_and_results_never_pooled():
    x1, dy = data(0)
    x2, _ = data(1)
    y1 = K(x=x1)
    idle = scratch.pool.idle()              # the chain's temporaries, back after the call
    assert idle and not pooled(y1)
    keep = y1.copy()
    poison()
    y2 = K(x=x2)
    assert same(scratch.pool.idle(), idle)  # taken again and given back: no new array
    np.testing.assert_array_equal(y1, keep)                   # the kept result untouched
    np.testing.assert_allclose(y2, K0(x=x2), rtol=1e-14, atol=1e-15)
    # Chain.run hands every array to the caller: none comes from or goes to the pool
    ns = K.run(x=x1)
    assert same(scratch.pool.idle(), idle) and not any(pooled(v) for v in ns.values())
    saved = {n: v.copy() for n, v in ns.items()}
    poison()
    K(x=x2)
    for n, v in saved.items():
        np.testing.assert_array_equal(ns[n], v)
    # the vjp: the forward's `e` and the cotangent `de` are scratch, the gradient is not
    poison()
    g1 = K.vjp(dy, x=x1)["x"]
    idle = scratch.pool.idle()
    assert not pooled(g1)
    keep = g1.copy()
    poison()
    g2 = K.vjp(dy, x=x2)["x"]
    assert same(scratch.pool.idle(), idle)
    np.testing.assert_array_equal(g1, keep)
    np.testing.assert_allclose(g2, K0.vjp(dy, x=x2)["x"], rtol=1e-12, atol=1e-14)


def test_torch_graph_keeps_its_temporaries_until_freed():
    """The forward's `e` stays with the autograd node through every backward (retain_graph)
    and returns to the pool when the graph is freed; a forward meanwhile gets other memory."""
    torch = pytest.importorskip("torch")
    x1, dy = data(2)
    x2, _ = data(3)
    want = K0.vjp(dy, x=x1)["x"]
    xt = torch.tensor(x1, requires_grad=True)
    y = K(x=xt)
    assert scratch.pool.idle() == []           # `e` is held by the graph
    (e,) = [v for v in y.grad_fn.ns.values() if v.shape == SHAPE and v is not y.grad_fn.ns["x"]
            and v is not y.grad_fn.ns["y"]]
    with torch.no_grad():                       # another call takes and returns its own `e`
        np.testing.assert_allclose(K(x=torch.tensor(x2)).numpy(), K0(x=x2), rtol=1e-14)
    for _ in range(2):
        poison()
        xt.grad = None
        y.backward(torch.tensor(dy), retain_graph=True)
        np.testing.assert_allclose(xt.grad.numpy(), want, rtol=1e-12, atol=1e-14)
        assert not pooled(xt.grad.numpy()) and not pooled(y.detach().numpy())
        assert not pooled(e)
    del y
    gc.collect()
    assert pooled(e)                            # the graph's `e` is back


def test_two_threads_share_one_chain():
    xs = [data(10 + k) for k in range(2)]
    want = [K0(x=x) for x, _ in xs]
    K(x=xs[0][0])
    one = len(scratch.pool.idle())           # what one call takes
    errors = []

    def work(k):
        try:
            for _ in range(30):
                got = K(x=xs[k][0])
                if not np.allclose(got, want[k], rtol=1e-14, atol=1e-15):
                    errors.append(k)
        except Exception as e:         # (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(scratch.pool.idle()) <= 2 * one          # two calls at a time at most


def test_pool_bound_and_what_it_takes_back():
    p = scratch.Pool(limit=3 * 8 * 10000, min_bytes=1000)
    arrays = [p.empty((10000,), np.float64) for _ in range(4)]
    p.give(arrays)
    assert p.held <= p.limit and [id(a) for a in p.idle()] == [id(a) for a in arrays[1:]]
    p.give(arrays[1:2])                               # already idle: not twice
    assert len(p.idle()) == 3
    p.give([np.empty(10), np.empty(20000)[::2], np.empty((100, 100)).T])  # small, views
    assert len(p.idle()) == 3
    a = p.empty((10000,), np.float64)
    assert a is arrays[3] and p.empty((10000,), np.float64) is arrays[2]
    assert p.empty((10000,), np.float32).dtype == np.float32       # no such idle array: new
    assert p.held == 8 * 10000


# `e` has the row index second, `y` is read after its row group (by `w`): only `z` qualifies
ODD = ("e[j,i] := exp(x[i,j]); z[i] := e[j,i]; y[i,j] := e[j,i] / z[i]; "
       "w[j] := y[i,j] * x[i,j]")


def test_block_local_temporaries_equal_whole_arrays(monkeypatch):
    """Temporaries that only their row group reads live in blocks of rows (the softmax's m,
    e, z; the vjp's de) when the caller sees only the result: values bit for bit those of
    the same chain with every array whole, from buffers holding NaN before each call.  The
    vjp's de is otherwise inlined into dx (vjp_inline.py): here it is kept."""
    monkeypatch.setattr(chain_grad, "INLINE", False)
    x, dy = data(20)
    assert [s.rows.local for s in K.plan({"x": x}, True)[0]] == [("m", "e", "z")]
    assert [s.rows.local for s in K.plan({"x": x})[0]] == [()]        # Chain.run, vjp, torch
    monkeypatch.setattr(vjp_rows, "LOCAL", False)
    whole = chain_mod.Chain(SM, K.options)
    want = whole(x=x), whole.vjp(dy, x=x)["x"]
    assert not any(a.local for a in whole.gradient_plan.arrays)
    monkeypatch.setattr(vjp_rows, "LOCAL", True)
    k = chain_mod.Chain(SM, K.options)
    for _ in range(2):
        poison()
        y = k(x=x)
        poison()
        g = k.vjp(dy, x=x)["x"]
        assert np.array_equal(y, want[0]) and np.array_equal(g, want[1])
    assert [a.name for a in k.gradient_plan.arrays if a.local] == ["de"]


def test_block_local_only_where_nothing_else_reads():
    x, _ = data(21)
    k, k0 = kernel(ODD), kernel(ODD, fuse=False, blas=False)
    assert [s.rows.local for s in k.plan({"x": x}, True)[0] if s.rows] == [("z",)]
    poison()
    np.testing.assert_allclose(k(x=x), k0(x=x), rtol=1e-13, atol=1e-15)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_the_pool_is_locked_can_use_it():
    scratch.pool.give([np.empty(1000)])
    with scratch.pool._lock:            # another thread inside the pool at the fork
        pid = os.fork()
        if pid == 0:                    # the child: a deadlock ends by the alarm (code 14)
            signal.alarm(5)
            scratch.pool.give([np.empty(1000)])
            os._exit(0 if len(scratch.pool.idle()) == 1 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
