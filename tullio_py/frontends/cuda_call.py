"""The CUDA frontend as registry.py sees it: arrays in GPU memory (torch CUDA tensors, CuPy,
numba device arrays) or target="cuda" run on the CUDA target -- calls through
frontends/cuda.py, gradients through frontends/cuda_vjp.py (which builds on cuda.py, so the
two meet here rather than in either)."""
from __future__ import annotations

from . import cuda


def wants(arrays: dict, kernel=None) -> bool:
    """target="cuda", or target="auto" with some array in GPU memory."""
    return kernel.target not in ("cpu", "python") and cuda.wants_cuda(kernel, arrays)


def call(kernel, arrays: dict):
    return cuda.call(kernel, arrays)


def vjp(kernel, cotangent, arrays: dict) -> dict:
    """{input: gradient}, in the memory (and library) of the arrays."""
    from . import cuda_vjp
    return cuda_vjp.vjp(kernel.gradient_side(), cotangent, dict(arrays))
