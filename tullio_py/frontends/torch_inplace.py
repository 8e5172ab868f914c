"""In-place statements (`=`, `+=`, `-=`) on tensors that require grad, through torch autograd.

`InPlace` writes into the output tensor's own memory, marks it dirty (torch moves the tensor's
history onto this node and bumps its version counter, so a node that saved the old value and
runs later raises torch's "modified by an inplace operation" error; an in-place write into a
leaf that requires grad is torch's error too).  Backward follows the Tape's overwrite semantics
(tape.py): the inputs get the statement's vjp, with the old value of the output as an input of
its own where the right side reads it; the old value's gradient passes through `+=` and `-=`
unchanged, `=` zeroes it on the elements it writes, and `*=` (`y = y_old * F`) multiplies it
by the factor F (the statement run on ones) while the inputs' vjp reads y_old: exact with zeros
in y_old or in the factors, no division.  A derivative of these gradients (create_graph, then
backward again) is a GradientError.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import tape as tape_mod
from . import torch as tf


class InPlace(torch.autograd.Function):
    """kernel(**arrays) into arrays[output], as one autograd node."""

    @staticmethod
    def forward(ctx, spec, others: dict, *tensors):
        kernel, eq = spec.kernel, spec.kernel.equation
        values = dict(zip(spec.tensors, tensors))
        out = values[eq.output]
        old = out.detach().clone() if eq.output in eq.arrays or eq.assign == "*=" else None
        np_arrays = {n: tf.param_value(t) if n in eq.params else tf.to_numpy(t)
                     for n, t in values.items()}
        np_arrays[eq.output] = out.detach().numpy()     # its own memory (checked by the caller)
        np_arrays.update(others)
        mask = tape_mod.covered(kernel, np_arrays, np_arrays[eq.output]) \
            if eq.assign == "=" else None
        with tf.jit.thread_budget(torch.get_num_threads()):
            kernel(**np_arrays)
        torch.autograd.graph.increment_version(out)
        ctx.mark_dirty(out)
        ctx.spec, ctx.others, ctx.mask = spec, others, mask
        inputs = [t for n, t in values.items() if n != eq.output]
        ctx.save_for_backward(*inputs, out, *([old] if old is not None else []))
        return out

    @staticmethod
    def backward(ctx, g):
        spec, eq = ctx.spec, ctx.spec.kernel.equation
        saved = list(ctx.saved_tensors)
        names = [n for n in spec.tensors if n != eq.output]
        values = dict(zip(names, saved))
        post = saved[len(names)]
        arrays = {n: tf.param_value(t) if n in eq.params else tf.to_numpy(t)
                  for n, t in values.items()}
        arrays.update(ctx.others)
        arrays[eq.output] = tf.to_numpy(post)          # the value after the statement
        gnp = tf.to_numpy(g.contiguous())
        with torch.no_grad(), tf.jit.thread_budget(torch.get_num_threads()):
            k, old = spec.kernel, None
            if eq.output in eq.arrays:                  # reads its own old value
                k, old = tape_mod.old_value_kernel(spec.kernel)
                arrays[old] = tf.to_numpy(saved[-1])
            if eq.assign == "*=":
                # y = y_old * F(inputs): F element by element is the statement run on ones
                # (1 where it does not write); the inputs' vjp reads y_old as the output
                factor = np.ones(gnp.shape, np.result_type(gnp.dtype, arrays[eq.output].dtype))
                k(**{**arrays, eq.output: factor})
                arrays[eq.output] = tf.to_numpy(saved[-1])
            grads = k.vjp(gnp, **arrays)
            read = grads.pop(old, None) if old is not None else None
        if eq.assign == "=":
            keep = np.zeros_like(gnp) if ctx.mask is None else gnp * ~ctx.mask
        elif eq.assign == "*=":                         # the old value times the factor
            keep = gnp * factor
        else:                                           # '+=', '-=': passes through
            keep = gnp
        if read is not None:
            keep = keep + read
        result = []
        for n, want in zip(spec.tensors, ctx.needs_input_grad[2:]):
            t = post if n == eq.output else values[n]
            gr = keep if n == eq.output else grads.get(n)
            if not want or gr is None or n not in spec.diff:
                result.append(None)
            else:
                result.append(tf.to_torch(np.asarray(gr), t.dtype).reshape(t.shape))
        if torch.is_grad_enabled():     # create_graph: a further derivative raises
            result = tf.no_second_order(spec, result, [g, *saved])
        return (None, None, *result)
