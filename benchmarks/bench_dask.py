"""tullio_py on dask: the local convolution (forward and gradient) and a large contraction on
1 and 2 dask.distributed workers, against the same statements on numpy arrays (1 thread and
2 threads), dask's synchronous scheduler (the cost of splitting into blocks, per block), and
`da.einsum` for the contraction.

    python benchmarks/bench_dask.py [--quick] [--json benchmarks/results/bench_dask.json]

float32.  Inputs are persisted on the workers before timing; a timed run computes the result
and keeps it on the workers (persist + wait), so no transfer to the client is counted.
Every result is checked against the numpy path before it is timed.  Medians of `--repeat`
runs; run on an otherwise idle machine: only ratios within one run mean anything.
"""
import argparse
import json
import time
import uuid

import numpy as np

LOCAL = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"
MATMUL = "C[i,k] := A[i,j] * B[j,k]"


def median_time(f, repeat):
    f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _same(block):
    return block


def _arrays(lazy):
    return lazy if isinstance(lazy, list) else [lazy]


def data(quick):
    rng = np.random.default_rng(0)
    S, C1, C2, B, N = (64, 8, 8, 16, 1024) if quick else (128, 8, 16, 16, 2048)
    x = rng.standard_normal((S, S, C1, B), dtype=np.float32)
    W = rng.standard_normal((S, S, 3, 3, C1, C2), dtype=np.float32)
    A = rng.standard_normal((N, N), dtype=np.float32)
    Bm = rng.standard_normal((N, N), dtype=np.float32)
    return dict(x=x, W=W, A=A, B=Bm, S=S, N=N)


def workloads(d, da, kernel, chunks_s, chunks_n):
    """name -> (numpy function, function of the persisted dask inputs giving lazy results)."""
    conv, conv1 = kernel(LOCAL, threads=2), kernel(LOCAL, threads=1)
    mm = kernel(MATMUL, threads=2)
    x, W, A, B = d["x"], d["W"], d["A"], d["B"]
    dout = np.ones(conv(x=x, W=W).shape, np.float32)
    return {
        "local conv forward": (lambda k: k(x=x, W=W), lambda i: conv(x=i["x"], W=i["W"]),
                               (conv, conv1)),
        "local conv gradient (dx, dW)": (
            lambda k: k.vjp(dout, x=x, W=W),
            lambda i: list(conv.vjp(da.ones(dout.shape, np.float32,
                                            chunks=(chunks_s, -1, -1, -1)),
                                    x=i["x"], W=i["W"]).values()),
            (conv, conv1)),
        "contraction C = A @ B": (lambda k: k(A=A, B=B), lambda i: mm(A=i["A"], B=i["B"]),
                                  (mm, kernel(MATMUL, threads=1))),
        "contraction, da.einsum": (None, lambda i: da.einsum("ij,jk->ik", i["A"], i["B"]),
                                   None),
    }


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster, wait
    from tullio_py import kernel

    d = data(args.quick)
    S, N = d["S"], d["N"]
    cs, cn = S // 4, N // 4
    inputs = dict(x=da.from_array(d["x"], chunks=(cs, -1, -1, -1)),
                  W=da.from_array(d["W"], chunks=(cs, -1, -1, -1, -1, -1)),
                  A=da.from_array(d["A"], chunks=(cn, cn)), B=da.from_array(d["B"], chunks=(cn, cn)))
    work = workloads(d, da, kernel, cs, cn)
    rows = {}
    for name, (np_f, dask_f, ks) in work.items():
        rows[name] = r = {}
        if np_f is not None:
            r["numpy path, 2 threads"] = median_time(lambda: np_f(ks[0]), args.repeat)
            r["numpy path, 1 thread"] = median_time(lambda: np_f(ks[1]), args.repeat)
            want = np_f(ks[0])
        lazy = dask_f(inputs)
        r["blocks"] = sum(a.npartitions for a in _arrays(lazy))
        with dask.config.set(scheduler="synchronous"):
            got = dask.compute(lazy)[0]
            r["dask synchronous (1 thread)"] = median_time(lambda: dask.compute(lazy), args.repeat)
        if np_f is not None:
            w = list(want.values()) if isinstance(want, dict) else [want]
            g = got if isinstance(got, (list, tuple)) else [got]
            for a, b in zip(g, w):
                np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)
    for workers in (1, 2):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          dashboard_address=None, silence_logs=40) as cluster, \
                Client(cluster) as client:
            persisted = dict(zip(inputs, client.persist(list(inputs.values()))))
            wait(list(persisted.values()))
            for name, (_, dask_f, _) in work.items():
                lazy = dask_f(persisted)

                def run():
                    # fresh keys for the results (the blocks' keys are released after each
                    # run): a run never finds the previous run's results still held
                    tag = uuid.uuid4().hex
                    res = client.persist([a.map_blocks(_same, dtype=a.dtype, name=f"r{j}-{tag}")
                                          for j, a in enumerate(_arrays(lazy))])
                    wait(res)
                    client.cancel(res)
                rows[name][f"dask.distributed, {workers} worker{'s' if workers > 1 else ''}"] = \
                    median_time(run, args.repeat)
    print(f"float32; x {d['x'].shape}, W {d['W'].shape}, A, B ({N}, {N}); "
          f"chunks: {cs} rows of x and W, {cn}x{cn} blocks of A and B; medians in ms\n")
    for name, r in rows.items():
        print(name, f"({r['blocks']} output blocks)")
        for k, v in r.items():
            if k != "blocks":
                print(f"    {k:34s} {1e3 * v:9.1f}")
        ref = r.get("numpy path, 1 thread")
        sync = r["dask synchronous (1 thread)"]
        if ref is not None:
            print(f"    block overhead: {1e3 * (sync - ref) / r['blocks']:.2f} ms per block "
                  f"(synchronous dask vs numpy path, 1 thread)")
        one, two = r["dask.distributed, 1 worker"], r["dask.distributed, 2 workers"]
        print(f"    2 workers vs 1: {one / two:.2f}x")
    ein, tul = rows["contraction, da.einsum"], rows["contraction C = A @ B"]
    print(f"\ncontraction, tullio_py on dask vs da.einsum: "
          f"{ein['dask.distributed, 2 workers'] / tul['dask.distributed, 2 workers']:.2f}x "
          f"(2 workers), {ein['dask synchronous (1 thread)'] / tul['dask synchronous (1 thread)']:.2f}x"
          f" (synchronous); > 1: tullio_py faster")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dask_times_s": rows, "quick": args.quick}, f, indent=1)


if __name__ == "__main__":
    main()
