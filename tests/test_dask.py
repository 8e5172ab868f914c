"""The dask frontend (frontends/dask.py): dask arrays in give lazy dask arrays whose values are
the numpy path's, for the forward table and gradients, on random chunkings (size-1 chunks,
uneven last chunks, chunks smaller than a halo); the graph reads windows, not whole inputs;
block kernels compile once per statement, not per block shape; the same graph runs on a
dask.distributed cluster of processes and out of core."""
import os
import sys
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

sys.path.insert(0, os.path.dirname(__file__))
import test_table as tt  # noqa: E402

from tullio_py import LoweringError, kernel, tullio  # noqa: E402
from tullio_py.frontends import dask as dask_frontend  # noqa: E402


@pytest.fixture(autouse=True)
def _synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def chunking(r, shape, kind=None):
    """Random chunks per dimension: all size 1 (short dimensions), or two or three uneven
    pieces."""
    out = []
    for n in shape:
        if n <= 1:
            out.append((n,))
            continue
        k = r.integers(0, 3) if kind is None else kind
        if k == 0 and n <= 40:
            out.append((1,) * n)
            continue
        cuts = sorted(set(r.integers(1, n, size=r.integers(1, 3)).tolist()))
        edges = [0] + cuts + [n]
        out.append(tuple(b - a for a, b in zip(edges, edges[1:])))
    return tuple(out)


def as_dask(arrays, r):
    return {k: (da.from_array(v.copy(), chunks=chunking(r, v.shape))
                if isinstance(v, np.ndarray) and v.ndim else v) for k, v in arrays.items()}


DASKABLE = [n for n, t in enumerate(tt.TABLE)
            if any(isinstance(v, np.ndarray) and v.ndim for v in
                   t.build(np.random.default_rng(n)).values())]


@pytest.mark.parametrize("n", DASKABLE, ids=[tt.IDS[n] for n in DASKABLE])
def test_table_forward_on_random_chunks(n):
    t = tt.TABLE[n]
    arrays, expected, _, eq = tt._expected(n)
    for seed in (0, 1):
        inputs = as_dask(arrays, np.random.default_rng(1000 * seed + n))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = tullio(t.expr, **inputs, **t.opts)
        assert isinstance(got, da.Array)
        tt._assert_same(np.asarray(got.compute()), expected)
    for k, v in arrays.items():      # in-place forms leave the arrays passed as they were
        if isinstance(v, np.ndarray) and v.ndim:
            np.testing.assert_array_equal(inputs[k].compute(), v)


GRAD = ["C[i,k] := A[i,j] * B[j,k]", "s := x[i] * y[i]", "(max) M[i] := A[i,j]",
        "y[i] := x[i+j] * h[j]", "y[i] := x[2i+k] * h[k]", "y[i] := x[i-j+2] * h[j]",
        "Y[i,j] := X[i+a, j+b] * K[a,b]", "y[i] := x[pad(i+k-1, 1, 1)] * h[k]",
        "y[i+j] := x[i] * h[j]", "G[k] := A[J[k]+i] * w[i]", "s[i] := A[i,j] * (j < i)",
        "lse[i] := exp(A[i,j]) |> log", "(max) M[i] := A[i,j] * (j <= i)",
        "y[i] := x[i] * i", "t := A[i,i]"]
GRAD_N = [next(n for n, t in enumerate(tt.TABLE) if t.expr == e and tt._differentiable(n))
          for e in GRAD]


@pytest.mark.parametrize("n", GRAD_N, ids=GRAD)
def test_vjp_on_random_chunks(n):
    t, arrays, expected, eq = tt._differentiable(n)
    k = kernel(t.expr, **t.opts)
    r = np.random.default_rng(7 + n)
    cot = r.standard_normal(expected.shape)
    want = k.vjp(cot, **arrays)
    for _ in range(2):
        dcot = da.from_array(cot, chunks=chunking(r, cot.shape)) if cot.ndim else cot
        got = k.vjp(dcot, **as_dask(arrays, r))
        assert set(got) == set(want)
        for name, g in got.items():
            assert isinstance(g, da.Array) and g.dtype == want[name].dtype
            np.testing.assert_allclose(g.compute(), want[name], rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- local convolution
LOCAL = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"


def _local_conv(r, chunks_x, chunks_w, n=9):
    x = r.standard_normal((n, n, 3, 4))
    W = r.standard_normal((n, n, 3, 3, 3, 2))
    return x, W, da.from_array(x, chunks=chunks_x), da.from_array(W, chunks=chunks_w)


@pytest.mark.parametrize("cx,cw", [
    ((2, 4, 3, 2), (4, 2, 3, 3, 3, 1)),           # chunks smaller than the 2-wide halo
    ((1, 9, 1, 4), (9, 1, 3, 3, 1, 2)),           # size-1 chunks, chunked reduction c1
    ((5, 5, 3, 3), (3, 5, 3, 3, 3, 2)),           # uneven last chunks
])
def test_local_convolution_forward_and_gradient(cx, cw):
    r = np.random.default_rng(3)
    x, W, dx, dW = _local_conv(r, cx, cw)
    k = kernel(LOCAL)
    out = k(x=dx, W=dW)
    np.testing.assert_allclose(out.compute(), k(x=x, W=W), rtol=1e-12)
    cot = r.standard_normal(out.shape)
    want = k.vjp(cot, x=x, W=W)
    got = k.vjp(da.from_array(cot, chunks=(3, 4, 1, 2)), x=dx, W=dW)
    for name in ("x", "W"):
        np.testing.assert_allclose(got[name].compute(), want[name], rtol=1e-10, atol=1e-12)


def _dependencies(arr):
    from dask.core import get_dependencies
    g = dict(arr.__dask_graph__())
    return {key: get_dependencies(g, key) for key in g}


def test_graph_reads_windows_not_whole_inputs():
    """No task depends on every chunk of a chunked input: blocks read their window (halo
    included) from the neighbouring chunks only; the gradient's gather form too."""
    r = np.random.default_rng(4)
    x, W, dx, dW = _local_conv(r, (2, 3, 3, 4), (3, 3, 3, 3, 3, 2), n=12)
    k = kernel(LOCAL)
    out = k(x=dx, W=dW)
    grads = k.vjp(da.ones(out.shape, chunks=(2, 2, 2, 4)), x=dx, W=dW)
    for result in [out, grads["x"], grads["W"]]:
        deps = _dependencies(result)
        for src in (dx, dW):
            chunks = set(src.__dask_keys__() and dict(src.__dask_graph__()))
            chunk_keys = {key for key in chunks if isinstance(key, tuple) and key[0] == src.name}
            assert len(chunk_keys) > 4
            for key, d in deps.items():
                assert not chunk_keys <= d, f"{key} reads all of {src.name}"
    # a block of the forward reads at most 2x2 chunks of x along (s, t): chunks 2 and 3 wide,
    # window of a 2-wide block plus the 2-wide halo
    x_keys = {key for key in dict(dx.__dask_graph__())}
    for key, d in _dependencies(out).items():
        assert len(d & x_keys) <= 2 * 3


def test_blocks_large_enough_for_blas_over_shifted_views():
    """A block statement that blas_shift.py runs (a new array per call) still fills the block
    (Kernel.run_with_ranges writes into the output it is given)."""
    r = np.random.default_rng(9)
    x = r.standard_normal((64, 64, 4, 64), dtype=np.float32)
    W = r.standard_normal((3, 3, 4, 2)).astype(np.float32)
    expr = "y[s,t,c2,b] := x[s+i,t+j,c1,b] * W[i,j,c1,c2]"
    k = kernel(expr)
    want = k(x=x, W=W)
    got = tullio(expr, x=da.from_array(x, chunks=(32, 64, 4, 64)), W=W).compute()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = np.full(want.shape, np.nan, np.float32)
    k.run_with_ranges({"x": x, "W": W}, k.ranges(x=x, W=W), out, {})
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_gathered_arrays_are_read_whole_and_checked_once():
    A = np.arange(12.0).reshape(6, 2)
    J = np.array([5, 0, 2, 2, 1])
    G = tullio("G[k,c] := A[J[k], c]", A=da.from_array(A, chunks=(2, 1)),
               J=da.from_array(J, chunks=2))
    np.testing.assert_array_equal(G.compute(), A[J])
    from tullio_py import RangeError
    with pytest.raises(RangeError, match="out of bounds"):      # at graph construction
        tullio("G[k,c] := A[J[k], c]", A=da.from_array(A, chunks=3),
               J=da.from_array(np.array([6, 0]), chunks=1))


def test_block_kernels_compile_once_for_every_block_shape():
    x, h = np.random.default_rng(5).standard_normal(60), np.array([1.0, -2.0, 0.5])
    expr = "y[i] := x[i+j] * h[j]"
    want = tullio(expr, x=x, h=h)
    compiled = []
    for chunks in [(7,), (5,), (9,), (13,), (6, 17, 30, 7)]:
        y = tullio(expr, x=da.from_array(x, chunks=chunks), h=h)
        np.testing.assert_allclose(y.compute(), want, rtol=1e-12)
        ks = [k for key, k in _kernels() if "o_i" in key[0] or "x[i + j]" in key[0]]
        compiled.append(sum(len(k._prepared) for k in ks))
    assert compiled[0] >= 1 and compiled[-1] == compiled[0], compiled
    assert len({len(c) for c in [(7,), (5,), (9,), (13,), (6, 17, 30, 7)]}) > 1


def _kernels():
    """(key with the statement's text first, Kernel) of the cached one-thread kernels (block
    kernels are cached by their Equation)."""
    from tullio_py.kernel import _KERNELS
    return [((key[0] if isinstance(key[0], str) else str(key[0]), *key[1:]), k)
            for key, k in _KERNELS.items() if type(k.threads) is int and k.threads == 1]


def test_in_place_forms_return_a_new_array_and_keep_the_old_one():
    C = da.from_array(np.ones((3, 4)), chunks=2)
    A, B = np.eye(3), np.arange(12.0).reshape(3, 4)
    got = tullio("C[i,k] += A[i,j] * B[j,k]", C=C, A=da.from_array(A, chunks=1), B=B)
    np.testing.assert_allclose(got.compute(), 1 + A @ B)
    np.testing.assert_array_equal(C.compute(), np.ones((3, 4)))


def test_unsupported_statements_raise_lowering_error():
    w, J = da.from_array(np.arange(6.0), chunks=2), da.from_array(np.array([0, 1, 1, 2, 0, 1]),
                                                                   chunks=2)
    H = da.zeros(3, chunks=2)
    with pytest.raises(LoweringError, match=r"cannot combine the partial results") as e:
        tullio("H[J[i]] = w[i]", H=H, w=w, J=J)
    assert "rechunk" in str(e.value) and "^" in str(e.value)
    # one chunk along the scattered index: the numpy semantics, no partials
    got = tullio("H[J[i]] = w[i]", H=H, w=w.rechunk(6), J=J.rechunk(6))
    want = tullio("H[J[i]] = w[i]", H=np.zeros(3), w=w.compute(), J=J.compute())
    np.testing.assert_array_equal(got.compute(), want)


def test_a_tape_does_not_record_dask_calls_silently():
    from tullio_py import Tape
    with Tape(), pytest.raises(LoweringError, match="Tape"):
        tullio("y[i] := x[i]", x=da.ones(3, chunks=2))


def test_unknown_chunk_sizes_are_an_argument_error():
    from tullio_py import ArgumentError
    x = da.from_array(np.arange(6.0), chunks=2)
    x = x[x > 2]                       # chunk sizes unknown until computed
    with pytest.raises(ArgumentError, match="unknown chunk sizes"):
        tullio("y[i] := x[i]", x=x)
    np.testing.assert_array_equal(tullio("y[i] := x[i]", x=x.compute_chunk_sizes()).compute(),
                                  [3.0, 4.0, 5.0])


def test_import_of_the_frontend_does_not_import_dask():
    import subprocess
    code = ("import sys, numpy as np, tullio_py; from tullio_py.frontends import dask; "
            "tullio_py.tullio('y[i] := x[i]', x=np.ones(3)); print('dask' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)), check=True)
    assert out.stdout.strip() == "False"
    assert not dask_frontend.wants({"x": np.ones(3)})


# ----------------------------------------------------------------------------- threads, workers
def test_threaded_scheduler_runs_blocks_concurrently():
    r = np.random.default_rng(6)
    x, W, dx, dW = _local_conv(r, (2, 2, 3, 2), (2, 2, 3, 3, 3, 2), n=12)
    k = kernel(LOCAL)
    with dask.config.set(scheduler="threads", num_workers=4):
        out, g = dask.compute(k(x=dx, W=dW), k.vjp(da.ones((10, 10, 2, 4), chunks=3),
                                                   x=dx, W=dW))
    np.testing.assert_allclose(out, k(x=x, W=W), rtol=1e-12)
    want = k.vjp(np.ones((10, 10, 2, 4)), x=x, W=W)
    np.testing.assert_allclose(g["W"], want["W"], rtol=1e-10)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", silence_logs=40) as c, \
            distributed.Client(c) as client:
        yield client


def test_local_cluster_of_processes_gives_the_same_numbers(cluster):
    r = np.random.default_rng(8)
    x, W, dx, dW = _local_conv(r, (4, 5, 3, 2), (4, 5, 3, 3, 3, 2), n=10)
    A, B = r.standard_normal((30, 20)), r.standard_normal((20, 10))
    k = kernel(LOCAL)
    lazy = (k(x=dx, W=dW), k.vjp(da.ones((8, 8, 2, 4), chunks=3), x=dx, W=dW),
            tullio("C[i,k] := A[i,j] * B[j,k]", A=da.from_array(A, chunks=7),
                   B=da.from_array(B, chunks=6)))
    local = dask.compute(*lazy)         # compiles the block kernels into the shared cache
    with dask.config.set(scheduler=cluster.get):
        out, g, C = dask.compute(*lazy)
    np.testing.assert_array_equal(out, local[0])
    np.testing.assert_allclose(out, k(x=x, W=W), rtol=1e-12)
    want = k.vjp(np.ones((8, 8, 2, 4)), x=x, W=W)
    for name in want:
        np.testing.assert_allclose(g[name], want[name], rtol=1e-10)
    np.testing.assert_allclose(C, A @ B, rtol=1e-12)

    # blocks run on one numba thread unless threads= asks for more, and never on more than
    # the worker's thread count
    from tullio_py.frontends import dask_graph
    opts = tuple(sorted(dict(threads=4, target="cpu", pad=0, fastmath=False, blas=True,
                             ranges=None).items()))
    assert dask_graph._kernel("y[i] := x[i]", opts).threads == 4
    assert cluster.submit(lambda: dask_graph._kernel("y[i] := x[i]", opts).threads,
                          pure=False).result() == 1
    assert dask_frontend._options(kernel(LOCAL), 0)["threads"] == 1
    assert dask_frontend._options(kernel(LOCAL, threads=3), 0)["threads"] == 3


def test_out_of_core_input_four_times_the_memory_limit():
    """An input 4x the worker's memory limit, made on the worker chunk by chunk: the
    convolution and its sum complete (spilling to disk), and a slice matches numpy."""
    distributed = pytest.importorskip("distributed")
    limit = 24 * 2**20
    cfg = {"distributed.worker.memory.target": 0.5, "distributed.worker.memory.spill": False,
           "distributed.worker.memory.pause": False,
           "distributed.worker.memory.terminate": False}
    with dask.config.set(cfg), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                     memory_limit=limit, dashboard_address=":0",
                                     silence_logs=40) as c, distributed.Client(c) as client:
        shape = (1536, 64, 4, 64)        # float32: 96 MiB, 4x the limit
        x = da.random.default_rng(0).standard_normal(shape, dtype=np.float32,
                                                     chunks=(32, 64, 4, 64))
        assert x.nbytes >= 4 * limit
        W = np.random.default_rng(1).standard_normal((3, 3, 4, 2)).astype(np.float32)
        y = tullio("y[s,t,c2,b] := x[s+i,t+j,c1,b] * W[i,j,c1,c2]", x=x, W=W)
        total, head = client.compute([y.sum(dtype=np.float64), y[:6]], sync=True)
        x_head = x[:8].compute()
        want = tullio("y[s,t,c2,b] := x[s+i,t+j,c1,b] * W[i,j,c1,c2]", x=x_head, W=W)
        np.testing.assert_allclose(head, want, rtol=1e-5, atol=1e-5)
        assert np.isfinite(total)
