"""The torch autograd side of a kernel call: reverse mode, forward mode and vmap rules.

`Apply` is `out = kernel(**arrays)` as one `torch.autograd.Function` in the `setup_context`
form, so torch.func's transforms (grad, vjp, jvp, vmap, jacrev, jacfwd) compose with it:

* backward runs the kernel's gradient kernels (`Kernel.vjp`) inside `Vjp`, itself a Function;
  when torch asks for a graph of the gradients (create_graph, torch.func.grad), it calls the
  gradient statements as tullio_py kernels on the tensors instead (`statement_gradients`), so
  the gradients are differentiable through `Apply` again (double backward, Hessian products;
  a `(*)` reduction through the product of the other factors, grad.exact_product, so that
  its second derivative is exact at zero factors);
* forward mode (`jvp`) runs the kernel's tangent kernels (`Kernel.jvp`) inside `Jvp`;
* vmap rules never loop in Python: a batched call is the same statement with one more index on
  both sides (`batched_kernel`), compiled once per expression and set of batched names.  The
  forward adds the index only to the inputs that are batched; `Vjp` and `Jvp` batch every array
  they read (unbatched ones as zero-stride expansions), so per-example gradients of shared
  weights come out per example.

A derivative of `Vjp` (under torch.func, gradients whose statements cannot be called as `:=`
kernels: clamp, mod or pad positions on the left) or of `Jvp` (reverse mode over forward mode)
raises a GradientError, never a silently missing term.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import memo
from ..errors import GradientError, TullioError
from ..ir import Access, Affine, Call, Gather, Param, Wrapped, map_expr
from . import torch as tf, vjp as vjp_mod


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
    text = str(type(eq)(lhs, eq.assign, map_expr(eq.rhs, node), eq.reduction, eq.finaliser))
    return make(text, **kernel.options.as_kwargs())


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
                made = statement_gradients(spec, ctx.others, needs, gout, out, tensors)
            except TullioError:         # first order still exact below; second order raises
                made = None
            if made is not None:
                return (None, None, *[made.get(n) for n in spec.tensors])
        # the output was made C-ordered and the gradient loops are planned for that order
        grads = iter(Vjp.apply(spec, ctx.others, needs, ctx.keep_out, gout.contiguous(), out,
                               *tensors))
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
        return Jvp.apply(spec, ctx.others, which, *given, *tensors)

    @staticmethod
    def vmap(info, in_dims, spec, others, *tensors):
        dims = in_dims[2:]
        if all(d is None for d in dims):
            return Apply.apply(spec, others, *tensors), None
        k, _, values = _batched_spec(spec, others, tensors, dims, info.batch_size, False)
        return k(**values, **others), 0


def _ghost(t: torch.Tensor) -> torch.Tensor:
    return t.detach().new_zeros(()).expand(t.shape)


# ----------------------------------------------------------------------------- second order
def statement_gradients(spec, others: dict, needs, gout, out, tensors) -> dict | None:
    """{input: gradient} computed by calling the kernel's gradient statements as kernels on
    these tensors, so the gradients are themselves differentiable through `Apply` (double
    backward, and again).  Each `dX[...] += rhs` runs as `dX[...] := rhs` with the ranges of
    X's dimensions (a gather on the left scatters into a result padded to X's length); a
    left side through clamp/mod/pad (a many-to-one scatter) runs as it is, `+=` into zeros
    of X's shape, in place through autograd (torch_inplace.py), differentiable once more;
    helpers (`:=`) run as they are.  None under torch.func's transforms when a statement
    needs the in-place form: then the first-order gradients come from `Vjp`, whose
    derivative raises."""
    from ..factory import kernel as make
    from ..parse import parse
    kernel = spec.kernel
    if kernel.equation.reducer == "*":
        return _product_gradients(spec, others, needs, gout, tensors)
    values = dict(zip(spec.tensors, tensors))
    sub = vjp_mod.subset_kernel(kernel, needs)
    d, lines = _statements(sub, spec, others, values, gout)
    env = {**values, **others, kernel.equation.output: out, d.cotangent: gout}
    opts = _options(kernel)
    names = dict(d.gradient_names)
    result = {}
    for n in needs:
        scope, total = dict(env), None
        for line in lines.get(n, ()):
            e = parse(line)
            args = {a: scope[a] for a in (*e.arrays, *e.params) if a in scope}
            if e.output != names[n]:                    # a helper
                scope[e.output] = make(line, **opts)(**args)
                continue
            term = _assign(e, values[n], opts, args, make)
            if term is None:
                return None
            total = term if total is None else total + term
        x = values[n]
        result[n] = torch.zeros_like(x) if total is None else \
            total.to(x.dtype).reshape(x.shape)
    return result


def _options(kernel) -> dict:
    return {n: getattr(kernel.options, n) for n in ("threads", "target", "fastmath", "blas", "fuse")}


def _product_gradients(spec, others: dict, needs, gout, tensors) -> dict | None:
    """The gradients of a `(*)` reduction from grad.exact_product's statements: the product
    of the other factors P (one more kernel call) and the gradient statements of
    `Y[L] := P[L,R] * RHS`, so that their own derivative is exact at zero factors too (the
    zero-count helpers of the vjp are exact in value but piecewise).  A finaliser is
    differentiated first as its own statement `out[L] := f(acc[L])`."""
    from dataclasses import replace

    from ..factory import kernel as make
    from ..grad import exact_product
    kernel, opts = spec.kernel, _options(spec.kernel)
    eq = kernel.equation
    values = dict(zip(spec.tensors, tensors))
    if eq.finaliser:
        eq = replace(eq, finaliser=None, text="")
        acc = make(str(eq), **opts)(**values, **others)
        name = next(n for n in (eq.output + "_acc" + "_" * k for k in range(len(values) + 2))
                    if n not in values and n not in others)
        fin = make(str(type(eq)(eq.lhs, ":=", Call(kernel.equation.finaliser,
                                                   (Access(name, eq.lhs.indices),)))), **opts)
        made = statement_gradients(tf.Spec.of(fin, {name: acc}), {}, (name,), gout,
                                   fin(**{name: acc}), [acc])
        gout = made[name]
    forms = exact_product(eq)
    if forms is None:
        return None
    prod, total = forms
    rng = kernel.ranges(**_np_values(eq, values), **others)
    P = make(str(prod), **opts, ranges={r: rng[r] for r in prod.lhs_indices})(
        **{n: v for n, v in {**values, **others}.items() if n in (*prod.arrays, *prod.params)})
    yk = make(str(total), **opts)
    arrays = {**values, **others, prod.output: P}
    ys = tf.Spec.of(yk, arrays)
    made = statement_gradients(ys, ys.scalar_values(arrays), needs, gout, None,
                               [arrays[n] for n in ys.tensors])
    return None if made is None else {n: made[n] for n in needs}


def _np_values(eq, values: dict) -> dict:
    """Zero-stride zeros of the tensors' shapes (index arrays with their values): enough to
    infer ranges and print bounds."""
    index_only = {g.array for g in eq.gathers()} - {a.array for a in eq.accesses()}
    arrays = {}
    for n, t in values.items():
        dt = tf.np_compute_dtype(t.dtype)
        if n in index_only and not tf.is_wrapped(t):
            arrays[n] = tf.to_numpy(t)
        else:
            arrays[n] = np.zeros((), dt) if n in eq.params else tf.placeholder(t.shape, dt)
    return arrays


def _statements(sub, spec, others: dict, values: dict, gout):
    """(derivation, {input: [statements]}) for these shapes: the statements print the bounds
    of the last vjp, so a vjp runs first on zero-stride zeros of the right shapes (index
    arrays with their values)."""
    arrays = _np_values(sub.equation, values)
    with torch.no_grad():
        sub.vjp(tf.placeholder(gout.shape, tf.np_compute_dtype(gout.dtype)), **arrays,
                **others)
    g = sub.gradient_side()
    return g.last[0], g.equations()


def _assign(e, x, opts: dict, args: dict, make):
    """`dX[...] += rhs` as a new tensor of X's shape (None when the left side is not plain)."""
    slots = e.lhs.indices
    if all(isinstance(s, Affine) and s.is_bare for s in slots):
        lhs = [s.terms[0][0] for s in slots]
        if len(set(lhs)) != len(lhs):
            return None
        rng = {i: range(x.shape[k]) for k, i in enumerate(lhs)}
        return make(_define(e), **opts, ranges=rng)(**args)
    if len(slots) == 1 and isinstance(slots[0], Gather) and not slots[0].offset.terms:
        r = make(_define(e), **opts)(**args)
        return torch.nn.functional.pad(r, (0, x.shape[0] - r.shape[0]))
    if torch._C._are_functorch_transforms_active():
        return None                     # (the in-place Function has no torch.func rules)
    # clamp/mod/pad positions or shifts on the left: the statement itself, `+=` into zeros
    # of X's shape; in place with autograd (torch_inplace.InPlace), so it is differentiable
    # once more with respect to everything it reads
    dx = torch.zeros(x.shape, dtype=_result_dtype(x, args.values()))
    return make(str(e), **opts)(**{e.output: dx}, **args)


def _result_dtype(x, values) -> torch.dtype:
    dt = x.dtype
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_complex():
            dt = torch.promote_types(dt, v.dtype)
    return dt


def _define(e) -> str:
    return str(type(e)(e.lhs, ":=", e.rhs, e.reduction, e.finaliser))


# ----------------------------------------------------------------------------- reverse mode
class _FirstOrder(torch.autograd.Function):
    """A Function whose own derivative is not defined: differentiating it again is a
    GradientError naming the statement (the spec, first input, carries the kernel)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.text = inputs[0].kernel.text

    @staticmethod
    def backward(ctx, *grads):
        _second_order(ctx.text)


class Vjp(_FirstOrder):
    """The gradients of `needs` (one tensor each) from the cotangent, the output and the
    inputs (zero-stride tensors where the gradients do not read them)."""
    generate_vmap_rule = False

    @staticmethod
    def forward(spec, others, needs, keep_out, gout, out, *tensors):
        shapes = {n: (tuple(t.shape), t.dtype) for n, t in zip(spec.tensors, tensors)}
        grads = tf.run_backward(spec, others, dict(zip(spec.tensors, tensors)), shapes, gout,
                                out if keep_out else None, set(needs))
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


def _second_order(text: str):
    raise GradientError("double backward (a gradient of a gradient) through a tullio_py "
                        "kernel is not supported", text, None,
                        "differentiate once, or write the first derivative as its own "
                        "tullio_py expression")
