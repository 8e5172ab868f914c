"""memo.py: every in-memory cache is bounded, registered, and emptied by clear_cache()."""
import gc

import numpy as np

import tullio_py
from tullio_py import kernel, memo


def test_bound_drops_oldest_inserted():
    m = memo.Memo("test.bound", maxsize=3)
    for i in range(10):
        m[i] = i * i
    assert list(m) == [7, 8, 9] and m.get(9) == 81 and m.get(0) is None
    m[8] = -1                       # overwriting an entry does not evict another
    assert list(m) == [7, 8, 9] and m[8] == -1
    m.setdefault(10, 100)
    assert list(m) == [8, 9, 10]


def test_registry_is_weak():
    m = memo.Memo("test.weak", maxsize=2)
    m["a"] = 1
    assert memo.sizes().get("test.weak") == 1
    del m
    gc.collect()
    assert "test.weak" not in memo.sizes()


def test_clear_cache_empties_memory_caches(tmp_path, monkeypatch):
    # clear_cache() empties the disk cache too: a private one, not the directory the other
    # test process is loading kernels from
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    A = np.arange(12.0).reshape(3, 4)
    k = kernel("s_memo[i] := A[i,j] * 2.0", threads=False)
    np.testing.assert_allclose(k(A=A), A.sum(1) * 2)
    k.vjp(np.ones(3), A=A)
    held = memo.sizes()
    for name in ("kernel.kernels", "kernel.compiled", "callpath.entries", "grad.derivations",
                 "jit.loaded", "gradient.states"):
        assert held.get(name, 0) > 0, name
    tullio_py.clear_cache()
    assert all(n == 0 for n in memo.sizes().values()), memo.sizes()
    # the Kernel a program holds keeps working: it is planned and compiled again
    np.testing.assert_allclose(k(A=A), A.sum(1) * 2)
    np.testing.assert_allclose(k.vjp(np.ones(3), A=A)["A"], np.full((3, 4), 2.0))
    assert kernel("s_memo[i] := A[i,j] * 2.0", threads=False) is not k   # a new Kernel


def test_many_signatures_stay_bounded():
    k = kernel("t_memo[i] := A[i,j]", threads=False, blas=False)
    for n in range(1, 80):          # 79 shapes: each a new call signature
        A = np.ones((2, n))
        np.testing.assert_allclose(k(A=A), np.full(2, float(n)))
    assert len(k._plans) <= k._plans.maxsize
    assert len(k._calls.entries) <= k._calls.entries.maxsize
