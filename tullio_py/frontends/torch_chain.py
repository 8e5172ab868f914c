"""torch tensors through a chain (chain.py): one autograd node for all its statements.

CPU tensors reach the chain as numpy views of their memory (torch.py's `to_numpy`); the
forward runs as with numpy arrays (row groups included) and keeps its temporaries for the
backward, which runs the chain's one vjp plan (chain_grad.py) for exactly the inputs in
`ctx.needs_input_grad`; the temporaries' memory returns to scratch.pool when the node is
freed (after the last backward of the graph), or at once without autograd.  First order: the backward is not differentiable again (torch's
`once_differentiable`; a statement's own Kernel gives higher orders).  Tensors modified in
place between the forward and the backward raise torch's usual error (the inputs and the
result are saved for backward).  The result dtype is numpy's, statement by statement (a
float16/bfloat16 input is computed in float32 and the result cast back).

Inside a `Tape`, under `torch.compile` or torch.func transforms, and with CUDA tensors, the
statements run one by one through their own Kernels, which handle each of those.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import scratch
from ..tape import current
from .torch import HALF, is_wrapped, to_numpy, torch_threads


@torch_threads
def call(chain, arrays: dict):
    tensors = {n: v for n, v in arrays.items() if isinstance(v, torch.Tensor)}
    if (current() is not None or torch.compiler.is_compiling()
            or any(t.device.type != "cpu" or is_wrapped(t) for t in tensors.values())):
        return chain.one_by_one(dict(arrays))[chain.result]
    others = {n: v for n, v in arrays.items() if n not in tensors}
    names = tuple(tensors)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values()):
        return ChainFunction.apply(chain, names, others, *tensors.values())
    temps: list = []
    try:
        return _result(chain, chain.forward({**others, **{n: to_numpy(t) for n, t in
                                                          tensors.items()}}, temps, True),
                       tensors.values())
    finally:
        scratch.pool.give(temps)


def _result(chain, ns: dict, tensors) -> torch.Tensor:
    out = torch.from_numpy(ns[chain.result])
    half = {t.dtype for t in tensors if t.dtype in HALF}
    if len(half) == 1 and out.dtype == torch.float32:
        out = out.to(half.pop())
    return out


class ChainFunction(torch.autograd.Function):
    """The chain as one node: forward keeps every array of the chain, backward runs its vjp."""

    @staticmethod
    def forward(ctx, chain, names, others, *tensors):
        arrays = {**others, **{n: to_numpy(t) for n, t in zip(names, tensors)}}
        temps: list = []
        ns = chain.forward(arrays, temps)
        out = _result(chain, ns, tensors)
        ctx.chain, ctx.names, ctx.arrays, ctx.ns = chain, names, arrays, ns
        ctx.lease = scratch.Lease(scratch.pool, temps)  # back when the graph is freed
        ctx.dtypes = tuple(t.dtype for t in tensors)
        ctx.save_for_backward(*tensors, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, gout):
        ctx.saved_tensors                          # (raises if one was modified in place)
        wanted = [n for n, need in zip(ctx.names, ctx.needs_input_grad[3:]) if need]
        grads = _vjp(ctx.chain, ctx.ns, gout, ctx.arrays, wanted)
        return (None, None, None, *[
            torch.from_numpy(grads[n]).to(dt) if n in grads else None
            for n, dt in zip(ctx.names, ctx.dtypes)])


@torch_threads
def _vjp(chain, ns: dict, gout: torch.Tensor, arrays: dict, wanted: list) -> dict:
    cot, dtype = to_numpy(gout), ns[chain.result].dtype
    if cot.dtype != dtype:
        cot = cot.astype(dtype)
    return chain.gradient_side.vjp(ns, cot, arrays, wanted)
