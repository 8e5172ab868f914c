"""tullio_py kernels inside `torch.compile`: two custom ops, so a compiled model keeps one graph.

    tullio_py::forward(str key, Tensor[] tensors, float[] scalars) -> Tensor
    tullio_py::vjp(str key, str needs, Tensor grad, Tensor[] saved, float[] scalars) -> Tensor[]

`key` is a JSON description of the kernel (its expression, the indices it reads only as
values, and its options) and of the call (which names are tensors, which are Python scalars and
of what type): a torch op schema takes strings, not Kernels.  Building the key (once, while
torch.compile traces the call) also files the Kernel under it in a bounded registry (`_BY_KEY`,
a memo.Memo), so the op implementations find the very Kernel object traced, built from its
Equation; only when the registry misses (a fresh process running a saved graph, or an entry
dropped past the bound) is the Kernel rebuilt by parsing the key's text with those
value-only indices (`kernel()`, cached per Equation and options).  The key names a kernel and
a call's kinds of arguments, not its arrays (no dtype, shape or stride is in it: the op serves
any tensors); signature.py's call signatures and compile keys apply inside that Kernel.
The fake (meta) implementation of `forward` infers the
output's shape with the same range inference as a real call, from the tensors' shapes, and its
dtype with the torch rules of frontends/torch.py.  `vjp` is the registered autograd formula;
arrays the gradients do not read are passed as zero-stride tensors of the right shape (one
element of memory), which the gradient kernels use for range inference only.

Calls that cannot be described this way run eagerly behind a graph break (no error): an output
shape that depends on the values of an index array (a gather on the left, or a gather with a
shifted offset), numpy arrays mixed with tensors, complex Python scalars, and in-place forms.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from .. import memo, ranges as ranges_mod
from . import torch as tf, vjp as vjp_mod


# ----------------------------------------------------------------------------- the call
def compiled_call(kernel, arrays: dict):
    spec = tf.Spec.of(kernel, arrays)
    scalars = [n for n in spec.others if not isinstance(arrays[n], np.ndarray)]
    if len(scalars) != len(spec.others) or not _static_shape(kernel) or any(
            isinstance(arrays[n], complex) for n in scalars):
        return _eager(kernel, arrays)
    key = _key(kernel, tuple(spec.tensors), tuple((n, type(arrays[n]).__name__) for n in scalars))
    return torch.ops.tullio_py.forward(key, [arrays[n] for n in spec.tensors],
                                       [float(arrays[n]) for n in scalars])


@torch.compiler.disable
def _eager(kernel, arrays):
    return kernel(**arrays)


_BY_KEY = memo.Memo("torch_ops.kernels", 256)      # key -> the Kernel it was built from


@torch.compiler.assume_constant_result
def _key(kernel, tensors: tuple, scalars: tuple) -> str:
    eq = kernel.equation      # printed: parse(text, indices) rebuilds it exactly
    key = json.dumps({"text": str(eq), "indices": list(eq.value_indices),
                      "options": _options(kernel), "tensors": list(tensors),
                      "scalars": [list(s) for s in scalars]})
    _BY_KEY[key] = kernel
    return key


def _options(kernel) -> dict:
    opts = kernel.options.as_kwargs()
    if opts.get("ranges"):
        opts["ranges"] = {k: [r.start, r.stop] for k, r in kernel.given.items()}
    opts["nograd"] = list(opts.get("nograd") or ())
    return opts


def _static_shape(kernel) -> bool:
    """Whether the output's shape follows from the input shapes alone."""
    eq = kernel.equation
    if any(True for s in eq.lhs.indices for g in _gathers(s)):
        return False
    return not any(g.offset.terms for g in eq.gathers())


def _gathers(slot):
    from ..ir import slot_gathers
    return slot_gathers(slot)


@memo.lru(maxsize=256)
def _decode(key: str):
    d = json.loads(key)
    k = _BY_KEY.get(key)
    if k is None:           # not traced in this process: rebuilt from the text
        k = _rebuild(d)
    casts = {"int": int, "float": float, "bool": bool}
    scalars = [(n, casts.get(t, float)) for n, t in d["scalars"]]
    spec = tf.Spec(k, tuple(d["tensors"]), tuple(n for n, _ in scalars), ())
    return k, spec, scalars


def _rebuild(d: dict):
    """The Kernel a key describes, from its text: parsed with the indices it reads only as
    values (a Kernel built from an Equation has them), with its options."""
    from ..factory import kernel as make
    from ..parse import parse
    opts = dict(d["options"])
    if opts.get("ranges"):
        opts["ranges"] = {k: range(a, b) for k, (a, b) in opts["ranges"].items()}
    else:
        opts.pop("ranges", None)
    opts["nograd"] = tuple(opts.get("nograd") or ())
    return make(parse(d["text"], tuple(d["indices"])), **opts)


def _unpack(key: str, tensors, scalars):
    k, spec, kinds = _decode(key)
    others = {n: cast(v) for (n, cast), v in zip(kinds, scalars)}
    values = dict(zip(spec.tensors, tensors))
    diff = tuple(n for n in spec.tensors if n in tf.Spec.of(k, {**values, **others}).diff)
    return k, tf.Spec(k, spec.tensors, spec.others, diff), others, values


# ----------------------------------------------------------------------------- forward op
@torch.library.custom_op("tullio_py::forward", mutates_args=())
def forward(key: str, tensors: list[torch.Tensor], scalars: list[float]) -> torch.Tensor:
    k, spec, others, _ = _unpack(key, tensors, scalars)
    return tf.run_forward(spec, tensors, others)


@forward.register_fake
def _forward_fake(key, tensors, scalars):
    k, spec, others, values = _unpack(key, tensors, scalars)
    eq = k.equation
    shapes = {n: tuple(int(s) for s in t.shape) for n, t in values.items()
              if n not in eq.params}
    rng = ranges_mod.infer(eq, shapes, {}, k.given)
    shape = ranges_mod.output_shape(eq, rng, {})
    ghosts = {n: (tf.placeholder(shapes[n], tf.np_compute_dtype(t.dtype)) if n not in eq.params
                  else tf.np_compute_dtype(t.dtype).type(0)) for n, t in values.items()}
    from ..bind import result_dtype
    np_dtype = result_dtype(eq, {**ghosts, **others})
    dtype = tf.torch_result_dtype(k, {**values, **others}, np_dtype)
    return tensors[0].new_empty(shape, dtype=dtype)


# ----------------------------------------------------------------------------- vjp op
@torch.library.custom_op("tullio_py::vjp", mutates_args=())
def vjp(key: str, needs: str, grad: torch.Tensor, saved: list[torch.Tensor],
        scalars: list[float]) -> list[torch.Tensor]:
    k, spec, others, _ = _unpack(key, saved[:-1], scalars)
    want = json.loads(needs)
    values = dict(zip(spec.tensors, saved[:-1]))
    shapes = {n: (tuple(t.shape), t.dtype) for n, t in values.items()}
    out = saved[-1] if want["out"] else None
    grads = tf.run_backward(spec, others, values, shapes, grad, out, set(want["needs"]))
    return [g for n, g in zip(spec.tensors, grads) if n in want["needs"]]


@vjp.register_fake
def _vjp_fake(key, needs, grad, saved, scalars):
    _, spec, _ = _decode(key)
    want = set(json.loads(needs)["needs"])
    return [torch.empty_like(t) for n, t in zip(spec.tensors, saved) if n in want]


def _setup_context(ctx, inputs, output):
    key, tensors, scalars = inputs
    k, spec, others, values = _unpack(key, tensors, scalars)
    needs = [n for n in spec.diff if values[n].requires_grad]
    complex_mode = any(t.is_complex() for t in tensors) or output.is_complex()
    keep, keep_out = vjp_mod.reads(k, set(needs), complex_mode)
    # what backward does not read is replaced by a zero-stride tensor of the same shape
    saved = [t if n in keep else _ghost(t) for n, t in values.items()]
    saved.append(output if keep_out else _ghost(output))
    ctx.save_for_backward(*saved)
    ctx.key, ctx.scalars = key, scalars
    ctx.needs = json.dumps({"needs": needs, "out": keep_out})
    ctx.order = [n in needs for n in spec.tensors]


def _ghost(t: torch.Tensor) -> torch.Tensor:
    return t.detach().new_zeros(()).expand(t.shape)


def _backward(ctx, grad):
    grads = iter(torch.ops.tullio_py.vjp(ctx.key, ctx.needs, grad, list(ctx.saved_tensors),
                                         ctx.scalars))
    return None, [next(grads) if want else None for want in ctx.order], [None] * len(ctx.scalars)


forward.register_autograd(_backward, setup_context=_setup_context)
