"""Runs tests/cuda_sim_cases.py in its own process on numba-cuda's CUDA simulator: the
simulator is chosen when numba is first imported, so it cannot share this process."""
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                    reason="numba-cuda is not installed (extra 'cuda')")
def test_cuda_target_on_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = os.path.dirname(HERE)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "pytest", os.path.join(HERE, "cuda_sim_cases.py"),
                           "-q", "-o", "addopts=", "-p", "no:cacheprovider", "-p", "no:xdist"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
