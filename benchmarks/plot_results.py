"""Plots of the benchmark results in benchmarks/results/*.json (notebooks/04-benchmarks.ipynb
calls this; nothing here measures anything or holds a number).

    python benchmarks/plot_results.py [--results DIR] [--out DIR]

Reads what the benchmark scripts wrote and draws, where the data is present:
- time ratios: each competitor's median time divided by tullio_py's, per workload
  (from bench_suite.json: above 1, tullio_py is faster);
- thread scaling: time on 1 thread / time on all threads, for every entry measured both ways;
- gradient / forward: the time of each family's gradient over its forward (workload pairs
  named "... fwd" and "... grad");
- compile latency: first call cold (empty cache) and warm (disk cache), import times
  (from the JSON of bench_latency.py);
- everyday layers: tullio_py's time over the fastest competitor's, forward and
  forward+backward, per thread count (from bench_layers.py's reports: the latest full run).
Files are recognised by content, not name: a "times_s" key marks the suite's results, keys
with "first call" mark the latency results, a "threads" key of {layer: {competitor: times}}
marks a bench_layers report.  Of several layer reports the one shown ran every layer (no
--only) and was written last (its "written" time; reports without one count as older, then
by file time and name).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

HOW_TO = """No benchmark results in {dir}. To produce them (a few minutes on 2 cores):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_suite.py
        # writes benchmarks/results/bench_suite.json (and bench_suite.png)
    python benchmarks/bench_latency.py --json benchmarks/results/bench_latency.json

then run this again (python benchmarks/plot_results.py, or notebooks/04-benchmarks.ipynb)."""

FAMILIES = ("tullio_py", "numpy", "torch", "numba", "jax")


def load(results_dir: str | Path = RESULTS) -> dict:
    """{"suite": ..., "latency": ..., "layers": ..., "files": [...]} for the JSON files found
    (keys absent when no file of that kind exists; of the layers reports, the one shown)."""
    out: dict = {"files": []}
    d = Path(results_dir)
    if not d.is_dir():
        return out
    layers = None           # (its key, the report) of the layers report shown
    for p in sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime):   # newest last wins
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if "times_s" in data:
            out["suite"] = data
        elif any("first call" in k for k in data):
            out["latency"] = data
        else:
            if _is_layers(data):
                key = (not data.get("only"), len(next(iter(data["threads"].values()), {})),
                       str(data.get("written", "")), p.stat().st_mtime, p.name)
                if layers is None or key > layers[0]:
                    layers = (key, data)
            continue
        out["files"].append(p.name)
    if layers is not None:
        out["layers"] = layers[1]
        out["files"].append(layers[0][-1])
    return out


def _is_layers(data: dict) -> bool:
    """Whether `data` is a bench_layers.py report: {"threads": {n: {layer: {competitor:
    {"fwd": ms, "fwd_bwd": ms}}}}} with tullio_py among the competitors."""
    per = data.get("threads")
    if not isinstance(per, dict) or not per:
        return False
    return all(isinstance(v, dict) and v and all(
        isinstance(c, dict) and "tullio_py" in c and all(
            isinstance(r, dict) and "fwd" in r and "fwd_bwd" in r for r in c.values())
        for c in v.values()) for v in per.values())


def layer_ratios(report: dict) -> dict:
    """{mode: {threads: {layer: tullio_py's time / the fastest competitor's}}} for modes
    "fwd" and "fwd_bwd" of a bench_layers report (below 1: tullio_py faster)."""
    out: dict = {"fwd": {}, "fwd_bwd": {}}
    for n, per in report["threads"].items():
        for mode in out:
            out[mode][n] = {w: comps["tullio_py"][mode] / min(
                r[mode] for c, r in comps.items() if c != "tullio_py")
                for w, comps in per.items() if len(comps) > 1}
    return out


def family(name: str) -> str:
    for f in FAMILIES:
        if name.startswith(f):
            return f
    return name.split()[0]


def reference(times: dict) -> str | None:
    """The tullio_py entry a workload's competitors are compared with (all threads)."""
    names = [n for n, t in times.items() if t and n.startswith("tullio_py") and "1 thread" not in n]
    for pref in ("tullio_py", "tullio_py vjp", "tullio_py (BLAS dispatch)"):
        if pref in names:
            return pref
    return names[0] if names else None


def ratios(suite: dict) -> dict:
    """{workload: {competitor: competitor time / tullio_py time}} (single-thread entries out)."""
    out = {}
    for w, times in suite.get("times_s", {}).items():
        ref = reference(times)
        if ref is None:
            continue
        row = {n: t / times[ref] for n, t in times.items()
               if t and not n.startswith("tullio_py") and "1 thread" not in n}
        if row:
            out[w] = row
    return out


def thread_scaling(suite: dict) -> dict:
    """{"workload: entry": t(1 thread) / t(all threads)} for entries measured both ways."""
    out = {}
    for w, times in suite.get("times_s", {}).items():
        for n, t1 in times.items():
            if not t1 or "1 thread" not in n:
                continue
            base = n.replace(", 1 thread", "").replace(" 1 thread", "").strip(" ,")
            many = times.get(base)
            if many is None:         # e.g. "numba hand, 1 thread" -> "numba hand (...)"
                many = next((t for m, t in times.items() if t and m.startswith(base)
                             and "1 thread" not in m), None)
            if many:
                out[f"{w}: {base}"] = t1 / many
    return out


def grad_forward(suite: dict) -> dict:
    """{"pair: family": gradient time / forward time} for workloads "X fwd" / "X grad"."""
    times = suite.get("times_s", {})
    out = {}
    for w in times:
        if not w.endswith(" fwd"):
            continue
        g = w[:-4] + " grad"
        if g not in times:
            continue
        for fam in FAMILIES:
            def first(ts):
                return next((t for n, t in ts.items()
                             if t and family(n) == fam and "1 thread" not in n), None)
            tf, tg = first(times[w]), first(times[g])
            if tf and tg:
                out[f"{w[:-4]}: {fam}"] = tg / tf
    return out


def latency(lat: dict) -> dict:
    """{label: seconds} of the numeric timings in bench_latency's JSON."""
    return {k.replace(" [s]", ""): v for k, v in lat.items()
            if k.endswith("[s]") and isinstance(v, (int, float))}


def _barh(ax, labels, values, title, xlabel, line=None, log=False, ours=None):
    """Horizontal bars; with `line` (a ratio of 1), bars start at the line, so a ratio below 1
    points left and one above points right, also on a log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ours = ours or (lambda lb: "tullio" in lb)
    base = line if line is not None else 0
    ax.barh(range(len(labels)), [v - base for v in values], left=base,
            color=["tab:red" if ours(lb) else "tab:blue" for lb in labels])
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    if line is not None:
        ax.axvline(line, color="k", lw=0.8, ls="--")
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)


def figures(data: dict) -> list:
    """[(name, matplotlib Figure)] for every kind of result present."""
    import matplotlib.pyplot as plt
    figs = []
    suite = data.get("suite")
    if suite:
        tag = (f"{suite.get('dtype', '')}, {suite.get('threads', '?')} threads"
               f"{', quick run' if suite.get('quick') else ''}")
        r = ratios(suite)
        if r:
            fig, axes = plt.subplots(1, len(r), figsize=(3.6 * len(r), 3.2), squeeze=False)
            for ax, (w, row) in zip(axes[0], r.items()):
                _barh(ax, list(row), list(row.values()), w, "time / tullio_py time", 1.0, True)
            fig.suptitle(f"Competitors' time relative to tullio_py (>1: tullio_py faster; {tag})",
                         fontsize=10)
            fig.tight_layout()
            figs.append(("time_ratios", fig))
        s = thread_scaling(suite)
        if s:
            fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(s)))
            _barh(ax, list(s), list(s.values()), f"Thread scaling ({tag})",
                  "time on 1 thread / time on all threads", 1.0)
            fig.tight_layout()
            figs.append(("thread_scaling", fig))
        g = grad_forward(suite)
        if g:
            fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(g)))
            _barh(ax, list(g), list(g.values()), f"Gradient time / forward time ({tag})",
                  "ratio (torch's gradient entry includes its forward)", 1.0)
            fig.tight_layout()
            figs.append(("gradient_forward", fig))
    if data.get("layers"):
        figs.append(("layers", layers_figure(data["layers"])))
    lat = data.get("latency")
    if lat and latency(lat):
        la = latency(lat)
        fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(la)))
        _barh(ax, list(la), list(la.values()), "First-call latency (fresh processes)",
              "seconds (log)", log=True, ours=lambda lb: "numba" not in lb)
        fig.tight_layout()
        figs.append(("latency", fig))
    return figs


def layers_figure(report: dict):
    """The figure of a bench_layers report: layer_ratios as bars per thread count, forward and
    forward+backward side by side, log scale (bench_layers.py saves the same figure)."""
    import matplotlib.pyplot as plt
    r = layer_ratios(report)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (mode, title) in zip(axes, (("fwd", "forward"), ("fwd_bwd", "forward+backward"))):
        per = r[mode]
        names = list(dict.fromkeys(w for v in per.values() for w in v))
        width = 0.8 / max(len(per), 1)
        for k, (n, row) in enumerate(per.items()):
            ax.bar([i + k * width for i, w in enumerate(names) if w in row],
                   [row[w] for w in names if w in row], width,
                   label=f"{n} thread{'s' if n != '1' else ''}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{title}: tullio_py / fastest competitor (below 1: tullio_py faster)",
                     fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(f"Everyday layers (bench_layers.py, {report.get('written', 'undated')})",
                 fontsize=10)
    fig.tight_layout()
    return fig


def table(suite: dict) -> str:
    """The suite's medians as a markdown table (ms, and the ratio to tullio_py)."""
    lines = ["| workload | competitor | median ms | / tullio_py |", "|---|---|---|---|"]
    for w, times in suite.get("times_s", {}).items():
        ref = reference(times)
        for n, t in times.items():
            if t is None:
                lines.append(f"| {w} | {n} | pending | |")
                continue
            rel = f"{t / times[ref]:.2f}" if ref else ""
            lines.append(f"| {w} | {n} | {t * 1e3:.4f} | {rel} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--out", default=None, help="where the PNGs go (default: --results)")
    a = ap.parse_args(argv)
    data = load(a.results)
    if not data["files"]:
        print(HOW_TO.format(dir=a.results))
        return 0
    import matplotlib
    matplotlib.use("Agg")
    out = Path(a.out or a.results)
    out.mkdir(parents=True, exist_ok=True)
    if "suite" in data:
        print(table(data["suite"]))
    for name, fig in figures(data):
        path = out / f"plot_{name}.png"
        fig.savefig(path, dpi=90)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
