"""Running and printing gradients: `Kernel.vjp`, `gradient_equations`, `gradient_code`.

The gradient equations from grad.py are compiled like any statement: one Kernel each, whose
shifted left-hand side rewrite.py turns into a gather.  They are run with the FORWARD's index
ranges (not ranges inferred from their own arrays): a forward with `ranges=`, or `=` into a
larger array, iterates less than its arrays allow, and its gradient must iterate exactly as
much.  The rewrite's mask bounds then come from the forward's ranges too.

The printed equations are the same rewritten statements with the mask bounds written as the
numbers of the last call -- and dropped where the statement implies them by itself (usually:
the mask `0 <= p-i < n` is implied by reading `dout[pad(p-i)]`).  An index whose own inferred
range would be wider than the forward's gets an explicit mask.  So running the printed
equations with `tullio()` iterates exactly the tuples vjp iterates, in the same loop order.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from . import bind as binding
from . import grad as grad_mod, grad_print, jit, memo, memory, relayout, rewrite, schedule, vjp_plan, vjp_rows, vjp_run
from .errors import GradientError, SummationWarning
from .signature import ArraySig, CallSignature
from .ir import Access, Affine, Compare, Const, Equation, Param, Wrapped


@dataclass(frozen=True)
class _CallState:
    """What a vjp call checks and derives, fixed by the shapes, dtypes and strides of its
    arrays (how its statements run is its VjpPlan, vjp_plan.py)."""
    d: object                   # grad.Derivation
    rng: dict                   # the forward's index ranges
    params: dict                # helper parameters (lengths of ranges, ...)
    shapes: dict                # every array of the gradient statements -> shape (printing)
    reads_output: bool          # some statement reads the forward's output
    helpers: list               # (statement, Kernel)
    grads: list                 # (input, gradient dtype, [(statement, Kernel, ranges)])
    gathers: bool               # index arrays: checked again on every call
    complex_mode: bool = False  # some array read, or the cotangent, is complex


def learnable_scalars(eq: Equation, arrays: dict) -> dict:
    """Parameters passed as 0-d float or complex arrays (a learnable scale): they get a
    gradient and a tangent, where a Python scalar stays a constant."""
    return {n: arrays[n] for n in eq.params if isinstance(arrays.get(n), np.ndarray)
            and arrays[n].ndim == 0 and arrays[n].dtype.kind in "fc"}


def old_output(eq: Equation, arrays: dict, what: str, verb: str):
    """Pop the forward's output from `arrays`: its value before an in-place statement (None
    when not passed).  The derivatives of '*=' need it (it is the factor's partner)."""
    out_value = arrays.pop(eq.output, None)
    if eq.assign == "*=" and out_value is None:
        raise GradientError(f"the {what} of '*=' needs the value of {eq.output} before the "
                            "statement", eq.text, eq.lhs.span, f"pass {eq.output}=... to {verb}")
    return out_value


class Gradient:
    """The gradient side of one forward Kernel."""

    def __init__(self, forward):
        self.fwd = forward
        self._kernels = memo.Memo("gradient.kernels", 256)   # Equation -> Kernel
        self._fused = memo.Memo("gradient.fused", 64)       # compile key -> fused function
        # call signature -> (_CallState, (VjpPlan, its kernels, its ranges as dicts) or None)
        self._states = memo.Memo("gradient.states", 32)
        self._plans = memo.Memo("gradient.plans", 32)       # the same, of calls with gathers
        self._last = None      # (derivation, rng, shapes, params, {eq text: (prepared, ...)})
        self._last_plan = None

    @property
    def last(self):
        """(derivation, ranges, shapes, params, record) of the last vjp call, or None."""
        return self._last

    @property
    def last_plan(self):
        """The VjpPlan (vjp_plan.py) the last vjp call ran, or None."""
        return self._last_plan

    # ------------------------------------------------------------------ derivation
    def derivation(self, complex_mode: bool = False, real_inputs=(), scalars=()) -> grad_mod.Derivation:
        """The gradient statements; `real_inputs` (complex mode): inputs holding real values,
        whose gradients are the real parts; `scalars`: parameters passed as 0-d arrays, which
        get a gradient too."""
        k = self.fwd
        eq = k.equation
        if not k.options.grad:
            raise GradientError("gradients are switched off for this kernel (grad=False)",
                                eq.text, None, "create the kernel without grad=False")
        d = grad_mod.derive(eq, k.options.nograd, complex_mode,
                            tuple(real_inputs) if complex_mode else (), tuple(scalars))
        if d.error:
            raise GradientError(d.error, eq.text, None)
        return d

    def kernel_for(self, eq: Equation):
        """The Kernel running gradient statement `eq` (compiled once per statement), built
        from the Equation itself: an index the derivative no longer reads in any bracket
        (`dw[k] += dm[i] * where(j*len_k + k == m_arg[i], 1, 0)`) stays the loop index it is
        in `eq` (an IndexValue), iterated over the forward's range like every other index."""
        k = self._kernels.get(eq)
        if k is None:
            f = self.fwd
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SummationWarning)
                k = type(f)(eq, threads=f.threads, target=f.target, pad=0,
                            fastmath=f.fastmath, blas=f.options.blas)
            self._kernels[eq] = k
        return k

    # ------------------------------------------------------------------ vjp
    def vjp(self, cotangent, /, **arrays) -> dict:
        return self.vjp_views(cotangent, arrays, False)

    def vjp_views(self, cotangent, arrays: dict, views: bool) -> dict:
        """vjp; `views`: a gradient constant along some dimensions may be returned as a
        zero-stride view (vjp_plan.spread_dims; the torch frontend passes it on as an expanded
        tensor), else every gradient is an array of its own."""
        k, eq = self.fwd, self.fwd.equation
        cot = np.asarray(cotangent)
        out_value = old_output(eq, arrays, "gradient", "vjp")
        scalars = learnable_scalars(eq, arrays)
        call = dict(arrays)
        if eq.assign != ":=":
            call[eq.output] = out_value if out_value is not None else memory.zeros(cot.shape, cot.dtype)
        collected = binding.collect(eq, call)
        # Everything that depends only on shapes, dtypes and strides is worked out once per
        # call signature (ranges, derivation, kernels, the plan of the steps); gathers read
        # index values, so their checks run on every call (and ranges may change: the plan is
        # remembered per ranges too).  The plan's BLAS and fusion choices also depend on the
        # layout of the cotangent and of a given ':=' output.
        sig = CallSignature.of(collected, None, cot.dtype, cot.shape, (
            tuple((n, a.dtype.str) for n, a in scalars.items()), cot.strides,
            ArraySig.of(eq.output, out_value) if eq.assign == ":=" and out_value is not None
            else None))
        st, hit = self._states.get(sig) or (None, None)
        if st is None or st.gathers:
            st, hit = self.call_state(collected, cot, scalars), None
            self._states[sig] = (st, None)
        d, rng, params = st.d, st.rng, st.params
        ns = {n: v for n, v in collected.items() if n != eq.output or eq.output in eq.arrays}
        ns[d.cotangent] = cot[()] if cot.ndim == 0 else cot     # a scalar output's cotangent is a scalar
        if st.reads_output and eq.output not in ns:
            ns[eq.output] = (out_value if out_value is not None else
                             k(**{n: v for n, v in call.items() if n != eq.output or eq.assign != ":="}))
        if st.gathers:      # (ranges may depend on the index values)
            hit = self._plans.get(sig.with_ranges(rng))
        if hit is None:
            inputs = {name: scalars.get(name, collected.get(name)) for name, _ in d.grads}
            p = vjp_plan.plan(d, rng, params, ns, cot.shape, cot.dtype, inputs,
                              st.complex_mode, self.kernel_for, k.options.fuse)
            if k.options.fuse:
                p = vjp_rows.group(p, self.kernel_for, ns, params)
            hit = (p, tuple(self.kernel_for(s.equation) for s in p.statements),
                   tuple(vjp_plan.as_ranges(s.ranges) for s in p.statements),
                   vjp_run.step_sources(p, params))
            if st.gathers:
                self._plans[sig.with_ranges(rng)] = hit
            else:
                self._states[sig] = (st, hit)
        p, kernels, ranges, sources = hit
        self._last_plan = p
        record = {}
        result = vjp_run.run(p, vjp_run.Host(kernels, ranges, params, record, self.fused_function,
                                             k.threads, sources=sources), ns)
        for name in result:
            x, dx = scalars.get(name, collected[name]), result[name]
            if x.dtype.kind != "c" and dx.dtype.kind == "c":
                dx = dx.real
            result[name] = dx.astype(x.dtype, copy=False)
        if not views:
            for a in p.arrays:
                if a.spread and a.input in result:
                    result[a.input] = np.ascontiguousarray(result[a.input])
        self._last = (d, rng, st.shapes, params, record)
        return result

    def call_state(self, collected: dict, cot: np.ndarray, scalars: dict | None = None) -> "_CallState":
        """What a vjp call with these shapes, dtypes and strides runs (checks included);
        `scalars`: the parameters passed as 0-d arrays, which get a gradient too."""
        scalars = scalars or {}
        k, eq = self.fwd, self.fwd.equation
        b = binding.bind(eq, k.options, collected)
        shapes, rng, ext, want = b.shapes, b.ranges, b.read, b.shape
        if cot.shape != tuple(want):
            raise GradientError(f"the cotangent has shape {cot.shape}, but the output "
                                f"{eq.output} has shape {tuple(want)}", eq.text, eq.lhs.span)
        values = [collected[n] for n in eq.arrays] + [np.asarray(collected[p]) for p in eq.params]
        complex_mode = any(np.asarray(v).dtype.kind == "c" for v in values + [cot])
        real = self.real_inputs(eq, collected) + tuple(
            n for n, a in scalars.items() if a.dtype.kind != "c")
        d = self.derivation(complex_mode, real, tuple(scalars))
        inputs = {name: scalars.get(name, collected.get(name)) for name, _ in d.grads}
        grads = [(name, dtype, [(g, self.kernel_for(g), grng) for g, grng in eqs])
                 for name, _, _, dtype, eqs in vjp_plan.gradient_arrays(
                     d, rng, inputs, cot.dtype, complex_mode)]
        shapes.update({n: () for n in scalars})
        all_shapes = {**shapes, eq.output: cot.shape, d.cotangent: cot.shape,
                      **{h.output: cot.shape for h in d.helpers},
                      **{dn: shapes[n] for n, dn in d.gradient_names}}
        return _CallState(d, rng, self.params_for(d, rng), all_shapes,
                          self.reads(d, eq.output), [(h, self.kernel_for(h)) for h in d.helpers],
                          grads, bool(eq.gathers()), complex_mode)

    def fused_function(self, f):
        """The compiled function of a fused loop nest or of a row group (vjp_plan.Nest or
        vjp_plan.Rows; compiled once per compile key)."""
        fn = self._fused.get((type(f), f.key))
        if fn is None:
            fn = self._fused[type(f), f.key] = jit.load(f.source, "cpu", signature="; ".join(
                k.arguments for k in f.key))
        return fn

    @staticmethod
    def real_inputs(eq: Equation, arrays: dict) -> tuple[str, ...]:
        """The arrays read that hold real values (host or device arrays)."""
        return tuple(n for n in eq.arrays if n in arrays and hasattr(arrays[n], "dtype")
                     and np.dtype(arrays[n].dtype).kind != "c")

    # the rules a plan follows (vjp_plan.py), for the frontends that take the statements apart
    gradient_dtype = staticmethod(vjp_plan.gradient_dtype)
    helper_dtype = staticmethod(vjp_plan.helper_dtype)
    reads = staticmethod(vjp_plan.reads)
    params_for = staticmethod(vjp_plan.params_for)
    clip_bare = staticmethod(vjp_plan.clip_bare)

    # ------------------------------------------------------------------ printing
    def equations(self) -> dict[str, list[str]]:
        """{input: [statements]}: helper statements first, then the accumulations into d<x>."""
        if self._last is None:
            d, rng, shapes, params = self.derivation(False), None, None, {}
        else:
            d, rng, shapes, params, _ = self._last
        helpers = [self.printable(h, rng, shapes, params) for h in d.helpers]
        out = {}
        for name, eqs in d.grads:
            used = [h for h, e in zip(helpers, d.helpers)
                    if any(grad_mod.uses_array(g, e.output) for g in eqs)]
            out[name] = used + [self.printable(g, rng, shapes, params) for g in eqs]
        return out

    def printable(self, g: Equation, rng, shapes, params) -> str:
        solved = rewrite.solve(g)
        e = solved.equation if solved else g
        if rng is None:       # no call yet: bounds stay named parameters, unless implied
            if solved:
                e = self._drop_structural(e, solved)
            return str(grad_print.subst_params(e, {p: Param(p.lstrip("_")) for p in
                                         (solved.bound_params if solved else {})}))
        grng = self.clip_bare(g, rng, shapes[g.output])
        values = dict(params)
        call_ranges = grng
        if solved:
            call_ranges, bounds = rewrite.solved_ranges(solved, grng, shapes[g.output])
            values.update(bounds)
        e = grad_print.subst_params(e, {n: Const(v) for n, v in values.items()})
        e = grad_print.drop_redundant(e, shapes, call_ranges)
        e = grad_print.add_range_masks(e, shapes, call_ranges)
        return str(e)

    def _drop_structural(self, e: Equation, solved) -> Equation:
        """Without shapes: the mask on an eliminated index v that a ':=' forward has bare at
        left position d (so v runs over exactly the cotangent's extent d) is implied by a
        guarding read `dout[..., pad(value of v), ...]`."""
        fwd = self.fwd
        if fwd.equation.assign != ":=":
            return e
        cot = "d" + fwd.equation.output
        guarding = schedule.find_guards(e, 0)[1]    # the reads the loops are clipped by
        guarded = set()
        for f in schedule.top_factors(e.rhs):
            if isinstance(f, Access) and f.array == cot and str(f) in guarding:
                for d, s in enumerate(f.indices):
                    if isinstance(s, Wrapped):
                        lhs = fwd.equation.lhs.indices[d]
                        if isinstance(lhs, Affine) and lhs.is_bare and lhs.names[0] not in fwd.given:
                            guarded.add((lhs.names[0], s.inner))
        keep = []
        for f in schedule.top_factors(e.rhs):
            if isinstance(f, Compare) and len(f.operands) == 3 and isinstance(f.operands[0], Param):
                v = f.operands[0].name[len("_lo_"):]
                m = grad_print.mask_bounds(Compare(("<=", "<"), (Const(0), f.operands[1], Const(1))))
                if m is not None and (v, m[0]) in guarded:
                    continue
            keep.append(f)
        return replace(e, rhs=grad_print.rebuild(keep))

    def code(self, target: str = "cpu") -> str:
        """Generated source of every gradient kernel (of the last vjp call, when there was one)."""
        d = self._last[0] if self._last else self.derivation(False)
        record = self._last[4] if self._last else {}
        relaid = {s.text: s.relayout for s in (self._last_plan.statements
                                                if self._last_plan else ())}
        spread = {s.text: a.spread[1] for s in (self._last_plan.statements if self._last_plan
                                                 else ()) for a in self._last_plan.arrays
                  if a.name == s.output and a.spread}
        parts, shown = [], None
        for title, eqs in [("helper", d.helpers)] + [(f"gradient of {n}", e) for n, e in d.grads]:
            for g in eqs:
                rec = record.get(str(g))
                if rec is not None and rec[0] in ("fused", "rows") and target == "cpu":
                    if rec[1] is not shown:     # once for the statements it runs together
                        parts.append(f"# ---- gradients run as one loop nest ({rec[0]})\n"
                                     f"{jit.module_text(rec[1], 'cpu')}")
                    shown = rec[1]
                    continue
                if rec is not None and target == "cpu":
                    text = jit.module_text(rec[0].source, "cpu")
                    if str(g) in spread:
                        text = (f"# constant along dimensions {spread[str(g)]} of the gradient: "
                                "run without them, spread along them with stride 0 "
                                "(vjp_plan.spread_dims)\n" + text)
                    moved = relaid.get(str(g), ()) or next(
                        (getattr(d, "relaid_reads", ()) for d in self.kernel_for(g).__dict__.get(
                            "_derived", {}).values() if d.last is rec[0]), ())
                    if moved:       # (the plan's, or the statement's own call: relayout.py)
                        text = "".join(f"# reads {relayout.Copy.of(a).describe(n)} "
                                       "(relayout.py)\n" for n, a in moved) + text
                else:
                    text = self.kernel_for(g).source(target=target)
                    if str(g) in record and target == "cpu":    # ran through BLAS (rec None)
                        text = ("# a pure contraction over whole arrays: the last vjp ran it "
                                "through BLAS (numpy);\n# these loops run it with blas=False\n"
                                + text)
                parts.append(f"# ---- {title}: {g}\n{text}")
        return "\n".join(parts)
