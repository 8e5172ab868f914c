"""Plan -> source code.  The renderers are built from the same pieces:

- `text`: user names renamed for generated code, numbers and the pad line;
- `emit`: lines and their indentation (`Emitter`);
- `expr`: expressions, per target math table (`Expr`, `MATH`), `combine`, identities;
- `bounds`: loop bounds clipped by guards (`loop_bounds`);
- `nest`: opening a plan's loops (`Nest`), hoisted reads;
- `cpu`: the CPU / python loop nest (`render(plan) -> Source`);
- `cuda`: numba-cuda kernels (`cuda.render(plan) -> CudaSource`) and their launch shapes;
- `fused`: several accumulating statements as one loop nest (`fused.render(plans)`).
- `rows`: consecutive statements that share a row index, run block of rows by block of rows
  (`rows.row_index`, the rule; `rows.render`).
"""
from .cpu import render
from .expr import better, combine, identity_code
from .source import SUM_FASTMATH, Source, arguments, range_argument


def __getattr__(name: str):
    """`cuda` and `fused` are imported on first use (a numpy forward call needs neither)."""
    if name in ("cuda", "fused"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["render", "Source", "SUM_FASTMATH", "arguments", "range_argument", "better", "combine",
           "identity_code", "cuda", "fused"]
