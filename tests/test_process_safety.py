"""Kernels in any process: many Python threads at once, forked and spawned children, each numba
threading layer, a user's NUMBA_THREADING_LAYER and NUMBA_NUM_THREADS.

Each scenario runs as a script in its own Python process with a timeout, so a crash (numba's
workqueue aborts on concurrent use; GNU OpenMP kills a forked child) fails the test instead of
killing pytest.  The scripts check every result against numpy and print a last line of JSON.
The kernel cache directory set by conftest.py is inherited, so the kernels compile once.
"""
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Two specialisations of one kernel: a small call (serial loops) and a large one (threaded).
PRELUDE = """
import json, os, sys
import numpy as np
from tullio_py import jit, kernel, threads
MM = kernel("C[i,k] := A[i,j] * B[j,k]", blas=False)

def check(seed, large):
    rng = np.random.default_rng(seed)
    m, n, p = (64, 48, 40) if large else (4, 3, 5)
    A, B = rng.standard_normal((m, n)), rng.standard_normal((n, p))
    C = MM(A=A, B=B)
    assert np.allclose(C, A @ B, rtol=1e-12, atol=1e-12), (seed, large)
    return float(C.sum())

def no_tbb():
    threads._load_tbb = lambda: False     # as where the TBB library is not installed
"""


def _run(tmp_path, body: str, env: dict | None = None, timeout: float = 240) -> dict:
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("NUMBA_THREADING_LAYER", "NUMBA_NUM_THREADS")}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       env=full_env, timeout=timeout, cwd=str(tmp_path))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _tbb_installed() -> bool:
    try:
        metadata.version("tbb")
        return True
    except metadata.PackageNotFoundError:
        return False


THREADS = """
from concurrent.futures import ThreadPoolExecutor
{setup}
def work(t):
    return [check(100 * t + i, large=i % 3 != 0) for i in range(60)]
with ThreadPoolExecutor(4) as ex:
    results = list(ex.map(work, range(4)))
assert all(len(r) == 60 for r in results)
print(json.dumps({{"layer": jit.threading_layer(), "calls": sum(map(len, results)),
                  "pool": jit.pool()}}))
"""


@pytest.mark.parametrize("case", ["default", "no_tbb", "user_workqueue"])
def test_four_python_threads(tmp_path, case):
    """4 Python threads x 60 calls, small (serial) and large (threaded) mixed: no abort, every
    result right.  Without TBB the workqueue layer is used behind a lock."""
    setup = "no_tbb()" if case == "no_tbb" else ""
    env = {"NUMBA_THREADING_LAYER": "workqueue"} if case == "user_workqueue" else {}
    out = _run(tmp_path, THREADS.format(setup=setup), env)
    assert out["calls"] == 240
    if case == "default" and _tbb_installed():
        assert out["layer"] == "tbb" and out["pool"] == "on numba's TBB pool"
    elif case != "default":
        assert out["layer"] == "workqueue"


FORK = """
import multiprocessing as mp
{setup}
def child(q):
    q.put(check(7, large=True))

if __name__ == "__main__":
    check(1, large=True)                    # the parent's pool is running before the fork
    check(2, large=False)
    ctx = mp.get_context("{method}")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    p.join(200)
    assert p.exitcode == 0, p.exitcode     # killed by a signal: negative
    got = q.get(timeout=10)
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((64, 48)), rng.standard_normal((48, 40))
    assert abs(got - float((A @ B).sum())) < 1e-9 * max(1.0, abs(got)), got
    check(3, large=True)                    # the parent still works after the fork
    print(json.dumps({{"layer": jit.threading_layer(), "child": got}}))
"""


@pytest.mark.parametrize("method,case", [("fork", "default"), ("fork", "no_tbb"),
                                         ("fork", "user_omp"), ("spawn", "default")])
def test_child_process_after_use(tmp_path, method, case):
    """A child (forked or spawned) of a process that ran threaded kernels calls a threaded
    kernel; the parent checks its result against numpy.  Under a user-chosen GNU OpenMP layer
    (which terminates a forked child entering its pool) the child runs a serial copy."""
    setup = "if __name__ == '__main__':\n    no_tbb()" if case == "no_tbb" else ""
    env = {"NUMBA_THREADING_LAYER": "omp"} if case == "user_omp" else {}
    out = _run(tmp_path, FORK.format(setup=setup, method=method), env)
    if case == "no_tbb":
        assert out["layer"] == "workqueue"
    if case == "user_omp":
        assert out["layer"] == "omp"


NUM_THREADS = """
import numba
seen = []
real = threads.set_threads
threads.set_threads = lambda n: (seen.append(n), real(n))[1]
check(1, large=True)
MM2 = kernel("C[i,k] := A[i,j] * B[j,k]", blas=False, threads=2)
rng = np.random.default_rng(5)
A, B = rng.standard_normal((64, 48)), rng.standard_normal((48, 40))
assert np.allclose(MM2(A=A, B=B), A @ B, rtol=1e-12)
assert MM2._last.source.parallel
print(json.dumps({"max": jit.max_threads(), "numba": numba.config.NUMBA_NUM_THREADS,
                  "seen": [n for n in seen if n is not None],
                  "layer": jit.threading_layer(), "numba_layer": numba.threading_layer()}))
"""


def test_user_num_threads_and_layer_respected(tmp_path):
    """NUMBA_NUM_THREADS=1 caps every call (threads=2 asks for 2, gets 1); a user's
    NUMBA_THREADING_LAYER is the layer in use."""
    out = _run(tmp_path, NUM_THREADS, {"NUMBA_NUM_THREADS": "1",
                                       "NUMBA_THREADING_LAYER": "workqueue"})
    assert out["max"] == out["numba"] == 1
    assert out["seen"] and set(out["seen"]) == {1}
    assert out["layer"] == out["numba_layer"] == "workqueue"


def test_torch_thread_count_is_the_budget():
    """Through the torch frontend a kernel runs on at most torch.get_num_threads() threads."""
    torch = pytest.importorskip("torch")
    from tullio_py import jit, kernel, threads
    # index names of its own: a Kernel plans its loops at its first call, and other test
    # modules check the plan of the usual matmul kernel
    mm = kernel("C[p,r] := A[p,q] * B[q,r]", blas=False)
    rng = np.random.default_rng(11)
    A, B = rng.standard_normal((64, 48)), rng.standard_normal((48, 40))
    seen, real, before = [], threads.set_threads, torch.get_num_threads()
    threads.set_threads = lambda n: (seen.append(n), real(n))[1]
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            seen.clear()
            C = mm(A=torch.from_numpy(A), B=torch.from_numpy(B))
            np.testing.assert_allclose(C.numpy(), A @ B, rtol=1e-12)
            assert mm._last.source.parallel
            used = [n for n in seen if n is not None]
            assert used == [min(t, jit.max_threads())], (t, seen)
        seen.clear()
        mm(A=A, B=B)                     # numpy arrays: no budget, numba's own setting
        assert [n for n in seen if n is not None] == []
    finally:
        threads.set_threads = real
        torch.set_num_threads(before)


JOIN = """
import ctypes
import torch
from concurrent.futures import ThreadPoolExecutor
scope = ctypes.CDLL(None)
torch.set_num_threads(2)
torch.exp(torch.rand(1 << 20))              # torch's pool has its worker now
tasks = len(os.listdir("/proc/self/task"))
torch.set_num_threads(1)
levels = scope.omp_get_max_active_levels()
check(1, large=True)                        # numba's pool starts here
after_start = (torch.get_num_threads(), scope.omp_get_max_active_levels() == levels)
torch.set_num_threads(2)
check(2, large=True)
grown = len(os.listdir("/proc/self/task")) - tasks
with ThreadPoolExecutor(3) as ex:           # several Python threads, each its own team
    sums = list(ex.map(lambda s: check(s, large=True), range(10, 22)))
print(json.dumps({"layer": jit.threading_layer(), "after_start": after_start,
                  "grown": grown, "calls": len(sums), "pool": jit.pool()}))
"""


def test_kernels_join_torchs_openmp_pool(tmp_path):
    """Imported after torch, tullio_py runs its parallel kernels on torch's OpenMP runtime:
    numba's omp layer, a 2-thread call starts no thread beyond torch's pool (numba's TBB
    pool would add its workers), Python threads calling kernels at once get right results,
    and torch's thread count and nesting depth stay as the user set them."""
    pytest.importorskip("torch")
    out = _run(tmp_path, JOIN)
    assert out["layer"] == "omp" and out["pool"] == "on torch's OpenMP pool"
    assert out["after_start"] == [1, True]
    assert out["calls"] == 12
    assert out["grown"] == 0, out


def test_forked_child_of_a_torch_process_runs_serial_copies(tmp_path):
    """A fork after kernels ran on torch's GNU OpenMP pool: the child's kernels run as serial
    copies (entering that pool would terminate the child) and give the right result."""
    pytest.importorskip("torch")
    body = FORK.format(setup="", method="fork")
    out = _run(tmp_path, "import torch\n" + body)
    assert out["layer"] == "omp"


def test_openmp_runtime_is_seen_only_once_loaded():
    """openmp_lib.loaded() finds no runtime in a plain process and torch's once imported."""
    pytest.importorskip("torch")
    code = ("import sys; from tullio_py import openmp_lib; a = openmp_lib.loaded() is None; "
            "import torch; print(a, openmp_lib.loaded() is None)")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False"]


FORK_TWICE = """
import torch
import multiprocessing as mp

def child(q):
    before = jit.stats.snapshot()
    got = check(7, large=True)
    after = jit.stats.snapshot()
    q.put((got, after["compiles"] - before["compiles"], after["disk_hits"] - before["disk_hits"]))

if __name__ == "__main__":
    check(1, large=True)
    ctx = mp.get_context("fork")
    runs = []
    for _ in range(2):
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(200)
        assert p.exitcode == 0, p.exitcode
        runs.append(q.get(timeout=10))
    print(json.dumps({"layer": jit.threading_layer(), "runs": runs}))
"""


def test_forked_children_load_the_serial_copy_from_the_disk_cache(tmp_path):
    """Forked children of a process on torch's GNU OpenMP pool run serial copies of their
    parallel kernels, which are kernels of their own in the disk cache: the first child
    compiles its copy, the next one loads it (a DataLoader's workers are forked again at
    every epoch)."""
    pytest.importorskip("torch")
    env = {"TULLIO_CACHE_DIR": str(tmp_path / "cache")}     # a cache of this test's own
    out = _run(tmp_path, FORK_TWICE, env)
    assert out["layer"] == "omp"
    (first, c1, h1), (second, c2, h2) = out["runs"]
    assert first == second
    assert c1 >= 1, out            # the first child compiled the serial copy
    assert c2 == 0 and h2 >= 1, out  # the second loaded it
