"""explain.limits: the machine's limits are the best measured, so a measurement taken under
load (which comes out low) never lowers them."""
from tullio_py import explain


def test_limits_keep_the_best_measurement(monkeypatch, tmp_path):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    explain._LIMITS.clear()
    measured = iter([(100.0, 5.0), (60.0, 9.0), (300.0, 1.0)])
    monkeypatch.setattr(explain, "_measure", lambda: next(measured))
    assert explain.limits() == (100.0, 5.0)          # first use measures and stores
    assert explain.limits() == (100.0, 5.0)          # then memory
    explain._LIMITS.clear()
    assert explain.limits() == (100.0, 5.0)          # then disk, without measuring
    assert explain.limits(refresh=True) == (100.0, 9.0)   # a loaded peak does not lower it
    explain._LIMITS.clear()
    assert explain.limits() == (100.0, 9.0)
    assert explain.limits(refresh=True) == (300.0, 9.0)
    explain._LIMITS.clear()
