"""What a CPU/python renderer hands to jit: the function's text and how to call it."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Source:
    text: str            # the function definition
    name: str            # its name
    args: tuple[str, ...]  # positional arguments, in order
    parallel: bool
    fastmath: object     # True, False, or a tuple of LLVM fast-math flags

    @property
    def allocates(self) -> bool:
        """Whether the function may create arrays: it calls a `_np.` function that is neither
        a ufunc nor a scalar type (the loops apply those to elements, which allocates nothing).
        A serial function that does not is compiled without numba's runtime (jit._options)."""
        for name in re.findall(r"\b_np\.(\w+)\(", self.text):
            f = getattr(np, name, None)
            if not (isinstance(f, np.ufunc) or isinstance(f, type) and issubclass(f, np.generic)):
                return True
        return False


# LLVM fast-math flags of float sums: reassociation (so reductions vectorise), contraction
# into FMA, no signed zeros -- no NaN/inf assumptions.
SUM_FASTMATH = ("contract", "nsz", "reassoc")


def range_argument(name: str, ranges: dict):
    """The value of a generated `_start_<v>` / `_stop_<v>` argument; None for other names."""
    if name.startswith("_start_"):
        return ranges[name[7:]].start
    if name.startswith("_stop_"):
        return ranges[name[6:]].stop
    return None


def arguments(names, values: dict, ranges: dict, extra: dict) -> list:
    """The positional arguments of a generated function whose parameters are `names`: loop
    bounds (`_start_<v>`, `_stop_<v>`) from `ranges`, helper parameters from `extra`, and
    everything else (arrays, "_old_<out>" snapshots, scalars) from `values` by name."""
    return [range_argument(n, ranges) if n.startswith(("_start_", "_stop_"))
            else extra[n] if n in extra else values[n] for n in names]
