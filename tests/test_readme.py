"""README.md never goes stale: every ```python block runs, in order, in one namespace (as a
reader would paste them), and where a ```text block follows a python block directly, it is the
output that block prints.

A block that imports torch is skipped when torch is not installed (later blocks must not need
its names); nothing else is skipped.
"""
import contextlib
import io
import os
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def blocks(text: str) -> list[tuple[str, str | None, int]]:
    """[(python source, expected output or None, line number)] in order."""
    found = [(m.group(1), m.group(2), m.start(), m.end()) for m in FENCE.finditer(text)]
    out = []
    for k, (lang, body, start, end) in enumerate(found):
        if lang != "python":
            continue
        expected = None
        if k + 1 < len(found):
            nlang, nbody, nstart, _ = found[k + 1]
            if nlang == "text" and not text[end:nstart].strip():
                expected = nbody
        out.append((body, expected, text.count("\n", 0, start) + 1))
    return out


def normalise(s: str) -> str:
    return "\n".join(line.rstrip() for line in s.strip().splitlines())


def run_blocks(text: str):
    """Yield (line, source, expected, printed) for every python block, run in one namespace."""
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    namespace: dict = {"__name__": "__readme__"}
    for source, expected, line in blocks(text):
        if not has_torch and re.search(r"^\s*(import torch|from torch)", source, re.M):
            continue
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), warnings.catch_warnings():
            warnings.simplefilter("default")
            exec(compile(source, f"README.md:{line}", "exec"), namespace)
        yield line, source, expected, buf.getvalue()


def test_readme_has_python_blocks_with_outputs():
    found = blocks(README.read_text())
    assert len(found) >= 12
    assert sum(e is not None for _, e, _ in found) >= 10


def test_readme_blocks_run_and_print_what_they_show(monkeypatch):
    monkeypatch.chdir(ROOT)
    os.environ.setdefault("NUMBA_NUM_THREADS", "2")
    ran = 0
    for line, source, expected, printed in run_blocks(README.read_text()):
        ran += 1
        if expected is not None:
            assert normalise(printed) == normalise(expected), (
                f"README.md line {line}: the block prints\n{printed}\nbut the README shows\n"
                f"{expected}")
    assert ran >= 10


def test_readme_keeps_the_two_setup_commands():
    """The set-up installs every extra the suite tests (and .ci/run installs the same)."""
    text = README.read_text()
    assert ('```bash\npip install "torch==2.13.0" -e ".[torch,cuda,dask,test]" && python -m '
            'tullio_py demo\npython -m pytest\n```') in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert '-e ".[test,torch,cuda,dask]"' in ci


if __name__ == "__main__":      # print every block's output (to refresh the README by hand)
    for line, source, expected, printed in run_blocks(README.read_text()):
        print(f"--- README.md:{line}\n{printed}")
