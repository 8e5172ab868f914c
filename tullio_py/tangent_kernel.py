"""Running and printing forward-mode derivatives (`Kernel.jvp`, `tangent_equations`), and the
gradient statements as Kernels (`Kernel.gradient_kernels`), so derivatives can be taken again.

The tangent statements from tangent.py are compiled and run like gradient statements (one
Kernel each, with the FORWARD's index ranges), and printed the same way: with the bounds of the
last call, runnable with `tullio()` into a zeroed `d<out>`, reproducing `jvp` bit for bit.
"""
from __future__ import annotations

import warnings

import numpy as np

from . import bind as binding, tangent as tangent_mod
from .errors import ArgumentError, GradientError, SummationWarning
from .gradient_kernel import learnable_scalars, old_output
from .vjp_plan import pick
from .vjp_run import run_on


class Tangent:
    """The forward-mode side of one forward Kernel (sharing its Gradient's compiled kernels)."""

    def __init__(self, gradient):
        self.grad = gradient
        self.fwd = gradient.fwd
        self._last = None           # (tangents, ranges, shapes, params) of the last call

    def derivation(self, complex_mode: bool = False, scalars=()) -> tangent_mod.Tangents:
        k, eq = self.fwd, self.fwd.equation
        if not k.options.grad:
            raise GradientError("derivatives are switched off for this kernel (grad=False)",
                                eq.text, None, "create the kernel without grad=False")
        t = tangent_mod.derive_tangents(eq, k.options.nograd, complex_mode,
                                        tuple(scalars))
        if t.error:
            raise GradientError(t.error, eq.text, None)
        return t

    def jvp(self, tangents: dict, arrays: dict):
        k, eq = self.fwd, self.fwd.equation
        tangents = dict(tangents)
        unknown = [n for n in tangents if n not in eq.arrays and n not in eq.params]
        if unknown:
            raise ArgumentError(f"tangents for {', '.join(unknown)}, which the expression does "
                                "not read", eq.text, None, f"inputs are {', '.join(eq.arrays)}")
        out_value = old_output(eq, arrays, "tangent", "jvp")
        scalars = learnable_scalars(eq, arrays)
        call = dict(arrays)
        if eq.assign != ":=":
            call[eq.output] = out_value
        b = binding.bind(eq, k.options, call)
        collected, shapes, rng, out_shape, dtype = b.arrays, b.shapes, b.ranges, b.shape, b.dtype
        values = [collected[n] for n in eq.arrays] + [np.asarray(collected[p]) for p in eq.params]
        complex_mode = any(np.asarray(v).dtype.kind == "c" for v in values)
        t = self.derivation(complex_mode, tuple(scalars))
        names = dict(t.names)
        ns = {n: v for n, v in collected.items() if n != eq.output or eq.output in eq.arrays}
        statements = list(t.helpers) + [e for _, eqs in t.terms for e in eqs]
        if eq.output not in ns and any(_reads(e, eq.output) for e in statements):
            if eq.assign == "*=":           # the old value (its factor in the tangent)
                ns[eq.output] = out_value
            elif eq.assign == ":=":
                ns[eq.output] = out_value if out_value is not None else k(**arrays)
            else:                           # '=' with a finaliser: the value it writes
                ns[eq.output] = k(**{**call, eq.output: np.array(out_value, copy=True)})
        params = self.grad.params_for(t, rng)
        dout = np.zeros(out_shape, dtype)
        for h in t.helpers:
            ns[h.output] = np.zeros(out_shape, self.grad.helper_dtype(h, {**ns, **params}))
            run_on(self.grad.kernel_for(h), pick(h, ns, params), rng, ns[h.output], params)
        for name, eqs in t.terms:
            if name not in tangents:
                continue
            x = scalars.get(name, collected[name])
            tx = np.asarray(tangents[name])
            if tx.shape != np.shape(x) or np.asarray(x).dtype.kind not in "fc":
                raise ArgumentError(f"the tangent of {name} must be a float array of shape "
                                    f"{np.shape(x)} (of a float input), got shape {tx.shape}",
                                    eq.text, None)
            ns[names[name]] = tx[()] if name in scalars else tx
            for e in eqs:
                run_on(self.grad.kernel_for(e), pick(e, ns, params), rng, dout, params)
        shapes.update({n: () for n in scalars})
        all_shapes = {**shapes, eq.output: out_shape, t.output: out_shape,
                      **{h.output: out_shape for h in t.helpers},
                      **{tn: shapes[n] for n, tn in t.names}}
        self._last = (t, rng, all_shapes, params)
        return dout

    def equations(self) -> list[str]:
        """Helper statements, then one `+=` per read of each input, into a zeroed `d<out>`."""
        if self._last is None:
            t, rng, shapes, params = self.derivation(False), None, None, {}
        else:
            t, rng, shapes, params = self._last
        return [self.grad.printable(e, rng, shapes, params)
                for e in list(t.helpers) + [e for _, eqs in t.terms for e in eqs]]


def _reads(e, name: str) -> bool:
    from .grad import uses_array
    return uses_array(e, name)


def gradient_kernels(kernel) -> dict:
    """{input: [Kernel]}: the printed gradient statements (bounds of the last vjp) as Kernels
    with the forward's options, in order; their vjp/jvp differentiate the gradient again."""
    from .factory import kernel as make
    opts = {n: getattr(kernel.options, n) for n in ("threads", "target", "fastmath", "blas", "fuse")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SummationWarning)
        return {name: [make(line, **opts) for line in lines]
                for name, lines in kernel.gradient_equations.items()}
