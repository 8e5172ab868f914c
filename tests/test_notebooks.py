"""The notebooks in notebooks/ execute from top to bottom (nbclient, kernel "python3"), are
stored with their outputs cleared, and benchmarks/plot_results.py (which notebook 04 calls)
turns benchmark JSON into the right ratios and figures.

The kernel process inherits this session's environment: the shared kernel cache directory
(conftest.py), PYTHONPATH with the repository root (tullio_py need not be installed), and PATH
with this interpreter's directory first (the "python3" kernelspec runs `python`).
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NEEDS = {  # modules a notebook imports beyond numpy and tullio_py
    "01-tour.ipynb": ["matplotlib"],
    "02-local-convolution-in-pytorch.ipynb": ["matplotlib", "torch", "sklearn"],
    "03-reading-gradient-code.ipynb": ["sympy"],
    "04-benchmarks.ipynb": ["matplotlib"],
    "05-dask.ipynb": ["dask", "distributed"],
}
TIMES: dict = {}


def _ensure_python3_kernelspec():
    from jupyter_client.kernelspec import KernelSpecManager
    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user"], check=True,
                       capture_output=True)


def test_the_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    assert names == sorted(NEEDS), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name}: clear the outputs before committing "
                "(jupyter nbconvert --clear-output --inplace notebooks/*.ipynb)")
    assert path.stat().st_size < 100_000


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    for module in NEEDS.get(path.name, []):
        pytest.importorskip(module)
    _ensure_python3_kernelspec()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("PATH", os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240,
                                     resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()          # raises CellExecutionError with the failing cell and traceback
    TIMES[path.name] = time.perf_counter() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs if o.output_type == "stream")
    if path.name != "04-benchmarks.ipynb":     # 04 prints recorded data, not checks
        assert not re.search(r"(?<![=\w])False\b", printed), \
            f"{path.name}: a printed check came out False:\n{printed}"
    print(f"\n{path.name}: {TIMES[path.name]:.1f} s (total so far "
          f"{sum(TIMES.values()):.1f} s)")


# ----------------------------------------------------------------------------- plot_results
def _plot_results():
    import importlib.util
    spec = importlib.util.spec_from_file_location("plot_results",
                                                  ROOT / "benchmarks" / "plot_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SUITE = {"times_s": {
    "local conv fwd": {"numpy einsum": 0.010, "numba hand (b innermost)": 0.004,
                       "numba hand, 1 thread": 0.007, "tullio_py": 0.005,
                       "tullio_py, 1 thread": 0.009},
    "local conv grad": {"numpy hand-derived": 0.030, "numba hand (gather form)": 0.006,
                        "tullio_py vjp": 0.008, "tullio_py vjp, 1 thread": 0.016},
    "matmul": {"numpy A@B": 0.002, "tullio_py (BLAS dispatch)": 0.004, "tullio_py vjp": None}},
    "threads": 2, "dtype": "float32"}
LATENCY = {"import tullio_py [s]": 0.05, "cold first call, conv forward [s]": 1.5,
           "warm first call, conv forward [s]": 0.25, "cold first call, conv vjp [s]": "pending",
           "per-call overhead, 4x4 matmul [us]": {"kernel": 3.0}}


def test_plot_results_ratios_from_synthetic_json(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    pr = _plot_results()
    (tmp_path / "bench_suite.json").write_text(json.dumps(SUITE))
    (tmp_path / "bench_latency.json").write_text(json.dumps(LATENCY))
    (tmp_path / "other.json").write_text(json.dumps({"unrelated": 1}))
    data = pr.load(tmp_path)
    assert sorted(data["files"]) == ["bench_latency.json", "bench_suite.json"]
    r = pr.ratios(data["suite"])
    assert r["local conv fwd"] == pytest.approx({"numpy einsum": 2.0,
                                                 "numba hand (b innermost)": 0.8})
    assert r["matmul"] == pytest.approx({"numpy A@B": 0.5})
    s = pr.thread_scaling(data["suite"])
    assert s == pytest.approx({"local conv fwd: tullio_py": 1.8, "local conv fwd: numba hand":
                               1.75, "local conv grad: tullio_py vjp": 2.0})
    g = pr.grad_forward(data["suite"])
    assert g == pytest.approx({"local conv: tullio_py": 1.6, "local conv: numpy": 3.0,
                               "local conv: numba": 1.5})
    assert pr.latency(data["latency"]) == {"import tullio_py": 0.05,
                                           "cold first call, conv forward": 1.5,
                                           "warm first call, conv forward": 0.25}
    names = [n for n, _ in pr.figures(data)]
    assert names == ["time_ratios", "thread_scaling", "gradient_forward", "latency"]
    assert "| matmul | tullio_py vjp | pending | |" in pr.table(data["suite"])
    out = tmp_path / "png"
    assert pr.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == [
        "plot_gradient_forward.png", "plot_latency.png", "plot_thread_scaling.png",
        "plot_time_ratios.png"]


def _layers(written, only=None, tullio=2.0):
    per = {"conv1d": {"torch": {"fwd": 1.0, "fwd_bwd": 4.0}, "jax": {"fwd": 0.5, "fwd_bwd": 8.0},
                      "tullio_py": {"fwd": tullio, "fwd_bwd": 6.0}},
           "softmax": {"torch": {"fwd": 1.0, "fwd_bwd": 2.0},
                       "tullio_py": {"fwd": 0.5, "fwd_bwd": 3.0}}}
    if only:
        per = {w: per[w] for w in only}
    return {"tullio_py": "/x", "quick": False, "written": written, "only": only,
            "threads": {"1": per, "2": per}}


def test_plot_results_layers_the_latest_full_run(tmp_path):
    """bench_layers reports: tullio_py's time over the fastest competitor's per layer, mode
    and thread count; of several reports the full run written last is shown."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    pr = _plot_results()
    (tmp_path / "bench_layers_a.json").write_text(json.dumps(_layers("2026-12-01T10:00:00Z")))
    (tmp_path / "bench_layers_b.json").write_text(
        json.dumps(_layers("2026-12-03T10:00:00Z", tullio=4.0)))
    (tmp_path / "bench_layers_c.json").write_text(     # newer, but only one layer
        json.dumps(_layers("2026-12-04T10:00:00Z", only=["softmax"], tullio=9.0)))
    old = _layers("", tullio=8.0)
    del old["written"], old["only"]                     # a report from before either field
    (tmp_path / "bench_layers_z.json").write_text(json.dumps(old))
    data = pr.load(tmp_path)
    assert data["files"] == ["bench_layers_b.json"]
    r = pr.layer_ratios(data["layers"])
    assert r["fwd"]["1"] == pytest.approx({"conv1d": 8.0, "softmax": 0.5})
    assert r["fwd_bwd"]["2"] == pytest.approx({"conv1d": 1.5, "softmax": 1.5})
    assert [n for n, _ in pr.figures(data)] == ["layers"]
    out = tmp_path / "png"
    assert pr.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert [p.name for p in out.glob("*.png")] == ["plot_layers.png"]


def test_plot_results_without_results_says_how_to_produce_them(tmp_path, capsys):
    pr = _plot_results()
    assert pr.load(tmp_path / "missing") == {"files": []}
    assert pr.main(["--results", str(tmp_path / "missing")]) == 0
    out = capsys.readouterr().out
    assert "No benchmark results" in out and "benchmarks/bench_suite.py" in out
