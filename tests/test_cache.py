"""The disk cache (tullio_py/cache.py, jit.py): reuse across processes, concurrent writers,
damaged files, what the key covers, clearing and the size bound; lazy imports.

Cross-process tests run small scripts in fresh interpreters with their own cache directory and
read back `jit.stats` (numba's own per-signature counters of compiles and disk loads).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tullio_py
from tullio_py import cache, jit, kernel

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import numpy as np
from tullio_py import kernel, jit
rng = np.random.default_rng(0)
A, B = rng.random((5, 3)), rng.random((3, 4))
C = kernel("C[i,k] := A[i,j] * B[j,k] * 1.5", threads=False)(A=A, B=B)
ok = bool(np.allclose(C, (A @ B) * 1.5))
print(json.dumps({"ok": ok, **jit.stats.snapshot()}))
"""


def _env(cache_dir):
    env = dict(os.environ, TULLIO_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _start(cache_dir, script=SCRIPT):
    return subprocess.Popen([sys.executable, "-c", script], env=_env(cache_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _modules(cache_dir):
    return sorted((Path(cache_dir) / "kernels").glob("_tullio_*.py"))


def test_import_is_lazy():
    script = ("import sys, tullio_py, json; print(json.dumps([m for m in ('numba', 'llvmlite', "
              "'numba_cuda', 'sympy', 'torch', 'scipy') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", script], env=_env(""), capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out) == []


def test_processes_share_the_cache(tmp_path):
    """Two processes compile the same kernel at once; a third loads it; a damaged file (here:
    code that would kill the process if it ran) is rewritten, not executed."""
    first = [_start(tmp_path), _start(tmp_path)]
    results = [_finish(p) for p in first]
    assert all(r["ok"] for r in results)
    assert all(r["compiles"] + r["disk_hits"] == 1 for r in results)
    assert sum(r["modules_written"] for r in results) >= 1
    (module,) = _modules(tmp_path)          # one specialisation, one file
    assert oct(module.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "kernels").stat().st_mode & 0o777) == "0o700"
    assert not list((tmp_path / "kernels").glob(".tmp-*"))

    again = _finish(_start(tmp_path))
    assert again["ok"]
    assert (again["compiles"], again["disk_hits"]) == (0, 1)
    assert (again["modules_reused"], again["modules_written"]) == (1, 0)

    good = module.read_bytes()
    module.write_bytes(b"import os\nos._exit(3)\n" + good[: len(good) // 2])
    healed = _finish(_start(tmp_path))
    assert healed["ok"] and healed["modules_rebuilt"] == 1
    assert module.read_bytes() == good
    # numba's cache is keyed by the module's content, which is the same again
    assert healed["compiles"] == 0


def _fresh(monkeypatch, path):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(path))
    cache._made.clear()


def test_key_covers_expression_dtype_and_layout(tmp_path, monkeypatch):
    _fresh(monkeypatch, tmp_path)
    rng = np.random.default_rng(1)
    A, B = rng.random((4, 3)), rng.random((3, 2))
    k = kernel("C[i,k] := A[i,j] * B[j,k] * 0.5", threads=False)
    variants = [
        (k, dict(A=A, B=B)),
        (k, dict(A=A.astype(np.float32), B=B.astype(np.float32))),      # dtype
        (k, dict(A=np.asfortranarray(A), B=B)),                        # layout
        (kernel("C[i,k] := A[i,j] * B[j,k] * 0.25", threads=False), dict(A=A, B=B)),  # expr
    ]
    for n, (kern, arrays) in enumerate(variants, 1):
        before = jit.stats.snapshot()
        C = kern(**arrays)
        after = jit.stats.snapshot()
        scale = 0.25 if n == 4 else 0.5
        np.testing.assert_allclose(C, arrays["A"].astype(np.float64) @ arrays["B"] * scale,
                                   rtol=1e-5)
        assert after["modules_written"] == before["modules_written"] + 1
        assert after["compiles"] + after["disk_hits"] == before["compiles"] + before["disk_hits"] + 1
        assert len(_modules(tmp_path)) == n
    # the same call again touches nothing
    before = jit.stats.snapshot()
    variants[1][0](**variants[1][1])
    assert jit.stats.snapshot() == before


def test_clear_cache_empties(tmp_path, monkeypatch):
    _fresh(monkeypatch, tmp_path)
    A = np.arange(6.0).reshape(2, 3)
    k = kernel("s[i] := A[i,j] * 3.0", threads=False)
    np.testing.assert_allclose(k(A=A), A.sum(1) * 3)
    assert cache.store_pickle(("derivation", "x"), {"a": 1})
    assert _modules(tmp_path) and cache.size() > 0
    tullio_py.clear_cache()
    left = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "CACHEDIR.TAG"]
    assert left == [] and cache.size() == 0
    assert cache.load_pickle(("derivation", "x")) is None
    np.testing.assert_allclose(k(A=A), A.sum(1) * 3)   # loaded kernels keep working


def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TULLIO_CACHE_DIR", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.directory() is None
    before = jit.stats.snapshot()
    A = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(kernel("s[i] := A[i,j] * 7.0", threads=False)(A=A), A.sum(1) * 7)
    assert jit.stats.modules_written == before["modules_written"]
    assert jit.stats.compiles == before["compiles"] + 1
    assert not cache.store_pickle("k", 1) and cache.load_pickle("k") is None
    assert list(tmp_path.rglob("*")) == []


def test_default_directory(monkeypatch):
    monkeypatch.delenv("TULLIO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    if sys.platform.startswith("linux"):
        assert cache.directory() == Path("/somewhere/tullio_py")
    monkeypatch.setenv("TULLIO_CACHE_DIR", "~/x")
    assert cache.directory() == Path(os.path.expanduser("~/x"))


def test_pickles_round_trip_and_reject_damage(tmp_path, monkeypatch):
    _fresh(monkeypatch, tmp_path)
    key = ("grad", "C[i] := A[i,j]", "A")
    assert cache.load_pickle(key) is None
    assert cache.store_pickle(key, ["dA[i,j] += dC[i]"])
    assert cache.load_pickle(key) == ["dA[i,j] += dC[i]"]
    (path,) = (tmp_path / "pickles").glob("*.pkl")
    blob = path.read_bytes()
    path.write_bytes(blob[:-3])
    assert cache.load_pickle(key) is None            # truncated: refused, not unpickled
    path.write_bytes(blob)
    assert cache.load_pickle(key) == ["dA[i,j] += dC[i]"]


def test_size_bound_removes_least_recently_used(tmp_path, monkeypatch):
    _fresh(monkeypatch, tmp_path)
    kernels = tmp_path / "kernels"
    cache._subdir("kernels")
    now = time.time()
    for n, stem in enumerate(["_tullio_old", "_tullio_mid", "_tullio_new"]):
        py = kernels / f"{stem}.py"
        py.write_bytes(b"x" * 1000)
        (kernels / "__pycache__" / f"{stem}._tullio_kernel-3.py311.nbi").write_bytes(b"y" * 1000)
        os.utime(py, (now - 1000 + 100 * n, now - 5000))   # last use: old < mid < new
    assert cache.size() == 6000
    assert cache.prune(limit=4500) == 1
    names = sorted(p.name for p in kernels.rglob("*") if p.is_file())
    assert names == ["_tullio_mid._tullio_kernel-3.py311.nbi", "_tullio_mid.py",
                     "_tullio_new._tullio_kernel-3.py311.nbi", "_tullio_new.py"]
    monkeypatch.setenv("TULLIO_CACHE_SIZE_MB", str(2500 / 2**20))
    cache.prune()
    assert [p.name for p in kernels.glob("*.py")] == ["_tullio_new.py"]


LOAD_SCRIPT = r"""
import json, sys
import numpy as np
from tullio_py import kernel, jit, threads
rng = np.random.default_rng(0)
A, B = rng.random((4, 3)), rng.random((3, 5))
x = rng.random(300000)
k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False, blas=False)
p = kernel("y[i] := exp(x[i]) * 2 + x[i]", threads=True)
ok = bool(np.allclose(k(A=A, B=B), A @ B))
from numba.core.runtime import rtsys
nrt_serial = rtsys._init        # the serial loops allocate nothing: compiled without NRT
pool_serial = threads._layer        # nor do they need numba's thread pool
ok = ok and bool(np.allclose(p(x=x), np.exp(x) * 2 + x))
res = {"ok": ok, "parallel": p.last.source.parallel, "nrt_serial": nrt_serial,
       "pool_serial": pool_serial,
       "registries": "numba.np.arraymath" in sys.modules, "masked": "numpy.ma" in sys.modules}
n = kernel("z[i] := x[i] * 3 - A[i, 0]", threads=False)(x=x[:4], A=A)  # compiled here
res["new_ok"] = bool(np.allclose(n, x[:4] * 3 - A[:, 0]))
res["scipy.linalg"] = "scipy.linalg" in sys.modules
print(json.dumps({**res, **jit.stats.snapshot()}))
"""


def test_a_disk_load_skips_numbas_registries(tmp_path):
    """A kernel on disk (serial, and parallel with vector math) loads in a new process without
    numba's typing and lowering registries (its runtime symbols and thread pool only) and
    without numpy.ma (arrays typed as numba types them: the same overloads are found), runs
    right, and a kernel compiled afterwards in the same process still compiles (the
    registries load then, without importing scipy.linalg).  The serial one, compiled without
    numba's runtime (NRT), loads without setting that up, or numba's thread pool."""
    first = _finish(_start(tmp_path, LOAD_SCRIPT))
    assert first["ok"] and first["new_ok"] and first["parallel"] and first["compiles"] == 3
    again = _finish(_start(tmp_path, LOAD_SCRIPT.replace("x[i] * 3 -", "x[i] * 4 -")
                           .replace("x[:4] * 3", "x[:4] * 4")))
    assert again["ok"] and again["new_ok"] and again["parallel"]
    assert (again["disk_hits"], again["compiles"]) == (2, 1)
    assert not again["registries"] and not again["scipy.linalg"] and not again["masked"]
    assert not again["nrt_serial"]      # set up only for the parallel kernel, loaded next
    assert first["pool_serial"] is again["pool_serial"] is None     # started for it too


VJP_SCRIPT = r"""
import json, sys
import numpy as np
from tullio_py import kernel, jit
rng = np.random.default_rng(0)
A, B, dC = rng.random((4, 3)), rng.random((3, 5)), rng.random((4, 5))
k = kernel("C[i,k] := A[i,j] * B[j,k] + A[i,j]", threads=False, blas=False)
g = k.vjp(dC, A=A, B=B)
ok = bool(np.allclose(g["A"], dC @ B.T + dC.sum(1, keepdims=True)))
ok = ok and bool(np.allclose(g["B"], A.T @ dC))
print(json.dumps({"ok": ok, "sympy": "sympy" in sys.modules, **jit.stats.snapshot()}))
"""


def test_a_derivation_on_disk_spares_a_new_process_sympy(tmp_path):
    """The first process derives the gradient with sympy and pickles the derivation; the next
    one reads it (the same gradients, checked against numpy) without importing sympy."""
    first = _finish(_start(tmp_path, VJP_SCRIPT))
    assert first["ok"] and first["sympy"] and first["pickles_written"] >= 1
    again = _finish(_start(tmp_path, VJP_SCRIPT))
    assert again["ok"] and not again["sympy"] and again["pickle_hits"] >= 1


def test_a_module_another_thread_is_running_is_not_handed_out_half_run(tmp_path, monkeypatch):
    """load_module registers a module before running its code; a second Python thread asking
    for the same text meanwhile gets it only once the code has run (four threads calling one
    new kernel at once read a namespace without the kernel: KeyError)."""
    import threading
    _fresh(monkeypatch, tmp_path)
    text = ("import time\nstarted.set()\ntime.sleep(0.3)\n"
            "def f():\n    return 42\n")
    started = threading.Event()
    import builtins
    monkeypatch.setattr(builtins, "started", started, raising=False)
    got = {}

    def first():
        got["first"] = cache.load_module(text)

    t = threading.Thread(target=first)
    t.start()
    assert started.wait(10)                 # the first thread is inside the module's code
    second = cache.load_module(text)
    assert second.f() == 42                 # not a half-run namespace
    t.join()
    assert got["first"] is second


TEXTS_SCRIPT = r"""
import hashlib, json
import numpy as np
from tullio_py import jit, kernel
texts = []
load = jit.load
def recording_load(source, target, signature=""):
    texts.append(jit._keyed_text(source, target, signature))    # the disk cache's key
    return load(source, target, signature)
jit.load = recording_load
sm = kernel('''(max) m[i] := x[i,j]
               e[i,j] := exp(x[i,j] - m[i])
               z[i] := e[i,j]
               y[i,j] := e[i,j] / z[i]''', nograd=("m",))
x = np.random.default_rng(0).random((6, 5))
y = sm(x=x)
sm.vjp(np.ones_like(x), x=x)
k = kernel("s[i] := A[i,j] * B[j] + A[i,j]")
k.vjp(np.ones(3), A=np.ones((3, 4)), B=np.ones(4))
print(json.dumps([hashlib.sha1(t.encode()).hexdigest() for t in texts]))
"""


def test_generated_text_does_not_depend_on_the_hash_seed():
    """The disk key is the module text: two processes with different string hash seeds must
    write the same text for the same kernels (a set printed in its iteration order made every
    new process compile the chain's row group again)."""
    runs = []
    for seed in ("1", "2", "3"):
        # the session's shared cache: after the first process the others load, not compile
        env = dict(_env(os.environ["TULLIO_CACHE_DIR"]), PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", TEXTS_SCRIPT], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert len(runs[0]) >= 3
    assert runs[0] == runs[1] == runs[2]


def test_compile_counts_survive_the_memory_bound_and_clear_cache(tmp_path, monkeypatch):
    """jit.stats counts over the process: a function the in-memory bound or clear_cache()
    drops keeps its compiles and disk loads in the totals (they went down by one when the
    bound dropped a function between two snapshots)."""
    _fresh(monkeypatch, tmp_path)
    A = np.arange(6.0).reshape(2, 3)
    kern = kernel("s[i] := A[i,j] * 4.0", threads=False)
    before = jit.stats.snapshot()
    kern(A=A)
    counted = jit.stats.compiles + jit.stats.disk_hits
    assert counted == before["compiles"] + before["disk_hits"] + 1
    monkeypatch.setattr(jit._LOADED, "maxsize", 1)
    np.testing.assert_allclose(kernel("s[i] := A[i,j] * 5.0", threads=False)(A=A),
                               A.sum(1) * 5)       # the bound drops every other function
    assert len(jit._LOADED) == 1
    assert jit.stats.compiles + jit.stats.disk_hits == counted + 1
    tullio_py.clear_cache()
    assert len(jit._LOADED) == 0
    assert jit.stats.compiles + jit.stats.disk_hits == counted + 1
