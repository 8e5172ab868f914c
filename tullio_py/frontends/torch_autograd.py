"""The torch autograd side of a kernel call: reverse mode, forward mode and vmap rules.

`Apply` is `out = kernel(**arrays)` as one `torch.autograd.Function` in the `setup_context`
form, so torch.func's transforms (grad, vjp, jvp, vmap, jacrev, jacfwd) compose with it:

* backward runs the kernel's gradient kernels (`Kernel.vjp`) inside `Vjp`, itself a Function;
  when torch asks for a graph of the gradients (create_graph, torch.func.grad), it calls the
  gradient statements as tullio_py kernels on the tensors instead
  (`torch_higher.statement_gradients`), so the gradients are differentiable through `Apply`
  again (double backward, Hessian products);
* forward mode (`jvp`) runs the kernel's tangent kernels (`Kernel.jvp`) inside `Jvp`; when the
  tangent is differentiated after (reverse over forward: jacrev of jacfwd, backward of a
  forward_ad tangent), it calls the tangent statements as kernels instead
  (`torch_higher.statement_tangent`);
* vmap rules never loop in Python: a batched call is the same statement with one more index on
  both sides (`batched_kernel`), compiled once per expression and set of batched names.  The
  forward adds the index only to the inputs that are batched; `Vjp` and `Jvp` batch every array
  they read (unbatched ones as zero-stride expansions), so per-example gradients of shared
  weights come out per example.

A derivative (reverse or forward mode) of `Vjp` or `Jvp` raises a GradientError, never a
silently missing term (they run only where torch_higher has no differentiable form: a `(*)`
reduction with a shifted left side).
"""
from __future__ import annotations

import inspect

import numpy as np
import torch

from .. import memo
from ..errors import GradientError, TullioError
from ..ir import Access, Affine, Gather, Param, Wrapped, map_expr
from . import torch as tf, torch_higher as higher, vjp as vjp_mod


# ----------------------------------------------------------------------------- batching
@memo.lru(maxsize=256)
def batched_kernel(kernel, names: frozenset):
    """The kernel's statement with a new leading index on the left and on every read of the
    arrays (or 0-d parameters) in `names`: the statement vmap asks for, as a compiled Kernel."""
    from ..factory import kernel as make
    eq = kernel.equation
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
    b = next(n for n in (f"vb{k}" for k in range(len(taken) + 1)) if n not in taken)
    idx = Affine(((b, 1),))

    def slot(s):
        if isinstance(s, Wrapped):
            return Wrapped(s.kind, slot(s.inner), s.lo, s.hi)
        if isinstance(s, Gather) and s.array in names:
            return Gather(s.array, (idx,) + s.indices, s.offset)
        return s

    def node(n):
        if isinstance(n, Access):
            extra = (idx,) if n.array in names else ()
            return Access(n.array, extra + tuple(slot(s) for s in n.indices))
        if isinstance(n, Param) and n.name in names:
            return Access(n.name, (idx,))
        return n

    lhs = Access(eq.output, (idx,) + tuple(slot(s) for s in eq.lhs.indices))
    batched = type(eq)(lhs, eq.assign, map_expr(eq.rhs, node), eq.reduction, eq.finaliser)
    return make(batched, **kernel.options.as_kwargs())


def _to_front(t, bdim, size):
    """t with its batch dimension first (an unbatched t expanded without copying)."""
    if bdim is None:
        return t.unsqueeze(0).expand(size, *t.shape)
    return t.movedim(bdim, 0)


def _batched_spec(spec, others: dict, tensors: list, dims, size, everything: bool):
    names = [n for n, d in zip(spec.tensors, dims) if everything or d is not None]
    k = batched_kernel(spec.kernel, frozenset(names))
    values = {n: _to_front(t, d, size) if n in names else t
              for n, t, d in zip(spec.tensors, tensors, dims)}
    return k, tf.Spec.of(k, {**values, **others}), values


# ----------------------------------------------------------------------------- the call
class Apply(torch.autograd.Function):
    """out = kernel(**arrays) as one autograd node."""
    generate_vmap_rule = False

    @staticmethod
    def forward(spec, others: dict, *tensors):
        return tf.run_forward(spec, tensors, others)

    @staticmethod
    def setup_context(ctx, inputs, output):
        spec, others, *tensors = inputs
        values = dict(zip(spec.tensors, tensors))
        needs = {n for n, want in zip(spec.tensors, ctx.needs_input_grad[2:])
                 if want and n in spec.diff}
        complex_mode = any(t.is_complex() for t in tensors) or output.is_complex()
        keep, keep_out = vjp_mod.reads(spec.kernel, needs, complex_mode)
        ctx.spec, ctx.others, ctx.keep_out = spec, others, keep_out
        ctx.keep = [n in keep for n in spec.tensors]
        # what backward does not read is a zero-stride tensor of the right shape (range
        # inference only); the rest goes through save_for_backward for its version counter
        ctx.save_for_backward(*[t for t, k in zip(tensors, ctx.keep) if k],
                              *([output] if keep_out else []))
        ctx.ghosts = [None if k else _ghost(t) for t, k in zip(tensors, ctx.keep)]
        ctx.out_ghost = None if keep_out else _ghost(output)
        ctx.save_for_forward(*tensors)
        if not output.is_floating_point() and not output.is_complex():
            ctx.mark_non_differentiable(output)

    @staticmethod
    def backward(ctx, gout):
        spec = ctx.spec
        needs = tuple(n for n, want in zip(spec.tensors, ctx.needs_input_grad[2:])
                      if want and n in spec.diff)
        if not needs:
            return (None, None, *[None] * len(spec.tensors))
        saved = iter(ctx.saved_tensors)
        tensors = [next(saved) if k else g for k, g in zip(ctx.keep, ctx.ghosts)]
        out = next(saved) if ctx.keep_out else ctx.out_ghost
        if torch.is_grad_enabled():     # create_graph: gradients that can be differentiated
            try:
                made = higher.statement_gradients(spec, ctx.others, needs, gout, out, tensors)
            except TullioError:         # first order still exact below; second order raises
                made = None
            if made is not None:
                return (None, None, *[made.get(n) for n in spec.tensors])
        # the output was made C-ordered and the gradient loops are planned for that order;
        # with no graph to record (grad mode off, no torch.func transform, no forward-mode
        # level: nothing could differentiate or batch Vjp) its forward runs as it is
        plain = not torch.is_grad_enabled() and not torch._C._are_functorch_transforms_active() \
            and getattr(torch.autograd.forward_ad, "_current_level", 0) < 0
        args = (spec, ctx.others, needs, ctx.keep_out, gout.contiguous(), out, *tensors)
        grads = iter(Vjp.forward(*args, views=True) if plain else Vjp.apply(*args))
        return (None, None, *[next(grads) if n in needs else None for n in spec.tensors])

    @staticmethod
    def jvp(ctx, _spec, _others, *tangents):
        spec = ctx.spec
        tensors = ctx.saved_tensors
        which = tuple(n for n, t in zip(spec.tensors, tangents)
                      if t is not None and n in spec.diff)
        if not which:
            return None
        given = [t for n, t in zip(spec.tensors, tangents) if n in which]
        if torch.is_grad_enabled() and any(map(_tracked, (*given, *tensors))):
            try:                        # a tangent that is differentiated again
                made = higher.statement_tangent(spec, ctx.others, which, given, tensors)
            except TullioError:         # first order still exact below; its derivative raises
                made = None
            if made is not None:
                return made
        return Jvp.apply(spec, ctx.others, which, *given, *tensors)

    @staticmethod
    def vmap(info, in_dims, spec, others, *tensors):
        dims = in_dims[2:]
        if all(d is None for d in dims):
            return Apply.apply(spec, others, *tensors), None
        k, _, values = _batched_spec(spec, others, tensors, dims, info.batch_size, False)
        return k(**values, **others), 0


def _tracked(t: torch.Tensor) -> bool:
    """Whether t carries history for a derivative taken after this one: it requires grad,
    or one of torch.func's grad/jvp wrappers holds it (vmap's batching alone does not)."""
    f = torch._C._functorch
    while f.is_functorch_wrapped_tensor(t):
        if f.is_gradtrackingtensor(t):
            return True
        t = f.get_unwrapped(t)
    return t.requires_grad


def _ghost(t: torch.Tensor) -> torch.Tensor:
    return t.detach().new_zeros(()).expand(t.shape)


# ----------------------------------------------------------------------------- reverse mode
class _FirstOrder(torch.autograd.Function):
    """A Function whose own derivative is not defined: differentiating it again, in reverse
    or in forward mode, is a GradientError naming the statement (the spec, first input,
    carries the kernel)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.text = inputs[0].kernel.text

    @staticmethod
    def backward(ctx, *grads):
        _second_order(ctx.text)

    @staticmethod
    def jvp(ctx, *tangents):
        _second_order(ctx.text)


class Vjp(_FirstOrder):
    """The gradients of `needs` (one tensor each) from the cotangent, the output and the
    inputs (zero-stride tensors where the gradients do not read them)."""
    generate_vmap_rule = False

    @staticmethod
    def forward(spec, others, needs, keep_out, gout, out, *tensors, views=False):
        """`views` (called directly, with no graph to record): a gradient constant along some
        dimensions may be an expanded tensor (vjp_plan.spread_dims)."""
        shapes = {n: (tuple(t.shape), t.dtype) for n, t in zip(spec.tensors, tensors)}
        grads = tf.run_backward(spec, others, dict(zip(spec.tensors, tensors)), shapes, gout,
                                out if keep_out else None, set(needs), views)
        return tuple(g if g is not None else torch.zeros(shapes[n][0], dtype=shapes[n][1])
                     for n, g in zip(spec.tensors, grads) if n in needs)

    @staticmethod
    def vmap(info, in_dims, spec, others, needs, keep_out, gout, out, *tensors):
        size = info.batch_size
        k, bspec, values = _batched_spec(spec, others, tensors, in_dims[6:], size, True)
        gout, out = _to_front(gout, in_dims[4], size), _to_front(out, in_dims[5], size)
        grads = Vjp.apply(bspec, others, needs, keep_out, gout.contiguous(), out,
                          *[values[n] for n in bspec.tensors])
        return grads, tuple(0 for _ in grads)


# ----------------------------------------------------------------------------- forward mode
class Jvp(_FirstOrder):
    """The output's tangent from the tangents of the inputs in `which` and every input."""
    generate_vmap_rule = False

    @staticmethod
    def forward(spec, others, which, *args):
        tangents, tensors = args[:len(which)], args[len(which):]
        kernel, eq = spec.kernel, spec.kernel.equation
        with tf.jit.thread_budget(torch.get_num_threads()):
            arrays = {n: tf.param_value(t) if n in eq.params else tf.to_numpy(t)
                      for n, t in zip(spec.tensors, tensors)}
            t_np = {n: tf.to_numpy(t).reshape(np.shape(arrays[n]))
                    for n, t in zip(which, tangents)}
            dout = kernel.jvp(t_np, **arrays, **others)
        values = dict(zip(spec.tensors, tensors))
        return tf.to_torch(dout, tf.torch_result_dtype(kernel, {**values, **others},
                                                       np.asarray(dout).dtype))

    @staticmethod
    def vmap(info, in_dims, spec, others, which, *args):
        size, n = info.batch_size, len(which)
        tangents = [_to_front(t, d, size) for t, d in zip(args[:n], in_dims[3:3 + n])]
        k, bspec, values = _batched_spec(spec, others, args[n:], in_dims[3 + n:], size, True)
        return Jvp.apply(bspec, others, which, *tangents,
                         *[values[m] for m in bspec.tensors]), 0


# torch's Function.apply binds each call's arguments to `forward`'s signature (setup_context
# form), asking inspect.signature every time (~20 us, twice per forward+backward); inspect
# returns a function's __signature__ as it is, so it is worked out once here.
for _f in (Apply, Vjp, Jvp):
    _f.forward.__signature__ = inspect.signature(_f.forward)


def _second_order(text: str):
    raise GradientError("double backward (a gradient of a gradient) through a tullio_py "
                        "kernel is not supported for this statement", text, None,
                        "differentiate once, or write the first derivative as its own "
                        "tullio_py expression")
