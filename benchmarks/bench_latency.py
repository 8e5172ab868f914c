"""Latency of tullio_py: import, first calls (cold and warm disk cache), per-call overhead.

Every measurement of a first call runs in a fresh interpreter, so nothing is shared but the
cache directory.  Run:  python benchmarks/bench_latency.py [--repeat 3] [--json out.json]

- import:       `import tullio_py` (the interpreter's own start-up excluded).
- cold:         first call of the local convolution forward (and of its vjp, measured after
                the forward in the same process) with an empty cache directory; includes
                importing numba and compiling.
- warm:         the same first calls in a new process with the cache filled.
- hand numba:   the same loops written by hand with numba.njit(parallel=True) and prange,
                first call in a fresh process (numba import + compile), and with cache=True in
                a file, warm (the floor a numba user gets from numba's own cache).
- warm small:   the first call of a 4x4 float32 matmul in a new process with the cache filled,
                split into `import tullio_py`, `import numba` (measured alone) and the rest,
                and which heavy modules (scipy.linalg, sympy, torch) that first call imported;
                also with Python's bytecode cached (an installed package's case: measured
                apart because PYTHONDONTWRITEBYTECODE may be set where this runs).
- overhead:     microseconds per call on 4x4 float64 and float32 matmuls: kernel call, tullio(),
                the bare numba function, np.einsum and torch.einsum on the same arrays, and the
                ratios of the kernel call and tullio() to numpy's A @ B.
- relaid:       milliseconds per call of a statement that runs on relaid copies (a locally
                connected layer's dW, 30x30 positions, `+=`, one thread): the call, its
                compiled loops alone, and the rest (the copies, Python).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONV = "out[s,t,c2,b] := x[s+i,t+j,c1,b] * W[s+i,t+j,i,j,c1,c2]"

ARRAYS = """
import numpy as np
rng = np.random.default_rng(0)
x = rng.random((32, 32, 8, 16), dtype=np.float32)
W = rng.random((32, 32, 3, 3, 8, 16), dtype=np.float32)
"""

TULLIO_FIRST = ARRAYS + f"""
import json, time
from tullio_py import kernel, jit
t0 = time.perf_counter()
k = kernel({CONV!r})
out = k(x=x, W=W)
t1 = time.perf_counter()
res = {{"forward": t1 - t0}}
if hasattr(k, "vjp"):
    dout = np.ones_like(out)
    t2 = time.perf_counter()
    g = k.vjp(dout, x=x, W=W)
    res["vjp"] = time.perf_counter() - t2
res["stats"] = jit.stats.snapshot()
print(json.dumps(res))
"""

HAND = ARRAYS + """
import json, time
t0 = time.perf_counter()
from numba import njit, prange
@njit(parallel=True, error_model="numpy", cache=CACHE)
def conv(x, W):
    I, J = W.shape[2], W.shape[3]
    S, T = x.shape[0] - I + 1, x.shape[1] - J + 1
    C1, B, C2 = x.shape[2], x.shape[3], W.shape[5]
    out = np.empty((S, T, C2, B), dtype=x.dtype)
    for s in prange(S):
        for t in range(T):
            for c2 in range(C2):
                for b in range(B):
                    acc = np.float32(0)
                    for i in range(I):
                        for j in range(J):
                            for c1 in range(C1):
                                acc += x[s + i, t + j, c1, b] * W[s + i, t + j, i, j, c1, c2]
                    out[s, t, c2, b] = acc
    return out
out = conv(x, W)
print(json.dumps({"forward": time.perf_counter() - t0}))
"""

OVERHEAD = """
import json, time, timeit
import numpy as np
from tullio_py import kernel, tullio
A = np.random.default_rng(0).random((4, 4)).astype(DTYPE)
B = np.random.default_rng(1).random((4, 4)).astype(DTYPE)
k = kernel("C[i,k] := A[i,j] * B[j,k]")
assert np.allclose(k(A=A, B=B), A @ B)
assert np.allclose(tullio("C[i,k] := A[i,j] * B[j,k]", A=A, B=B), A @ B)
fn, args = k._last.fn, None
out = np.empty((4, 4), DTYPE)
def best(stmt, n=2000):
    # many short repeats: the best one is the least disturbed by other processes
    return min(timeit.repeat(stmt, number=n, repeat=150, globals=globals())) / n * 1e6
res = {
    "kernel call": best("k(A=A, B=B)"),
    "tullio()": best("tullio('C[i,k] := A[i,j] * B[j,k]', A=A, B=B)"),
    "bare numba function": best("fn(out, A, B, 0, 4, 0, 4, 0, 4)"),
    "np.einsum": best("np.einsum('ij,jk->ik', A, B)"),
    "A @ B": best("A @ B"),
}
res["kernel call / A @ B"] = res["kernel call"] / res["A @ B"]
res["tullio() / A @ B"] = res["tullio()"] / res["A @ B"]
try:
    import torch
    tA, tB = torch.from_numpy(A), torch.from_numpy(B)
    res["torch.einsum"] = best("torch.einsum('ij,jk->ik', tA, tB)")
except ImportError:
    pass
print(json.dumps(res))
"""

# A statement that runs on relaid copies (relayout.py): a locally connected layer's dW called
# on its own with `+=`, one thread: the call, and the compiled loops alone inside it.
RELAID = """
import json, time
import numpy as np
from tullio_py import kernel, threads
rng = np.random.default_rng(0)
x = rng.random((32, 32, 8, 16), dtype=np.float32)
dout = rng.random((30, 30, 16, 16), dtype=np.float32)
dW = np.zeros((30, 30, 3, 3, 8, 16), np.float32)
k = kernel("dW[s,t,i,j,c1,c2] += dout[s,t,c2,b] * x[s+i,t+j,c1,b]", threads=1)
k(dout=dout, x=x, dW=dW)
assert "copy of dout" in k.explain(dout=dout, x=x, dW=dW).detail
loops, calls = [], []
run = threads._run
def timed(fn, args, n):
    t = time.perf_counter(); run(fn, args, n); loops.append(time.perf_counter() - t)
threads._run = timed
for _ in range(200):
    t = time.perf_counter(); k(dout=dout, x=x, dW=dW); calls.append(time.perf_counter() - t)
c, l = float(np.median(calls)) * 1e3, float(np.median(loops)) * 1e3
print(json.dumps({"kernel call": c, "its loops": l, "the rest": c - l}))
"""

SMALL_FIRST = """
import time
t0 = time.perf_counter()
import tullio_py
t1 = time.perf_counter()
import json, sys
import numpy as np
A = np.ones((4, 4), np.float32)
k = tullio_py.kernel("C[i,k] := A[i,j] * B[j,k]")
assert np.allclose(k(A=A, B=A), A @ A)
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first call": t2 - t1, "disk_hits": tullio_py.jit.stats.disk_hits,
                  "imported": [m for m in ("scipy.linalg", "sympy", "torch") if m in sys.modules]}))
"""

IMPORT = "import time; t = time.perf_counter(); import tullio_py; print(time.perf_counter() - t)"


def run(code: str, cache_dir: str | None, extra_env: dict | None = None) -> dict | float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if cache_dir is not None:
        env["TULLIO_CACHE_DIR"] = cache_dir
    env.update(extra_env or {})
    if env.get("PYTHONDONTWRITEBYTECODE") == "":
        del env["PYTHONDONTWRITEBYTECODE"]      # an empty value still counts as set
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=cache_dir or tempfile.gettempdir(), timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def hand_numba(cache: bool, work: str) -> float:
    """The hand-written kernel as a real file (numba caches only functions in files)."""
    path = Path(work) / "hand_conv.py"
    path.write_text(HAND.replace("CACHE", str(cache)))
    return run(f"exec(compile(open({str(path)!r}).read(), {str(path)!r}, 'exec'))",
               work)["forward"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quick", action="store_true",
                    help="one cold/warm conv pair, no hand-written numba kernels")
    a = ap.parse_args()
    med = statistics.median
    r: dict = {}
    r["import tullio_py [s]"] = med(run(IMPORT, "") for _ in range(max(5, a.repeat)))
    cold, warm, cold_vjp, warm_vjp, stats = [], [], [], [], {}
    for _ in range(1 if a.quick else a.repeat):
        with tempfile.TemporaryDirectory() as d:
            first = run(TULLIO_FIRST, d)
            second = run(TULLIO_FIRST, d)
            cold.append(first["forward"])
            warm.append(second["forward"])
            if "vjp" in first:
                cold_vjp.append(first["vjp"])
                warm_vjp.append(second["vjp"])
            stats = {"cold": first["stats"], "warm": second["stats"]}
    r["cold first call, conv forward [s]"] = med(cold)
    r["warm first call, conv forward [s]"] = med(warm)
    r["cold first call, conv vjp [s]"] = med(cold_vjp) if cold_vjp else "pending (no Kernel.vjp)"
    r["warm first call, conv vjp [s]"] = med(warm_vjp) if warm_vjp else "pending (no Kernel.vjp)"
    hand_cold, hand_warm = [], []
    for _ in range(0 if a.quick else a.repeat):
        with tempfile.TemporaryDirectory() as d:
            hand_cold.append(hand_numba(False, d))
        with tempfile.TemporaryDirectory() as d:
            hand_numba(True, d)
            hand_warm.append(hand_numba(True, d))
    if hand_cold:
        r["hand numba, cold first call [s]"] = med(hand_cold)
        r["hand numba cache=True, warm first call [s]"] = med(hand_warm)
    r["import numba alone [s]"] = med(run("import time; t = time.perf_counter(); import numba; "
                                          "print(time.perf_counter() - t)", "")
                                      for _ in range(max(5, a.repeat)))
    small, compiled = [], []
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as pyc:
        # as an installed package runs: Python's bytecode of tullio_py (and of everything it
        # imports) cached too, whatever PYTHONDONTWRITEBYTECODE says here
        bytecode = {"PYTHONPYCACHEPREFIX": pyc, "PYTHONDONTWRITEBYTECODE": ""}
        run(SMALL_FIRST, d)
        run(SMALL_FIRST, d, bytecode)
        for _ in range(max(5, a.repeat)):
            small.append(run(SMALL_FIRST, d))
            compiled.append(run(SMALL_FIRST, d, bytecode))
    r["warm first call, 4x4 matmul: import tullio_py [s]"] = med(s["import"] for s in small)
    r["warm first call, 4x4 matmul: the call [s]"] = med(s["first call"] for s in small)
    r["warm first call, 4x4 matmul: total [s]"] = med(s["import"] + s["first call"] for s in small)
    r["warm first call, 4x4 matmul, bytecode cached: import tullio_py [s]"] = med(
        s["import"] for s in compiled)
    r["warm first call, 4x4 matmul, bytecode cached: total [s]"] = med(
        s["import"] + s["first call"] for s in compiled)
    r["warm first call, 4x4 matmul: loaded from disk"] = small[-1]["disk_hits"]
    r["warm first call, 4x4 matmul: heavy modules imported"] = small[-1]["imported"]
    for dtype in ("float64", "float32"):
        with tempfile.TemporaryDirectory() as d:
            r[f"per-call overhead, 4x4 {dtype} matmul [us]"] = run(
                OVERHEAD.replace("DTYPE", f"np.{dtype}"), d)
    with tempfile.TemporaryDirectory() as d:
        run(RELAID, d)                                  # (compiles into d)
        r["per call, a statement on relaid copies (LC2d dW +=, 1 thread) [ms]"] = run(RELAID, d)
    r["jit.stats of the last cold/warm pair"] = stats
    print(json.dumps(r, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
