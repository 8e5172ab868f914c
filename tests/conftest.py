"""Shared test setup.

The whole run uses one temporary kernel cache, set here at import time, before any test module
can compile a kernel: the tests never read or write the user's cache, and kernels compiled by
one test are reused by the others (and by subprocesses the tests start, which inherit the
environment).  Under pytest-xdist (pyproject's addopts run the suite on two processes) the
workers share the directory the controlling process made, so a kernel one worker compiled is
loaded from disk, not compiled again, by the other: the disk cache is safe for several
processes at once (files are written under temporary names and renamed into place).  The
process that made the directory removes it at the end.
"""
import os
import sys
import shutil
import tempfile

import pytest

_SHARED = "TULLIO_TEST_CACHE_DIR"     # the directory, for the worker processes started later
_CACHE_DIR = os.environ.get(_SHARED) if os.environ.get("PYTEST_XDIST_WORKER") else None
_OWNER = not (_CACHE_DIR and os.path.isdir(_CACHE_DIR))
if _OWNER:
    _CACHE_DIR = tempfile.mkdtemp(prefix="tullio_py-test-cache-")
os.environ["TULLIO_CACHE_DIR"] = os.environ[_SHARED] = _CACHE_DIR
# Parallel kernels use the thread count they are given, whatever else runs on the machine
# (cpu_load.py would lower it on a loaded one): tests that check the count asked for do not
# depend on the load.  tests/test_cpu_load.py checks the limit with a given runnable count.
os.environ["TULLIO_LOAD_AWARE"] = "0"


def pytest_unconfigure(config):
    if _OWNER:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _tullio_cache_dir():
    """The session's kernel cache directory."""
    os.environ["TULLIO_CACHE_DIR"] = _CACHE_DIR
    yield _CACHE_DIR


@pytest.fixture(autouse=True)
def _seeded_global_rngs():
    """Every test starts from the same global random state, so a failure reproduces exactly.

    Tests that draw from torch's or numpy's global generator would otherwise get different
    numbers on every run (and on every test order under pytest-xdist)."""
    import numpy as np
    np.random.seed(0)
    torch = sys.modules.get("torch")           # seeded only where a test module loaded it
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture
def blocked_as_plain(monkeypatch):
    """Register-blocked loops priced like plain ones (blas_shift_cost.BLOCKED_RATE set to
    LOOP_RATE), for the modules that check BLAS decompositions (`pytestmark`): their cases are
    sized for BLAS against plain loops, and blocked loops beat BLAS there (conv1d 6x16x130, 24
    outputs, width 5, one thread: 0.08 ms against BLAS's 0.23 float32, 0.14 against 0.30
    float64; a conv1d's padded input gradient 0.76 against 1.70 ms), as the model says at
    their own rate.  The choice between BLAS and blocked loops is tested where the model's rate
    is kept: test_blas_shift.py's rate tests, test_relayout.py, test_blocking.py."""
    from tullio_py import blas_shift_cost
    monkeypatch.setattr(blas_shift_cost, "BLOCKED_RATE", blas_shift_cost.LOOP_RATE)
