"""The CUDA frontend as registry.py sees it: arrays in GPU memory (torch CUDA tensors, CuPy,
numba device arrays) or target="cuda" run on the CUDA target -- calls through
frontends/cuda.py, gradients through frontends/cuda_vjp.py (which builds on cuda.py, so the
two meet here rather than in either)."""
from __future__ import annotations

import numpy as np

# what cuda.on_device turns down first: a call with only these never imports cuda.py
_HOST = (np.ndarray, np.generic, int, float, complex, list, tuple)


def wants(arrays: dict, kernel=None) -> bool:
    """target="cuda", or target="auto" with some array in GPU memory."""
    if kernel.target in ("cpu", "python"):
        return False
    if kernel.target == "auto" and all(isinstance(v, _HOST) for v in arrays.values()):
        return False
    from . import cuda
    return cuda.wants_cuda(kernel, arrays)


def call(kernel, arrays: dict):
    from . import cuda
    return cuda.call(kernel, arrays)


def vjp(kernel, cotangent, arrays: dict) -> dict:
    """{input: gradient}, in the memory (and library) of the arrays."""
    from . import cuda_vjp
    return cuda_vjp.vjp(kernel.gradient_side(), cotangent, dict(arrays))
