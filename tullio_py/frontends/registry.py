"""Which frontend runs a call: the first, in a fixed order, whose `wants` takes the arrays.

A frontend is one module with
- `wants(arrays, kernel) -> bool`: whether these arrays (by name; a vjp's cotangent under "")
  are its kind; cheap, no copies, no imports;
- `call(kernel, arrays)`: the statement's result for them (describe the arrays -- bind.py's
  checks --, allocate the output, launch the compiled loops, in whatever way that kind of
  array needs: torch's autograd nodes and dask's block graphs cannot share one
  allocate-then-launch driver, so each frontend's `call` is its own);
- `vjp(kernel, cotangent, arrays) -> dict` (optional; a frontend without it is passed over for
  `Kernel.vjp`);
- `TAPE = True` when its `call` meets an active `Tape` itself (torch reads it outside
  torch.compile's tracing; dask refuses to be recorded); otherwise the Tape records the call
  before the frontend runs it, as for numpy and CUDA arrays.

Adding a kind of array is adding one such module and one line here (or `register` at run
time).  Modules are imported on first use, and only once the library their arrays come from is
loaded (`needs`): `import tullio_py` imports none of them, and numpy calls never import torch
or dask.  The order, first match wins:

    torch   torch tensors (CPU or CUDA)                      frontends/torch_call.py
    dask    dask arrays                                      frontends/dask.py
    cuda    target="cuda", or "auto" with an array on a GPU frontends/cuda_call.py
    numpy   everything else: numpy arrays, scalars           frontends/numpy.py

A call whose arrays are all numpy arrays and scalars of an earlier call's signature never gets
here: `Kernel.__call__` replays it first (callpath.py).  No frontend imports kernel.py: each
gets the Kernel object and uses its public methods.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Callable


@dataclass
class Frontend:
    name: str
    importer: Callable[[], object]   # imports and returns the module (called on first use)
    needs: str | None       # a library that must be loaded already for such arrays to exist
    module: object = None   # the module, once imported

    def load(self):
        if self.module is None:
            self.module = self.importer()
        return self.module


# torch.compile traces the import (a Kernel called on tensors inside a compiled function picks
# its frontend while tracing): it follows an import statement, not importlib.import_module, so
# the built-in frontends are imported by statements.
def _torch_call():
    from . import torch_call
    return torch_call


def _dask():
    from . import dask
    return dask


def _cuda_call():
    from . import cuda_call
    return cuda_call


def _numpy():
    from . import numpy
    return numpy


_ORDER: list[Frontend] = [
    Frontend("torch", _torch_call, "torch"),
    Frontend("dask", _dask, "dask.array"),
    Frontend("cuda", _cuda_call, None),
    Frontend("numpy", _numpy, None),
]


def pick(kernel, arrays: dict, verb: str = "call"):
    """The module of the first frontend (in order) that has `verb` and wants these arrays."""
    modules = sys.modules
    for f in _ORDER:
        if f.needs is not None and f.needs not in modules:
            continue
        m = f.module or f.load()
        if (verb == "call" or hasattr(m, verb)) and m.wants(arrays, kernel):
            return m
    raise LookupError("no frontend takes these arrays")     # numpy's wants takes everything


def names() -> list[str]:
    """The frontends in the order they are asked."""
    return [f.name for f in _ORDER]


def register(name: str, module, needs: str | None = None, before: str = "numpy") -> None:
    """Add a frontend (a module, or its dotted name: imported on first use) ahead of
    `before`; a name already registered is replaced in place."""
    if isinstance(module, str):     # a dotted name: imported on first use
        entry = Frontend(name, lambda: importlib.import_module(module), needs)
    else:
        entry = Frontend(name, lambda: module, needs, module)
    for i, f in enumerate(_ORDER):
        if f.name == name:
            _ORDER[i] = entry
            return
    at = next((i for i, f in enumerate(_ORDER) if f.name == before), len(_ORDER))
    _ORDER.insert(at, entry)


def unregister(name: str) -> None:
    """Remove a frontend added by `register` (the four above stay)."""
    if name in ("torch", "dask", "cuda", "numpy"):
        raise ValueError(f"frontend {name!r} is built in")
    _ORDER[:] = [f for f in _ORDER if f.name != name]
