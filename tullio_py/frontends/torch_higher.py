"""Derivatives that are differentiated again: a kernel's gradient and tangent statements
called as tullio_py kernels on torch tensors (through torch_autograd.Apply), so that torch
autograd sees them as ordinary differentiable calls.

`statement_gradients` is the backward of a call under create_graph (double backward, Hessian
products), `statement_tangent` its forward-mode rule when the tangent is differentiated after
(reverse over forward, forward over forward).  Example: `C[i,k] := A[i,j] * B[j,k]` has the
gradient statement `dA[i,j] += dC[i,k] * B[j,k]`, run as `dA[i,j] := dC[i,k] * B[j,k]` with
dC and B tensors; its own backward is again a kernel's.

`(*)` reductions go through grad.exact_product (the product of the other factors as one more
kernel), so their derivatives are exact at zero factors to every order.  A statement writing
through clamp/mod/pad, a gather or a shift on the left (a many-to-one scatter) runs as one
kernel computing its right side at every tuple and torch's `index_add` (`_scatter`): linear,
differentiable to every order, under torch.func's transforms too.
"""
from __future__ import annotations

import numpy as np
import torch

from ..ir import Access, Affine, Call, Gather, Wrapped
from . import torch as tf
from . import vjp as vjp_mod


def statement_gradients(spec, others: dict, needs, gout, out, tensors) -> dict | None:
    """{input: gradient} computed by calling the kernel's gradient statements as kernels on
    these tensors, so the gradients are themselves differentiable through `Apply` (double
    backward, and again).  Each `dX[...] += rhs` runs as `dX[...] := rhs` with the ranges of
    X's dimensions (a gather on the left scatters into a result padded to X's length); a
    left side through clamp/mod/pad (a many-to-one scatter) goes through `_scatter`;
    helpers (`:=`) run as they are.  None when no such form exists (a `(*)` reduction with
    a shifted left side): then the first-order gradients come from `Vjp`, whose derivative
    raises."""
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


def statement_tangent(spec, others: dict, which, tangents, tensors):
    """The output's tangent computed by calling the kernel's tangent statements as kernels on
    these tensors (helpers first, then one `dout[L] += ...` per read, each run as a `:=`
    kernel of the output's shape and summed), so the tangent is differentiable through
    `Apply` (reverse mode over forward mode, forward over forward).  None as in
    `statement_gradients`."""
    from ..factory import kernel as make
    from ..parse import parse
    from ..tangent import derive_tangents
    kernel = spec.kernel
    if kernel.equation.reducer == "*":
        return _product_tangent(spec, others, which, tangents, tensors)
    values = dict(zip(spec.tensors, tensors))
    sub = vjp_mod.subset_kernel(kernel, which)
    eq = sub.equation
    arrays = _np_values(eq, values)
    scalars = tuple(p for p in eq.params if p in values
                    and (values[p].is_floating_point() or values[p].is_complex()))
    complex_mode = any(t.is_complex() for t in (*tensors, *tangents))
    with torch.no_grad():               # the statements print the bounds of the last jvp
        dout = sub.jvp({n: arrays[n] for n in which}, **arrays, **others)
    lines = sub.tangent_equations
    t = derive_tangents(eq, sub.options.nograd, complex_mode, scalars)
    names = dict(t.names)
    scope = {**values, **others}
    for n, tan in zip(which, tangents):
        scope[names[n]] = tan.reshape(values[n].shape)
    opts = _options(kernel)
    dtype = tf.torch_result_dtype(kernel, {**values, **others}, np.asarray(dout).dtype)
    like = torch.empty(np.shape(dout), dtype=dtype)
    total = None
    for line in lines:
        e = parse(line)
        if eq.output in e.arrays and eq.output not in scope:
            scope[eq.output] = kernel(**values, **others)
        if any(a not in scope for a in (*e.arrays, *e.params)):
            continue                    # the term of an input whose tangent is zero
        args = {a: scope[a] for a in (*e.arrays, *e.params)}
        if e.output != t.output:        # a helper
            scope[e.output] = make(line, **opts)(**args)
            continue
        term = _assign(e, like, opts, args, make)
        if term is None:
            return None
        total = term if total is None else total + term
    return torch.zeros_like(like) if total is None else total.to(dtype).reshape(like.shape)


def _options(kernel) -> dict:
    return {n: getattr(kernel.options, n) for n in ("threads", "target", "fastmath", "blas", "fuse")}


def _product_gradients(spec, others: dict, needs, gout, tensors) -> dict | None:
    """The gradients of a `(*)` reduction from grad.exact_product's statements: the product
    of the other factors P (one more kernel call) and the gradient statements of
    `Y[L] := P[L,R] * RHS`, so that their own derivative is exact at zero factors too (the
    zero-count helpers of the vjp are exact in value but piecewise).  A finaliser is
    differentiated first as its own statement `out[L] := f(acc[L])`."""
    values = dict(zip(spec.tensors, tensors))
    eq, fin = _split_finaliser(spec.kernel)
    if fin is not None:
        fk, name = fin
        acc = _make(spec.kernel, eq)(**values, **others)
        gout = statement_gradients(tf.Spec.of(fk, {name: acc}), {}, (name,), gout,
                                   fk(**{name: acc}), [acc])[name]
    parts = _others_product(spec.kernel, eq, values, others)
    if parts is None:
        return None
    ys, arrays = parts
    made = statement_gradients(ys, ys.scalar_values(arrays), needs, gout, None,
                               [arrays[n] for n in ys.tensors])
    return None if made is None else {n: made[n] for n in needs}


def _product_tangent(spec, others: dict, which, tangents, tensors):
    """The tangent of a `(*)` reduction from grad.exact_product's statements (the tangent of
    `Y[L] := P[L,R] * RHS` with P's tangent left out), differentiable again at zeros."""
    values = dict(zip(spec.tensors, tensors))
    eq, fin = _split_finaliser(spec.kernel)
    parts = _others_product(spec.kernel, eq, values, others)
    if parts is None:
        return None
    ys, arrays = parts
    dacc = statement_tangent(ys, ys.scalar_values(arrays), which, tangents,
                             [arrays[n] for n in ys.tensors])
    if fin is None or dacc is None:
        return dacc
    fk, name = fin
    acc = _make(spec.kernel, eq)(**values, **others)
    return statement_tangent(tf.Spec.of(fk, {name: acc}), {}, (name,), [dacc], [acc])


def _make(kernel, text: str, **kw):
    from ..factory import kernel as make
    return make(text, **_options(kernel), **kw)


def _split_finaliser(kernel):
    """(the statement without its finaliser, None or (the Kernel of `out[L] := f(acc[L])`,
    the name acc))."""
    from dataclasses import replace
    eq = kernel.equation
    if not eq.finaliser:
        return eq, None
    taken = set(eq.arrays) | set(eq.params) | {eq.output}
    name = next(n for n in (eq.output + "_acc" + "_" * k for k in range(len(taken) + 1))
                if n not in taken)
    fin = _make(kernel, type(eq)(eq.lhs, ":=", Call(eq.finaliser,
                                                   (Access(name, eq.lhs.indices),))))
    return replace(eq, finaliser=None, text=""), (fin, name)


def _others_product(kernel, eq, values: dict, others: dict):
    """(Spec, arrays) of the call `Y[L] := P[L,R] * RHS` of grad.exact_product, with P
    computed (differentiably) from these tensors; None when the form does not apply."""
    from ..grad import exact_product
    forms = exact_product(eq)
    if forms is None:
        return None
    prod, total = forms
    rng = kernel.ranges(**_np_values(eq, values), **others)
    P = _make(kernel, prod, ranges={r: rng[r] for r in prod.lhs_indices})(
        **{n: v for n, v in {**values, **others}.items() if n in (*prod.arrays, *prod.params)})
    arrays = {**values, **others, prod.output: P}
    return tf.Spec.of(_make(kernel, total), arrays), arrays


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
    """`dX[...] += rhs` as a new tensor of X's shape."""
    slots = e.lhs.indices
    lhs = [s.terms[0][0] for s in slots if isinstance(s, Affine) and s.is_bare]
    if len(lhs) == len(slots) and len(set(lhs)) == len(lhs):
        rng = {i: range(x.shape[k]) for k, i in enumerate(lhs)}
        return make(_define(e), **opts, ranges=rng)(**args)
    if len(slots) == 1 and isinstance(slots[0], Gather) and not slots[0].offset.terms:
        r = make(_define(e), **opts)(**args)
        return torch.nn.functional.pad(r, (0, x.shape[0] - r.shape[0]))
    return _scatter(e, x, opts, args, make)


def _scatter(e, x, opts: dict, args: dict, make):
    """`dX[slots] += rhs` with clamp/mod/pad, gathered or shifted positions on the left (a
    many-to-one scatter, which has no `:=` form) as one kernel call and torch ops: the right
    side at every tuple of the statement's indices (`T[i-start, ...] := rhs`, differentiable
    through Apply), added into X's elements by `index_add` at the positions the left side
    computes (pad: positions outside X dropped).  Linear in T, so every derivative of it is
    the same kind of statement again, under torch.func's transforms too."""
    names = list(e.indices)
    tensors = {n: v for n, v in args.items() if isinstance(v, torch.Tensor)}
    np_args = {**args, **_np_values(e, tensors),
               e.output: np.zeros(x.shape, tf.np_compute_dtype(x.dtype))}
    rng = make(e, **opts).ranges(**np_args)
    lhs = tuple(Affine(((n, 1),), -rng[n].start) for n in names)
    taken = set(e.arrays) | set(e.params) | {e.output}
    name = next(n for n in (e.output + "_terms" + "_" * k for k in range(len(taken) + 1))
                if n not in taken)
    te = type(e)(Access(name, lhs), ":=", e.rhs)
    terms = make(te, **opts, ranges={n: rng[n] for n in names})(
        **{a: args[a] for a in (*te.arrays, *te.params) if a in args})
    grid = {n: torch.arange(rng[n].start, rng[n].stop).reshape(
        [-1 if k == m else 1 for m in range(len(names))]) for k, n in enumerate(names)}

    def affine(a):
        v = torch.tensor(a.const)
        for n, c in a.terms:
            v = v + c * grid[n]
        return v

    def position(s):
        if isinstance(s, Gather):
            return args[s.array][tuple(affine(a) for a in s.indices)].long() + affine(s.offset)
        return affine(s)
    lin, keep = torch.tensor(0), None
    for d, s in enumerate(e.lhs.indices):
        size = x.shape[d]
        p = position(s.inner if isinstance(s, Wrapped) else s)
        if isinstance(s, Wrapped) and s.kind == "clamp":
            p = p.clamp(0, size - 1)
        elif isinstance(s, Wrapped) and s.kind == "mod":
            p = p.remainder(size)
        elif isinstance(s, Wrapped):                        # pad: writes outside are dropped
            inside = (p >= 0) & (p < size)
            keep = inside if keep is None else keep & inside
            p = p.clamp(0, size - 1)
        lin = lin * size + p
    lin = lin.expand(terms.shape)
    if keep is not None:
        terms = torch.where(keep.expand(terms.shape), terms, torch.zeros((), dtype=terms.dtype))
    dtype = _result_dtype(x, args.values())
    out = torch.zeros(x.numel(), dtype=torch.promote_types(dtype, terms.dtype))
    return out.index_add(0, lin.reshape(-1), terms.reshape(-1)).reshape(x.shape)


def _result_dtype(x, values) -> torch.dtype:
    dt = x.dtype
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_complex():
            dt = torch.promote_types(dt, v.dtype)
    return dt


def _define(e):
    """`dX[...] += rhs` as the new array `dX[...] := rhs`."""
    return type(e)(e.lhs, ":=", e.rhs, e.reduction, e.finaliser)
