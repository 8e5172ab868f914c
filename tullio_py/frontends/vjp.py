"""What a frontend's backward needs from a Kernel: which arrays the gradients of a subset of
inputs read (so a forward keeps only those alive), and the vjp for exactly that subset.

The subset is expressed with the kernel's own `nograd=` option: the kernel for the same
expression with every other input in `nograd` derives (and compiles) only the gradients asked
for.  Kernels are cached per expression and options, so each subset is derived once.
"""
from __future__ import annotations

from .. import memo
from ..errors import GradientError


def subset_kernel(kernel, needs):
    """The kernel for the same expression whose vjp returns only the gradients in `needs`."""
    from ..factory import kernel as make
    eq = kernel.equation
    read = {a.array for a in eq.accesses()}
    others = tuple(sorted((read - set(needs)) | set(kernel.options.nograd)))
    if others == tuple(sorted(kernel.options.nograd)):
        return kernel
    options = {k: v for k, v in kernel.options.as_kwargs().items() if k != "nograd"}
    return make(kernel.equation, **options, nograd=others)    # (not parsed again)


_READS = memo.Memo("vjp.reads", 256)


def reads(kernel, needs, complex_mode: bool = False) -> tuple[set[str], bool]:
    """(arrays and parameters the gradients of `needs` read, whether they read the output).
    Asked on every differentiable forward call: remembered per kernel and arguments."""
    if not needs:
        return set(), False
    key = (id(kernel), frozenset(needs), complex_mode)
    hit = _READS.get(key)
    if hit is None or hit[0] is not kernel:      # (the kernel is kept: its id stays its own)
        hit = _READS[key] = (kernel, _reads(kernel, needs, complex_mode))
    keep, out = hit[1]
    return set(keep), out


def _reads(kernel, needs, complex_mode: bool) -> tuple[set[str], bool]:
    eq = kernel.equation
    try:
        from .. import grad
    except ImportError:                 # no gradients available: keep everything
        return set(eq.arrays) | set(eq.params), True
    nograd = tuple(sorted({a.array for a in eq.accesses()} - set(needs)))
    d = grad.derive(eq, nograd, complex_mode,
                    scalars=tuple(p for p in eq.params if p in needs))
    if d.error:
        return set(eq.arrays) | set(eq.params), True
    made = {h.output for h in d.helpers} | {d.cotangent} | {g for _, g in d.gradient_names}
    names: set[str] = set()
    for e in list(d.helpers) + [e for _, eqs in d.grads for e in eqs]:
        names |= set(e.arrays) | set(e.params)
        names |= {g.array for g in e.gathers()}
    keep = (names - made) & (set(eq.arrays) | set(eq.params) | {eq.output})
    return keep - {eq.output}, eq.output in keep


def vjp(kernel, cotangent, arrays: dict, needs, out=None, views: bool = False) -> dict:
    """{name: gradient} for the names in `needs` (numpy arrays in and out; `views`: a
    gradient constant along some dimensions may be a zero-stride view, Gradient.vjp_views)."""
    if not needs:
        return {}
    if not hasattr(kernel, "vjp"):
        raise GradientError("gradients are not available in this build of tullio_py",
                            kernel.text)
    sub = subset_kernel(kernel, needs)
    if out is not None:
        arrays = {**arrays, kernel.equation.output: out}
    grads = (sub.gradient_side().vjp_views(cotangent, arrays, True) if views
             else sub.vjp(cotangent, **arrays))
    return {n: g for n, g in grads.items() if n in needs}
