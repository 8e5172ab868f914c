"""`Kernel.vjp` on the CUDA target: arrays in GPU memory in, gradients in GPU memory out.

The gradient statements are the same as on the CPU (grad.py, rewritten by rewrite.py: no
shifted left-hand index, so every element of a gradient array gets its own GPU thread).  Each
runs over the FORWARD's index ranges, as on the CPU, into zero-filled arrays allocated by the
inputs' own library (torch in, torch out).  numpy inputs with target="cuda" are copied to the
device and the gradients copied back.  Checks (names, ranks, shapes, gathers' bounds) run on
host placeholders, as for a forward call.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import bind as binding, vjp_plan, vjp_run
from . import cuda as dev_mod
from ..errors import ArgumentError, GradientError


def vjp(gradient, cotangent, arrays: dict) -> dict:
    """{input: gradient} for a call whose arrays live on the GPU (or target="cuda")."""
    from numba import cuda
    k = gradient.fwd
    eq = k.equation
    out_value = arrays.pop(eq.output, None)
    params = {n: dev_mod.host_scalar(v).item() if dev_mod.on_device(v) else v
              for n, v in arrays.items() if n in eq.params}
    given = {n: v for n, v in arrays.items() if n not in params}
    if out_value is not None:
        given[eq.output] = out_value
    on_gpu = [n for n, v in {**given, "cotangent": cotangent}.items() if dev_mod.on_device(v)]
    host_mode = not on_gpu
    if on_gpu and len(on_gpu) != len(given) + 1:
        host = [n for n in [*given, "cotangent"] if n not in on_gpu]
        raise ArgumentError(f"arrays in GPU memory ({', '.join(on_gpu)}) and in host memory "
                            f"({', '.join(host)}) in one vjp call", eq.text, None,
                            "move them all to the GPU")
    dev = {n: (cuda.to_device(_contiguous(v)) if host_mode else dev_mod.as_numba(v))
           for n, v in {**given, "cotangent": cotangent}.items()}
    cot = dev.pop("cotangent")
    ref = cotangent if not host_mode else None
    lib = "numba" if host_mode else dev_mod.library(cotangent)
    extrema = dev_mod.gather_extrema(eq, dev)
    shapes = {n: (d.shape, d.dtype) for n, d in dev.items() if n != eq.output}
    if eq.assign != ":=":
        shapes[eq.output] = (cot.shape, cot.dtype)
    checked, rng, _, out_shape, _ = dev_mod.check(k, shapes, params, extrema)
    if out_shape == () and tuple(cot.shape) == (1,):      # a scalar kept as one element
        cot = cot.reshape(())
    if tuple(cot.shape) != tuple(out_shape):
        raise GradientError(f"the cotangent has shape {tuple(cot.shape)}, but the output "
                            f"{eq.output} has shape {tuple(out_shape)}", eq.text, eq.lhs.span)
    complex_mode = any(np.dtype(d.dtype).kind == "c" for d in [*dev.values(), cot]) or any(
        isinstance(v, complex) for v in params.values())
    d = gradient.derivation(complex_mode, gradient.real_inputs(eq, dev))
    gparams = vjp_plan.params_for(d, rng)
    ns = {n: v for n, v in dev.items() if n != eq.output or eq.output in eq.arrays}
    # a scalar output's cotangent is a scalar parameter of the gradient statements
    ns[d.cotangent] = dev_mod.host_scalar(cot) if not cot.shape else cot
    if vjp_plan.reads(d, eq.output) and eq.output not in ns:
        if eq.output in dev:
            ns[eq.output] = dev[eq.output]
        else:       # the forward again, on the device
            again = dev_mod.call(k, {**{n: v for n, v in dev.items() if n != eq.output}, **params})
            ns[eq.output] = dev_mod.as_numba(again)
    plan = vjp_plan.plan(d, rng, gparams, {**ns, **params}, tuple(out_shape), np.dtype(cot.dtype),
                         {name: dev[name] for name, _ in d.grads}, complex_mode)
    device = _Device([gradient.kernel_for(s.equation) for s in plan.statements], params,
                     gparams, lib, ref, dev_mod.stream_for(lib, ref))
    grads = vjp_run.run(plan, device, ns)
    result = {n: _as_dtype(lib, g, device.owned[id(g)], np.dtype(dev[n].dtype))
              for n, g in grads.items()}
    if host_mode:
        return {n: v.copy_to_host() for n, v in result.items()}
    return result


class _Device:
    """The GPU frontend of vjp_run: zeroed arrays from the inputs' library, one kernel
    launch per statement."""

    def __init__(self, kernels, params: dict, gparams: dict, lib: str, ref, stream):
        self.kernels, self.params, self.gparams = kernels, params, gparams
        self.lib, self.ref, self.stream = lib, ref, stream
        self.owned = {}         # id(numba view) -> the library's array it views

    def zeros(self, a):
        view, own = dev_mod.alloc(self.lib, a.shape, a.dtype, 0, self.ref)
        self.owned[id(view)] = own
        return view

    def launch(self, plan, step, ns: dict):
        for k in step.members:
            s = plan.statements[k]
            _run(self.kernels[k], ns, self.params, self.gparams, vjp_plan.as_ranges(s.ranges), ns[s.output],
                 self.stream)


def _contiguous(v) -> np.ndarray:
    a = np.asarray(v)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)     # (keeps 0-d arrays 0-d)


def _run(gk, ns: dict, params: dict, gparams: dict, rng: dict, out, stream):
    """One gradient statement over the given ranges, accumulating into `out`."""
    eq = gk.equation
    ghosts = {n: binding.placeholder(ns[n].shape, ns[n].dtype) for n in eq.arrays if n in ns}
    scalars = {n: (gparams[n] if n in gparams else params[n] if n in params else ns[n])
               for n in eq.params}
    for n, v in scalars.items():        # a scalar helper result (`M_arg` of a (max) M :=)
        if hasattr(v, "copy_to_host"):
            scalars[n] = dev_mod.host_scalar(v)
    checked = {**ghosts, **scalars, eq.output: binding.placeholder(out.shape, out.dtype)}
    prepared, call_ranges, extra = dev_mod.prepare(gk, checked, rng, np.dtype(out.dtype),
                                                   tuple(out.shape))
    values = {n: dev_mod.one_d(ns[n]) for n in eq.arrays if n in ns}
    values.update(scalars)
    values[eq.output] = dev_mod.one_d(out)
    if prepared.snapshot:
        values["_old_" + eq.output] = dev_mod.one_d(dev_mod.device_copy(out))
    dev_mod.launch(gk, prepared, values, call_ranges, extra, stream)


def _as_dtype(lib: str, view, own, dtype: np.dtype):
    """The gradient in the input's dtype, as the inputs' library's array."""
    if np.dtype(view.dtype) == dtype:
        return own
    if lib == "torch":
        torch = sys.modules["torch"]      # loaded: the inputs are its tensors
        return own.to(torch.from_numpy(np.empty(0, dtype)).dtype)
    if lib == "cupy":
        return own.astype(dtype)
    from numba import cuda
    return cuda.to_device(view.copy_to_host().astype(dtype))
