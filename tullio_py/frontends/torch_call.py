"""Where a call with torch tensors goes: the Tape, the CUDA frontend, in-place statements,
torch.compile's custom ops, the autograd Function, or straight to the compiled loops.

`Kernel.__call__` hands a call here when any argument is a torch tensor (the torch frontend of
registry.py; torch.py describes the conversions and the autograd rules).  It has no `vjp`:
tensors get gradients through torch autograd, and `Kernel.vjp` on tensors runs where their
memory is (the CUDA or numpy frontend).  Example: `C := A[i,j] * B[j,k]` with CPU tensors A
and B where A requires grad goes to `torch_autograd.Apply`; under `torch.no_grad()` it runs
`run_forward` directly; with `=` into a tensor it runs in that tensor's memory (`_in_place`);
with CUDA tensors it goes to frontends/cuda.py.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import ArgumentError, GradientError
from ..tape import current
from . import vjp as vjp_mod
from .torch import (HALF, Spec, is_wrapped, no_second_order, param_value, run_forward, to_numpy,
                    torch_threads)


TAPE = True     # call() consults the Tape itself (torch.compile cannot trace reading it)


def wants(arrays: dict, kernel=None) -> bool:
    """Whether some argument is a torch tensor (CPU or CUDA)."""
    return any(isinstance(v, torch.Tensor) for v in arrays.values())


@torch_threads
def call(kernel, arrays: dict):
    eq = kernel.equation
    compiling = torch.compiler.is_compiling()
    if not compiling:
        tape = current()                  # inside `with Tape()`: the Tape records the call
        if tape is not None:
            return tape.run(kernel, arrays)
    tensors = {n: v for n, v in arrays.items() if isinstance(v, torch.Tensor)}
    devices = {t.device.type for t in tensors.values()}
    if devices - {"cpu"}:
        return _cuda_call(kernel, arrays, devices)
    if eq.assign != ":=":
        return _in_place(kernel, arrays, tensors)
    if compiling:
        from . import torch_ops
        return torch_ops.compiled_call(kernel, arrays)
    spec = Spec.of(kernel, arrays)
    grad_mode = torch.is_grad_enabled()
    if not (grad_mode and any(arrays[n].requires_grad for n in spec.diff)) \
            and not any(is_wrapped(t) for t in tensors.values()):
        return run_forward(spec, [arrays[n] for n in spec.tensors], spec.scalar_values(arrays))
    from .torch_autograd import Apply
    return Apply.apply(spec, spec.scalar_values(arrays), *[arrays[n] for n in spec.tensors])


def _in_place(kernel, arrays: dict, tensors: dict):
    """`=`, `+=`, ... into a tensor's own memory; with tensors that require grad, every
    in-place form into a float tensor is differentiable (torch_inplace.py)."""
    eq = kernel.equation
    out = arrays[eq.output]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values()) \
            and isinstance(out, torch.Tensor) and out.dtype not in HALF \
            and (out.is_floating_point() or out.is_complex()) \
            and not out.is_conj() and not out.is_neg():
        from .torch_inplace import InPlace     # differentiable, with the Tape's semantics
        spec = Spec.of(kernel, arrays)
        return InPlace.apply(spec, spec.scalar_values(arrays), *[arrays[n] for n in spec.tensors])
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values()):
        names = [n for n, t in tensors.items() if t.requires_grad]
        raise ArgumentError(
            f"in-place '{eq.assign}' with tensors that require grad ({', '.join(names)}) is not "
            "differentiable through torch autograd", eq.text, eq.lhs.span,
            "use ':=' to make a new tensor, or run the statement under torch.no_grad()")
    np_arrays = {n: (param_value(v) if n in eq.params else to_numpy(v))
                 if isinstance(v, torch.Tensor) else v for n, v in arrays.items()}
    direct = isinstance(out, torch.Tensor) and out.dtype not in HALF \
        and not out.is_conj() and not out.is_neg()
    if direct:
        np_arrays[eq.output] = out.detach().numpy()
    kernel(**np_arrays)
    if isinstance(out, torch.Tensor):
        if direct:
            torch.autograd.graph.increment_version(out)
        else:
            with torch.no_grad():
                out.copy_(torch.from_numpy(np_arrays[eq.output]))
    return out


# ----------------------------------------------------------------------------- CUDA
def _cuda_call(kernel, arrays: dict, devices: set):
    """CUDA tensors run on the CUDA target (frontends/cuda.py views them without copies and
    allocates the result with torch); with autograd, the backward runs the gradient kernels on
    the same device (frontends/cuda_vjp.py)."""
    eq = kernel.equation
    where = devices | ({"cpu"} if any(isinstance(v, np.ndarray) for v in arrays.values()) else set())
    if len(where) > 1:
        raise ArgumentError(f"arrays on different devices ({', '.join(sorted(where))})",
                            eq.text, None, "move every tensor to the same device")
    from . import cuda
    spec = Spec.of(kernel, arrays)
    if not (torch.is_grad_enabled() and any(arrays[n].requires_grad for n in spec.diff)):
        return cuda.call(kernel, {n: v.detach() if isinstance(v, torch.Tensor) else v
                                  for n, v in arrays.items()})
    if eq.assign != ":=":
        raise ArgumentError(f"in-place '{eq.assign}' with tensors that require grad is not "
                            "differentiable through torch autograd", eq.text, eq.lhs.span,
                            "use ':=' to make a new tensor, or run the statement under "
                            "torch.no_grad()")
    for n in eq.params:
        if isinstance(arrays.get(n), torch.Tensor) and arrays[n].requires_grad:
            raise GradientError(f"no gradient for the scalar parameter '{n}' (parameters are "
                                "runtime constants of the kernel)", eq.text, None)
    return _CudaApply.apply(spec, spec.scalar_values(arrays), *[arrays[n] for n in spec.tensors])


class _CudaApply(torch.autograd.Function):
    """out = kernel(**arrays) on CUDA tensors as one autograd node; backward = the kernel's
    vjp on the same device."""

    @staticmethod
    def forward(ctx, spec: Spec, others: dict, *tensors):
        from . import cuda
        out = cuda.call(spec.kernel, {**dict(zip(spec.tensors, tensors)), **others})
        ctx.spec, ctx.others = spec, others
        ctx.save_for_backward(*tensors, out)
        if not out.is_floating_point() and not out.is_complex():
            ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, gout):
        *tensors, out = ctx.saved_tensors
        spec = ctx.spec
        needs = {n for n, want in zip(spec.tensors, ctx.needs_input_grad[2:])
                 if want and n in spec.diff}
        values = {n: (param_value(t.cpu()) if n in spec.kernel.equation.params else t.detach())
                  for n, t in zip(spec.tensors, tensors)}
        with torch.no_grad():
            grads = vjp_mod.vjp(spec.kernel, gout.contiguous(), {**values, **ctx.others}, needs,
                                out.detach())
        result = [grads.get(n) if n in needs else None for n in spec.tensors]
        if torch.is_grad_enabled():
            result = no_second_order(spec, result, [gout, *tensors])
        return (None, None, *result)
