"""`Kernel`, `kernel()` and `tullio()`: the stages tied together, with an in-memory cache.

Statically per expression: parse (and later, gradients).  Per call signature (dtypes, ranks,
layouts, threading): rewrite, plan, render, compile -- once.  Per call: a call like an earlier
one is replayed (callpath.py); any other goes to the frontend its arrays' type picks
(frontends/registry.py: torch, dask, CUDA, numpy), which checks the arrays, infers the ranges,
allocates and calls the compiled function.  Inside `with Tape()` the Tape records the call
first (the torch frontend consults it itself).
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np

from . import blas as _blas
from . import blas_shift as _shift
from . import bind as binding
from . import callpath, chain_text, codegen, dtypes, factory, summation, jit, memo, ranges as ranges_mod, rewrite, schedule
from .signature import CallSignature, CompileKey, dims_by_stride
from .errors import ArgumentError, ParseError, SummationWarning
from .options import NAMES as OPTION_NAMES, TARGETS, Options  # noqa: F401
from .ir import Equation, as_parsed
from .parse import parse
from . import tape as _tape

_current = _tape.current        # the innermost Tape (read without a module attribute lookup)

OPTIONS = OPTION_NAMES
_KERNELS = memo.Memo("kernel.kernels", 1024)
_CHAINS = memo.Memo("kernel.chains", 256)      # kernel() of texts of several statements


@dataclass(frozen=True)
class Prepared:
    """Everything fixed for one call signature."""
    fn: object
    source: codegen.Source
    plan: schedule.Plan
    equation: Equation          # after rewrite and snapshot renaming
    solved: object              # rewrite.Solved or None
    snapshot: bool


class Kernel:
    """A compiled tullio_py statement.  Call it with arrays by keyword."""

    def __init__(self, expr: str | Equation, options: Options | None = None, /, **kw):
        """Kernel(expr, **options), or Kernel(expr, Options(...)): options validated first.
        `expr`: a statement's text, or an `Equation` (used as it is, never printed and parsed)."""
        if options is None:
            options = Options.from_kwargs(**kw)
        elif kw:
            raise ArgumentError("pass either an Options or option keywords, not both")
        self.options = options
        self.given = options.given
        if isinstance(expr, Equation):
            self.text, self.equation = expr.text or str(expr), as_parsed(expr, self.given)
        else:
            self.text = expr
            try:
                self.equation = parse(expr, tuple(self.given))
            except ParseError:
                if not self.given:
                    raise
                options.check(parse(expr))  # a ranges= name that is an array of the statement
                raise
        self._check_option_names(self.text, self.equation)
        options.check(self.equation)
        self.threads, self.target, self.pad = options.threads, options.target, options.pad
        self.fastmath, self.verbose = options.fastmath, options.verbose
        threads, target, verbose = options.threads, options.target, options.verbose
        self._prepared = memo.Memo("kernel.compiled", 64)   # compile key -> Prepared
        self._plans = memo.Memo("kernel.plans", 64)         # call signature -> plan
        self._lowered = None
        self.last_cell: list = [None]    # [what the last call ran]: a replay writes one item
        self._calls = callpath.CallCache(self.equation, threads, self._use_replay,
                                         _tape.current_fast)
        self._replay = self._calls.call     # the fast call path (its newest function)
        self.described: set = set()         # call signatures verbose=2 has described
        # Pure contractions go to BLAS through numpy when large (blas.py); blas=False: loops.
        self._blas = (_blas.contraction(self.equation)
                      if options.blas and target in ("auto", "cpu") and not self.given else None)
        # Other products of two reads at affine indices (shifts, strides, sub-ranges) run as
        # matmuls over strided views when the cost model says so (blas_shift.py).
        self._shift = (_shift.shifted(self.equation, options.pad)
                       if options.blas and target in ("auto", "cpu") else None)
        self.summation_message = summation.message(self.equation)
        self._warned_by_tullio = False
        if self.summation_message:
            warnings.warn(self.summation_message, SummationWarning, stacklevel=3)
        if verbose:
            print(f"tullio_py: {self.equation}")

    @staticmethod
    def _check_option_names(expr: str | Equation, eq: Equation | None = None):
        if isinstance(expr, Equation):
            expr, eq = expr.text or str(expr), expr
        eq = eq or parse(expr)
        for name in [eq.output, *eq.arrays, *eq.params]:
            if name in OPTIONS:
                raise ArgumentError(f"'{name}' is an option name and cannot name an array or "
                                    "parameter", expr, binding.find(expr, name),
                                    "rename the array")

    def ranges(self, /, **arrays) -> dict[str, range]:
        """The range of every index for these arrays (what the loops iterate)."""
        arrays = binding.collect(self.equation, arrays)
        ext = binding.gather_extrema(self.equation, arrays)
        return ranges_mod.infer(self.equation, binding.shapes_of(arrays), ext, self.given)

    # ------------------------------------------------------------------ calling
    def __call__(self, /, **arrays):
        if _current() is None:          # the fast path: numpy arrays and scalars only,
            out = self._replay(arrays)  # with the names, dtypes, shapes of an earlier call
            if out is not None:
                return out
        return self._call_full(arrays)

    def _call_full(self, arrays: dict):
        """A call that is not replayed: its arrays' frontend runs it (and may remember it)."""
        from .frontends import registry     # torch, dask, CUDA or numpy (registry.py)
        frontend = registry.pick(self, arrays)
        if not getattr(frontend, "TAPE", False):
            tape = _tape.current()          # inside `with Tape()`: record, then run untaped
            if tape is not None:
                return tape.run(self, arrays)
        if self.verbose >= 2 and frontend.__name__.endswith(".numpy"):
            from .explain import report_path        # the path of a new call signature
            report_path(self, arrays)
        return frontend.call(self, arrays)

    def _use_replay(self, fn, method=None):
        """The call path's newest functions (callpath.py): `fn` takes the arrays as a dict
        (tullio() calls it), `method` (or None) as keyword parameters.  The method becomes
        this Kernel's own `__call__`: Python looks special methods up on the class, so a
        Kernel that has one gets a subclass of its own (of its class, unless that overrides
        __call__ itself)."""
        self._replay = fn
        cls = self.__class__
        owned = cls.__dict__.get("_owner") == id(self)
        if method is None:
            if owned:
                cls.__call__ = cls.__bases__[0].__call__
            return
        if not owned:
            base = cls.__bases__[0] if "_owner" in cls.__dict__ else cls   # a copy's class
            if base.__call__ is not Kernel.__call__:
                return
            cls = self.__class__ = type(base.__name__, (base,), {
                "__slots__": (), "__module__": base.__module__, "__doc__": base.__doc__,
                "__qualname__": base.__qualname__, "_owner": id(self)})
        cls.__call__ = method

    # ------------------------------------------------------------------ for the frontends
    @property
    def last(self):
        """What the last call ran (a Prepared of this module or of frontends/cuda.py)."""
        return self.last_cell[0]

    @last.setter
    def last(self, prepared):
        self.last_cell[0] = prepared

    _last = last

    @property
    def compiled(self):
        """Compile key -> Prepared: the compiled functions of this statement (all targets)."""
        return self._prepared

    @property
    def call_cache(self) -> callpath.CallCache:
        """The fast call path: calls the frontends ran in full are remembered here."""
        return self._calls

    @property
    def blas_plan(self):
        """The BLAS contraction (blas.py) this statement may run as, or None."""
        return self._blas

    @property
    def shift_plan(self):
        """The strided-view matmuls (blas_shift.py) this statement may run as, or None."""
        return self._shift

    def prepare(self, arrays, rng, dtype, out_shape):
        """(Prepared, ranges of the rewritten statement, bound parameters): compiled once per
        call signature."""
        return self._prepare(arrays, rng, dtype, out_shape)

    def gradient_side(self):
        """The Gradient (gradient_kernel.py) of this statement, built on first use."""
        return self._gradient()

    def run_with_ranges(self, arrays: dict, rng: dict, out: np.ndarray, params: dict):
        """Run into `out` with the given index ranges (no range inference): gradients iterate
        exactly the forward's ranges.  Returns (prepared, ranges, bound parameters); None
        when it ran through BLAS instead (blas.py: a pure contraction whose ranges cover
        every array; blas_shift.py: shifted reads and sub-ranges as strided views)."""
        from .frontends import numpy as host
        return host.run_with_ranges(self, arrays, rng, out, params)

    def kernel_for(self, eq: Equation) -> "Kernel":
        """The Kernel, with this one's options, that runs statement `eq` derived from this
        one (relayout.py's statement reading relaid copies); built once per statement."""
        made = self.__dict__.setdefault("_derived", {})
        k = made.get(eq)
        if k is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SummationWarning)
                k = made[eq] = Kernel(eq, replace(self.options, verbose=0))
        return k

    def uses_blas(self, arrays: dict, rng: dict, out: np.ndarray) -> bool:
        """Whether run_with_ranges hands this call to BLAS (blas.py or blas_shift.py)."""
        from .frontends import numpy as host
        return host.uses_blas(self, arrays, rng, out)

    def loop_threads(self) -> int:
        """Threads the generated loops would run on (what BLAS over strided views must beat)."""
        return schedule.thread_count(self.threads, jit.max_threads()) or jit.max_threads()

    def _prepare(self, arrays, rng, dtype, out_shape):
        plan, key, low = self.plan_for(arrays, rng, dtype, out_shape)
        prepared = self._prepared.get(key)
        if prepared is None:
            source = codegen.render(plan)
            if self.verbose >= 2:
                print(source.text)
            fn = jit.load(source, key.target, signature=key.arguments)
            prepared = Prepared(fn, source, plan, low.equation, low.solved, low.snapshot)
            self._prepared[key] = prepared
        return prepared, low.ranges, low.bound_params

    def plan_for(self, arrays, rng, dtype, out_shape):
        """(plan, compile key, lowered statement) for one call signature; compiles nothing.
        Remembered per ranges and array signature: gradients run through here on every vjp,
        and planning costs about 0.3 ms per statement."""
        sig = CallSignature.of(arrays, rng, dtype, out_shape)
        hit = self._plans.get(sig)
        if hit is None:
            hit = self._plans[sig] = self._plan_for(arrays, rng, dtype, out_shape)
        return hit

    def _plan_for(self, arrays, rng, dtype, out_shape):
        eq = self.equation
        if self._lowered is None:       # the statement's rewrite, once per kernel
            lowered = rewrite.lower(eq)
            # (the text first: threads planning dask blocks at once read both)
            self._lowered_text = str(lowered.equation)
            self._lowered = lowered
        low, text = rewrite.lower(eq, rng, out_shape, static=self._lowered), self._lowered_text
        if low.solved is not None and rewrite.injective(eq, rng):
            low = rewrite.unsolved(eq, rng)         # writes each element once: as a scatter
            text = str(low.equation)
        work_eq, call_ranges = low.equation, low.ranges
        parallel = schedule.threading(work_eq, call_ranges, self.threads, jit.max_threads())
        target = "cpu" if self.target == "auto" else self.target
        # Memory layout of every array (loop order follows it), and sizes (which matter).
        layouts = {n: dims_by_stride(a) for n, a in arrays.items() if isinstance(a, np.ndarray)}
        sizes = {n: a.size for n, a in arrays.items() if isinstance(a, np.ndarray)}
        sizes[eq.output] = int(np.prod(out_shape))
        for n in list(layouts):
            if n == eq.output and eq.assign != ":=":
                layouts["_old_" + n], sizes["_old_" + n] = layouts[n], sizes[n]
        plan = schedule.plan(work_eq, call_ranges, dtype.name, threads=parallel,
                             pad_value=self.pad, fastmath=self.fastmath,
                             layouts=layouts, sizes=sizes, vector_bytes=jit.vector_bytes())
        plan = dtypes.with_dtypes(plan, arrays)
        # Every choice of the plan that changes the code (block depends on the sizes).
        key = CompileKey.of(text, dtype, target, parallel,
                            (plan.loops, plan.fixed, plan.form, plan.block, plan.jam,
                             plan.chunked, plan.partial,
                             plan.collapse, plan.lanes, plan.pack)
                            + (("wide",) if plan.wide and not plan.jam else ()), arrays)
        return plan, key, low

    # ------------------------------------------------------------------ reading the code
    @property
    def forward_code(self) -> str:
        """Generated source of the forward kernel (of the last call, else for float64 arrays)."""
        if self._last is None:
            return self.source()
        return jit.module_text(self._last.source, "cpu")

    def source(self, target: str = "cpu", grad: bool = False) -> str:
        if grad:
            return self._gradient().code(target)
        work_eq = rewrite.lower(self.equation).equation
        fake = {n: range(0, 1) for n in work_eq.indices}
        plan = schedule.plan(work_eq, fake, "float64", threads=False, pad_value=self.pad)
        if target == "cuda":
            from .codegen import cuda as codegen_cuda
            return jit.cuda_module_text(codegen_cuda.render(plan))
        src = codegen.render(plan)
        return jit.module_text(src, target if target in ("cpu", "python") else "cpu")

    def explain(self, /, **arrays):
        """What a call with these arrays runs (BLAS, BLAS over strided views, or loops: order,
        threads), its FLOPs and bytes, the measured time, and the fraction of the machine's
        limit (explain.py)."""
        from .explain import explain
        return explain(self, arrays)

    # ------------------------------------------------------------------ gradients (gradient_kernel.py)
    def _gradient(self):
        g = self.__dict__.get("_grad")
        if g is None:
            from .gradient_kernel import Gradient
            g = self.__dict__["_grad"] = Gradient(self)
        return g

    def vjp(self, cotangent, /, **arrays) -> dict:
        """{input: gradient of sum(out * cotangent)}; pass the output too to skip recomputing it."""
        from .frontends import registry     # dask, CUDA or numpy (registry.py)
        return registry.pick(self, {**arrays, "": cotangent}, "vjp").vjp(self, cotangent, arrays)

    @property
    def gradient_equations(self) -> dict:
        """{input: [tullio_py statements]} reproducing vjp (bounds of the last vjp call)."""
        return self._gradient().equations()

    @property
    def gradient_code(self) -> str:
        return self._gradient().code("cpu")

    def gradient_kernels(self) -> dict:
        """{input: [Kernel]} of gradient_equations, to differentiate again (HVPs)."""
        from .tangent_kernel import gradient_kernels
        return gradient_kernels(self)

    # ------------------------------------------------------------------ forward mode (tangent_kernel.py)
    def _tangent(self):
        t = self.__dict__.get("_tan")
        if t is None:
            from .tangent_kernel import Tangent
            t = self.__dict__["_tan"] = Tangent(self._gradient())
        return t

    def jvp(self, tangents: dict, /, **arrays):
        """The output's tangent for {input: tangent} (a missing input has zero tangent)."""
        return self._tangent().jvp(tangents, arrays)

    @property
    def tangent_equations(self) -> list:
        """[tullio_py statements] reproducing jvp into a zeroed d<out> (bounds of the last call)."""
        return self._tangent().equations()

    def __repr__(self):
        return f"kernel({self.text!r})"


# ----------------------------------------------------------------------------- public verbs
def kernel(expr: str | Equation, /, **options) -> Kernel:
    """A Kernel for `expr` (text, or an Equation another stage derived), cached per expression
    and (validated) options; a text of several statements gives a Chain (chain.py)."""
    if isinstance(expr, str):
        expr_key = expr
    elif isinstance(expr, Equation):    # frozen and hashable; never equal to a text key
        expr_key = expr
    else:
        parse(expr)                                 # the ParseError for a non-string
    if options:
        try:
            opts = Options.from_kwargs(**options)
        except ArgumentError:
            arrays = [n for n, v in options.items() if isinstance(v, np.ndarray)]
            if not arrays or chain_text.is_chain(expr):
                raise
            Kernel._check_option_names(expr)       # the statement names an array like an option
            raise ArgumentError(f"option {', '.join(arrays)} got an array: option names are "
                                f"reserved and cannot name arrays ({', '.join(OPTIONS)})",
                                expr if isinstance(expr, str) else str(expr)) from None
        # threads=1 (one thread) and threads=True (all) are equal as numbers: keyed apart
        key = (expr_key, None if opts == _DEFAULT else opts, type(opts.threads))
    else:
        opts, key = _DEFAULT, (expr_key, None, bool)
    if chain_text.is_chain(expr):           # several statements (chain.py)
        k = _CHAINS.get(key)
        if k is None:
            from .chain import Chain
            k = _CHAINS[key] = Chain(expr, opts)
        return k
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = Kernel(expr, opts)
    return k


_DEFAULT = Options()
factory.register(kernel)


def tullio(expr: str, /, **arrays_and_options):
    """Evaluate `expr`.  Arrays by keyword, or read from the caller's scope when not passed."""
    if expr.__class__ is str:       # this text called before with exactly its arrays by name
        hit = _BY_TEXT.get(expr)
        if hit is not None:
            k = hit[0]
            if _current() is None:      # a replay checks the names itself
                out = k._replay(arrays_and_options)
                if out is not None:
                    return out
            if arrays_and_options.keys() == hit[1]:
                return k(**arrays_and_options)
    options = {k: v for k, v in arrays_and_options.items() if k in OPTIONS}
    arrays = {k: v for k, v in arrays_and_options.items() if k not in OPTIONS}
    k = kernel(expr, **options)
    if not isinstance(k, Kernel):       # a Chain: its inputs, from the caller's scope too
        missing = [n for n in k.inputs if n not in arrays]
        if missing:
            frame = sys._getframe(1)
            scope = {**frame.f_globals, **frame.f_locals}
            arrays.update((n, scope[n]) for n in missing if n in scope)
        return k(**arrays)
    if k.summation_message and k._warned_by_tullio:   # the first warning came from Kernel()
        warnings.warn(k.summation_message, SummationWarning, stacklevel=2)
    k._warned_by_tullio = True
    eq = k.equation
    wanted = k.__dict__.get("_wanted")     # computed once: eq.arrays walks the expression
    if wanted is None:
        wanted = k._wanted = list(eq.arrays) + list(eq.params) + (
            [eq.output] if eq.assign != ":=" else [])
    if any(n not in arrays for n in wanted):
        frame = sys._getframe(1)
        scope = {**frame.f_globals, **frame.f_locals}
        for n in wanted:
            if n not in arrays and n in scope:
                arrays[n] = scope[n]
    elif (expr.__class__ is str and not options and not k.summation_message
          and len(arrays) == len(wanted)):
        # every array passed by name, no options, nothing to warn about: the next call with
        # this text and these names skips the option split, kernel() and the scope
        _BY_TEXT[expr] = (k, frozenset(wanted))
    return k(**arrays)


# text -> (its default-options Kernel, the names it reads): tullio()'s repeated calls
_BY_TEXT = memo.Memo("kernel.tullio_texts", 1024)
