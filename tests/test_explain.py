"""explain.limits: the machine's limits are the best measured, so a measurement taken under
load (which comes out low) never lowers them."""
from tullio_py import explain


def test_limits_keep_the_best_measurement(monkeypatch, tmp_path):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    explain._LIMITS.clear()
    measured = iter([(100.0, 5.0), (60.0, 9.0), (300.0, 1.0)])
    monkeypatch.setattr(explain, "_measure", lambda n: next(measured))
    assert explain.limits() == (100.0, 5.0)          # first use measures and stores
    assert explain.limits() == (100.0, 5.0)          # then memory
    explain._LIMITS.clear()
    assert explain.limits() == (100.0, 5.0)          # then disk, without measuring
    assert explain.limits(refresh=True) == (100.0, 9.0)   # a loaded peak does not lower it
    explain._LIMITS.clear()
    assert explain.limits() == (100.0, 9.0)
    assert explain.limits(refresh=True) == (300.0, 9.0)
    explain._LIMITS.clear()


def test_limits_are_kept_per_thread_count(monkeypatch, tmp_path):
    """One core's limit and two cores' are measured and stored apart; explain measures a call
    against the threads it runs on (one for serial loops)."""
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    explain._LIMITS.clear()
    asked = []
    monkeypatch.setattr(explain, "_measure", lambda n: asked.append(n) or (100.0 * n, 5.0 * n))
    assert explain.limits(threads=1) == (100.0, 5.0)
    assert explain.limits(threads=2) == (200.0, 10.0)
    assert explain.limits(threads=1) == (100.0, 5.0) and asked == [1, 2]
    import numpy as np
    from tullio_py import kernel
    A = np.random.default_rng(0).random((40, 40)).astype(np.float32)
    e = kernel("y[i,j] := A[i,j] * 2", threads=1).explain(A=A)
    assert e.limit_threads == 1 and e.peak_flops == 100.0 and "on 1 thread:" in str(e)
    explain._LIMITS.clear()


def test_the_measured_limits_are_positive_on_each_thread_count():
    """The measurement itself (not replaced): a 1024 sgemm and a 64 MB copy, on one thread
    and on two."""
    for n in (1, 2):
        peak, bw = explain._measure(n)
        assert peak > 1e8 and bw > 1e8
