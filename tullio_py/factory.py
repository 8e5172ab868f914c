"""Kernels built from a statement's text by the modules kernel.py itself calls.

The tape (helper statements at backward), the gradient and tangent sides, and the frontends
(torch custom ops decoded from their key, dask blocks run on a worker, vjp of a subset of the
inputs) need a Kernel for a statement they derive.  They sit below kernel.py in the pipeline,
so they do not import it: kernel.py registers its cached `kernel()` here when it is imported,
and `import tullio_py` (also the import a dask worker or torch does when it unpickles or
decodes a task) imports kernel.py first.  Example: `factory.kernel("y[i] := x[i] * 2",
pad=0)` is `tullio_py.kernel("y[i] := x[i] * 2", pad=0)`, the same cached Kernel; a derived
statement is passed as its `Equation`: `factory.kernel(replace(eq, assign=":="), pad=0)`.
"""
from __future__ import annotations

_make = None


def register(make) -> None:
    """kernel.py hands over its cached factory, once, at import."""
    global _make
    _make = make


def kernel(expr, /, **options):
    """The cached Kernel for `expr` (a statement's text, or an `Equation` a stage derived:
    used as it is, never printed and parsed again) and these options (tullio_py.kernel)."""
    return _make(expr, **options)
