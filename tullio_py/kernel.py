"""`Kernel`, `kernel()` and `tullio()`: the stages tied together, with an in-memory cache.

Statically per expression: parse (and later, gradients).  Per call signature (dtypes, ranks,
layouts, threading): rewrite, plan, render, compile -- once.  Per call: check the arrays, infer
the ranges (a few integer operations), allocate, call the compiled function positionally.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

import numpy as np

from . import blas as _blas
from . import blas_shift as _shift
from . import callpath, codegen, dtypes, jit, memo, overlap, ranges as ranges_mod, rewrite, schedule
from .frontends import cuda as _cuda  # cheap: numba is imported on a CUDA call only
from .errors import ArgumentError, ParseError, RangeError, SummationWarning
from .options import NAMES as OPTION_NAMES, TARGETS, Options  # noqa: F401
from .ir import (FLOAT_FUNCS, Access, Affine, Binary, Call, Const, Equation, Gather, IndexValue,
                 Param, Unary, walk)
from .parse import parse
from . import tape as _tape

OPTIONS = OPTION_NAMES
_KERNELS = memo.Memo("kernel.kernels", 1024)


# ----------------------------------------------------------------------------- helpers
@memo.lru(maxsize=1024)
def _dtype_inputs(eq: Equation) -> tuple[tuple[str, ...], tuple, bool, tuple]:
    """What the result type depends on, from the statement alone: the arrays read (not index
    arrays), the constants, whether a division or float function makes integers float, and
    what can make the result complex (below)."""
    read = tuple(dict.fromkeys(a.array for a in eq.accesses()))
    consts = tuple(n.value for n in walk(eq.rhs) if isinstance(n, Const))
    floaty = eq.finaliser in FLOAT_FUNCS or any(
        (isinstance(n, Binary) and n.op == "/") or (isinstance(n, Call) and n.func in FLOAT_FUNCS)
        for n in walk(eq.rhs))
    return read, consts, floaty, _complex_sources(eq.rhs)


_REAL_VALUED = ("abs", "real", "imag")     # real results of complex arguments, as in numpy


def _complex_sources(e) -> tuple:
    """(array names, parameter names, constants) whose values reach the right side's value
    other than through abs/real/imag or a comparison: only these can make the result
    complex (`abs(z[i])` of a complex z is real)."""
    arrays, params, consts = {}, {}, []

    def visit(n):
        if isinstance(n, Access):
            arrays[n.array] = None
        elif isinstance(n, Param):
            params[n.name] = None
        elif isinstance(n, Const):
            consts.append(n.value)
        elif isinstance(n, Call) and n.func in _REAL_VALUED:
            return
        elif isinstance(n, Call) and n.func == "where":
            visit(n.args[1])
            visit(n.args[2])
        elif isinstance(n, (Binary, Unary, Call)):
            for c in ((n.left, n.right) if isinstance(n, Binary) else
                      (n.operand,) if isinstance(n, Unary) else n.args):
                visit(c)
    visit(e)
    return tuple(arrays), tuple(params), tuple(consts)


def result_dtype(eq: Equation, arrays: dict) -> np.dtype:
    """numpy's result_type of the arrays read (not index arrays), with scalars weak; float when
    the right side divides or calls a float function on integers; real when complex values
    reach it only through abs, real, imag (or comparisons)."""
    read, consts, floaty, (c_arrays, c_params, c_consts) = _dtype_inputs(eq)
    dts = [arrays[n].dtype for n in read]
    weak = [_weak(arrays[p]) for p in eq.params] + [_weak(c) for c in consts]
    if dts:
        dt = np.result_type(*dts, *weak)
    else:
        dt = np.result_type(np.int64, *weak) if weak else np.dtype(np.int64)
    if dt.kind == "c" and not (any(arrays[n].dtype.kind == "c" for n in c_arrays)
                               or any(np.result_type(_weak(arrays[p])).kind == "c"
                                      for p in c_params)
                               or any(isinstance(c, complex) for c in c_consts)):
        return np.finfo(dt).dtype
    if dt.kind in "biu" and floaty:
        return np.dtype(np.float64)
    if dt.kind == "b" and eq.reduction_indices:
        return np.dtype(np.int64)
    return np.dtype(dt)


def _weak(v):
    if isinstance(v, np.ndarray):
        v = v.item()
    if isinstance(v, np.generic):
        return v.dtype
    return v


def summation_terms(e):
    """Top-level additive terms of an expression."""
    if isinstance(e, Binary) and e.op in "+-":
        return summation_terms(e.left) + summation_terms(e.right)
    if isinstance(e, Unary):
        return summation_terms(e.operand)
    return [e]


def term_indices(e) -> set[str]:
    out = set()
    for n in walk(e):
        if isinstance(n, Access):
            for s in n.indices:
                out |= set(s.names)       # a gather's names are its index array's indices
        elif isinstance(n, IndexValue):
            out.add(n.name)
    return out


def summation_message(eq: Equation) -> str | None:
    """The SummationWarning text when an additive term misses a reduction index."""
    red = eq.reduction_indices
    if not red or eq.reducer != "+":
        return None
    for t in summation_terms(eq.rhs):
        missing = [n for n in red if n not in term_indices(t)]
        if missing:
            return (f"the term {t} does not use the reduction index {', '.join(missing)}, so it "
                    f"is summed over {', '.join(missing)} as well (the whole right-hand side is "
                    f"reduced): {eq.text or eq}.  Split the statement if that is not intended.")
    return None


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

    def __init__(self, expr: str, options: Options | None = None, /, **kw):
        """Kernel(expr, **options), or Kernel(expr, Options(...)): options validated first."""
        if options is None:
            options = Options.from_kwargs(**kw)
        elif kw:
            raise ArgumentError("pass either an Options or option keywords, not both")
        self.text = expr
        self.options = options
        self.given = options.given
        try:
            self.equation = parse(expr, tuple(self.given))
        except ParseError:
            if not self.given:
                raise
            options.check(parse(expr))  # a ranges= name that is an array of the statement
            raise
        self._check_option_names(expr, self.equation)
        options.check(self.equation)
        self.threads, self.target, self.pad = options.threads, options.target, options.pad
        self.fastmath, self.verbose = options.fastmath, options.verbose
        threads, target, verbose = options.threads, options.target, options.verbose
        self._prepared = memo.Memo("kernel.compiled", 64)   # compile key -> Prepared
        self._plans = memo.Memo("kernel.plans", 64)         # call signature -> plan
        self._lowered = None
        self._last: Prepared | None = None
        self._calls = callpath.CallCache(self.equation, threads)   # the fast call path
        lhs = self.equation.lhs.indices
        bare = [s.names[0] for s in lhs if isinstance(s, Affine) and s.is_bare]
        self._fill = (len(bare) != len(lhs) or len(set(bare)) != len(bare) or any(
            schedule.mask_guards(f) is not None for f in schedule.top_factors(self.equation.rhs)))
        # Pure contractions go to BLAS through numpy when large (blas.py); blas=False: loops.
        self._blas = (_blas.contraction(self.equation)
                      if options.blas and target in ("auto", "cpu") and not self.given else None)
        # Other products of two reads at affine indices (shifts, strides, sub-ranges) run as
        # matmuls over strided views when the cost model says so (blas_shift.py).
        self._shift = (_shift.shifted(self.equation)
                       if options.blas and target in ("auto", "cpu") else None)
        self.summation_message = summation_message(self.equation)
        self._warned_by_tullio = False
        if self.summation_message:
            warnings.warn(self.summation_message, SummationWarning, stacklevel=3)
        if verbose:
            print(f"tullio_py: {self.equation}")

    @staticmethod
    def _check_option_names(expr: str, eq: Equation | None = None):
        eq = eq or parse(expr)
        for name in [eq.output, *eq.arrays, *eq.params]:
            if name in OPTIONS:
                raise ArgumentError(f"'{name}' is an option name and cannot name an array or "
                                    "parameter", expr, _find(expr, name),
                                    "rename the array")

    # ------------------------------------------------------------------ checking arrays
    def _collect(self, arrays: dict) -> dict:
        eq = self.equation
        needed = list(eq.arrays) + list(eq.params)
        if eq.assign != ":=":
            needed = [eq.output] + needed
        missing = [n for n in needed if n not in arrays]
        if missing:
            raise ArgumentError(f"missing array{'s' if len(missing) > 1 else ''}: "
                                f"{', '.join(missing)}", eq.text, _find(eq.text, missing[0]),
                                f"pass {missing[0]}=... as a keyword")
        extra = [n for n in arrays if n not in needed and n != eq.output]
        if extra:
            raise ArgumentError(f"not used by the expression: {', '.join(extra)}", eq.text, None,
                                f"options are {', '.join(OPTIONS)}")
        out = {}
        for n in needed:
            v = arrays[n]
            if n in eq.params:
                if isinstance(v, np.ndarray) and v.ndim == 0:
                    v = v.item()
                if not isinstance(v, (int, float, complex, np.number, bool, np.bool_)):
                    raise ArgumentError(f"'{n}' is used as a scalar parameter but got "
                                        f"{type(v).__name__}", eq.text, _find(eq.text, n))
                if isinstance(v, np.generic) and _extended(v.dtype):
                    raise ArgumentError(f"'{n}' is a {v.dtype} scalar, which the compiled loops "
                                        "do not support", eq.text, _find(eq.text, n),
                                        f"pass float({n}) or complex({n})")
                out[n] = v
                continue
            if not isinstance(v, np.ndarray):
                if hasattr(v, "__array__") or isinstance(v, (list, tuple)):
                    v = np.asarray(v)
                elif np.isscalar(v) and n != eq.output:
                    v = np.asarray(v)
                else:
                    raise ArgumentError(f"'{n}' must be an array, got {type(v).__name__}",
                                        eq.text, _find(eq.text, n))
            out[n] = v
        self._check_ranks(out)
        return out

    def _check_ranks(self, arrays: dict):
        eq = self.equation
        for acc in [eq.lhs] + eq.accesses():
            a = arrays.get(acc.array)
            if a is None:
                continue
            if a.ndim != len(acc.indices):
                raise ArgumentError(f"'{acc.array}' has {a.ndim} dimension"
                                    f"{'s' if a.ndim != 1 else ''} but is indexed with "
                                    f"{len(acc.indices)}", eq.text, acc.span)
            if a.dtype.kind not in "biufc":
                raise ArgumentError(f"'{acc.array}' has dtype {a.dtype}: tullio_py needs numbers",
                                    eq.text, acc.span)
            if a.dtype == np.float16 or _extended(a.dtype):
                to = ("float32" if a.dtype == np.float16 else
                      "complex128" if a.dtype.kind == "c" else "float64")
                raise ArgumentError(f"'{acc.array}' is {a.dtype}, which the compiled loops do not "
                                    "support", eq.text, acc.span,
                                    f"pass {acc.array}.astype(np.{to})")
            if not a.dtype.isnative:
                raise ArgumentError(f"'{acc.array}' has non-native byte order ({a.dtype.str})",
                                    eq.text, acc.span,
                                    f"pass {acc.array}.astype({acc.array}.dtype.newbyteorder('='))")
        for g in eq.gathers():
            J = arrays[g.array]
            if J.ndim != len(g.indices):
                raise ArgumentError(f"index array '{g.array}' has {J.ndim} dimensions but is "
                                    f"indexed with {len(g.indices)}", eq.text, g.span)
            if J.dtype.kind not in "iu":
                raise RangeError(f"index array '{g.array}' must hold integers, not {J.dtype}",
                                 eq.text, g.span, f"convert it with {g.array}.astype(int)")
        if eq.assign != ":=":
            out = arrays[eq.output]
            if not out.flags.writeable:
                raise ArgumentError(f"output '{eq.output}' is read-only", eq.text, eq.lhs.span)

    def _extrema(self, arrays: dict, rng: dict | None = None) -> dict:
        """Index arrays' (min, max) over what the loops read (with rng), or over what the text
        can read (without: range inference uses this over-estimate)."""
        return ranges_mod.gather_extrema(self.equation, arrays, rng)

    def _check_gathers(self, arrays: dict, ext: dict, raises: bool = True) -> bool:
        """Gathers without a shift cannot go through range inference: check values directly
        (ext: the index values the loops read).  With raises=False, only say if they fit."""
        eq = self.equation
        for acc in ([eq.lhs] if eq.assign != ":=" else []) + eq.accesses():
            for d, s in enumerate(acc.indices):
                if isinstance(s, Gather) and s.array in ext and not s.offset.terms:
                    lo, hi = ext[s.array][0] + s.offset.const, ext[s.array][1] + s.offset.const
                    n = arrays[acc.array].shape[d]
                    if (lo < 0 or hi >= n) and not raises:
                        return False
                    if lo < 0 or hi >= n:
                        raise RangeError(f"index array '{s.array}' holds values {lo}..{hi} (with "
                                         f"offset) where the loops read it, out of bounds for "
                                         f"'{acc.array}' which has {n} along dimension {d}",
                                         eq.text, s.span)
        return True

    def ranges(self, **arrays) -> dict[str, range]:
        """The range of every index for these arrays (what the loops iterate)."""
        arrays = self._collect(arrays)
        ext = self._extrema(arrays)
        return ranges_mod.infer(self.equation, {n: a.shape for n, a in arrays.items()
                                                if isinstance(a, np.ndarray)}, ext, self.given)

    # ------------------------------------------------------------------ calling
    def __call__(self, **arrays):
        if _tape.current() is None:         # the fast path: numpy arrays and scalars only,
            out = self._calls.call(arrays)  # with the names, dtypes, shapes of an earlier call
            if out is not None:
                return out
        torch = sys.modules.get("torch")    # torch tensors go to their frontend (torch loaded),
        if torch is not None and any(isinstance(v, torch.Tensor) for v in arrays.values()):
            from .frontends import torch as torch_frontend   # which consults the Tape itself
            return torch_frontend.call(self, arrays)        # (torch.compile cannot trace it)
        if "dask.array" in sys.modules and _dask_frontend().wants(arrays):
            return _dask_frontend().call(self, arrays)     # a lazy graph of blocks
        tape = _tape.current()              # inside `with Tape()`: record, then run untaped
        if tape is not None:
            return tape.run(self, arrays)
        if self.target != "cpu" and self.target != "python" and _cuda.wants_cuda(self, arrays):
            return _cuda.call(self, arrays)
        given = arrays
        eq = self.equation
        collected = self._collect(arrays)
        arrays = overlap.snapshot_aliases(eq, collected)   # inputs aliasing an in-place output
        shapes = {n: a.shape for n, a in arrays.items() if isinstance(a, np.ndarray)}
        ext = self._extrema(arrays)
        rng = ranges_mod.infer(eq, shapes, ext, self.given)
        read = self._extrema(arrays, rng) if ext else ext
        self._check_gathers(arrays, read)       # the index values the loops read
        if self._blas is not None and _blas.worth(self._blas, rng, arrays):
            return _blas.run(self._blas, eq, arrays, result_dtype(eq, arrays),
                             None if eq.assign == ":=" else arrays[eq.output])
        if self._shift is not None:
            done = self._shift.call(arrays, rng, None if eq.assign == ":=" else arrays[eq.output],
                                    result_dtype(eq, arrays), self.pad)
            if done is not None:
                return done
        if eq.assign == ":=":
            dtype = result_dtype(eq, arrays)
            shape = ranges_mod.output_shape(eq, rng, read)
            out = np.full(shape, self.pad, dtype) if self._needs_fill() else np.empty(shape, dtype)
        else:
            out = arrays[eq.output]
            dtype = out.dtype
        if eq.reducer in ("max", "min") and dtype.kind == "c":
            raise ArgumentError(f"a ({eq.reducer}) reduction needs real values, but the result "
                                f"type is {dtype} (numpy's result type of the arrays read)",
                                eq.text, eq.lhs.span,
                                "write into an existing real array with '=' (e.g. of abs(...))")
        prepared, call_ranges, extra_params = self._prepare(arrays, rng, dtype, out.shape)
        args = self._arguments(prepared, arrays, out, call_ranges, extra_params)
        self._launch(prepared, args)
        self._last = prepared
        # the fast path's key holds `ext`: a call with that key must be safe whatever it reads
        if read == ext or (self._check_gathers(arrays, ext, raises=False) and not (
                eq.assign == ":=" and any(isinstance(s, Gather) for s in eq.lhs.indices))):
            self._calls.remember(self, given, collected, prepared, args, out,
                                 eq.assign == ":=" and self._needs_fill())
        return out

    def run_with_ranges(self, arrays: dict, rng: dict, out: np.ndarray, params: dict):
        """Run into `out` with the given index ranges (no range inference): gradients iterate
        exactly the forward's ranges.  Returns (prepared, ranges, bound parameters); None
        when it ran through BLAS instead (blas.py: a pure contraction whose ranges cover
        every array; blas_shift.py: shifted reads and sub-ranges as strided views)."""
        if self._whole_blas(arrays, rng, out):
            res = _blas.run(self._blas, self.equation, {**arrays, **params}, out.dtype, out)
            if res is not out:          # a `:=` statement: blas.run made a new array
                out[...] = res
            return None
        if self._shift is not None:
            done = self._shift.call({**arrays, **params}, rng, out, out.dtype, self.pad)
            if done is not None:
                if done is not out:     # ':=' makes a new array: its values go into `out`
                    out[...] = done
                return None
        prepared, call_ranges, extra = self._prepare(arrays, rng, out.dtype, out.shape)
        self._launch(prepared, self._arguments(prepared, {**arrays, **params}, out,
                                               call_ranges, extra))
        return prepared, call_ranges, extra

    def uses_blas(self, arrays: dict, rng: dict, out: np.ndarray) -> bool:
        """Whether run_with_ranges hands this call to BLAS (blas.py or blas_shift.py)."""
        if self._whole_blas(arrays, rng, out):
            return True
        return (self._shift is not None and out.flags.writeable
                and self._shift.plan(arrays, rng, out.shape, out.strides, out.dtype) is not None)

    def _whole_blas(self, arrays: dict, rng: dict, out: np.ndarray) -> bool:
        return (self._blas is not None and _covers_arrays(self.equation, rng, arrays, out)
                and _blas.worth(self._blas, rng, arrays))

    def _launch(self, prepared, args):
        """Call the compiled function on the thread count the `threads` option asks for."""
        jit.call(prepared.fn, args, prepared.source.parallel,
                 schedule.thread_count(self.threads, jit.max_threads()))

    def _needs_fill(self) -> bool:
        """A new output must be filled first: some elements may not be written (diagonals,
        constants, shifted or gathered positions, masks on left indices)."""
        return self._fill

    def _prepare(self, arrays, rng, dtype, out_shape):
        plan, key, low = self.plan_for(arrays, rng, dtype, out_shape)
        prepared = self._prepared.get(key)
        if prepared is None:
            source = codegen.render(plan)
            if self.verbose >= 2:
                print(source.text)
            fn = jit.load(source, "cpu" if self.target == "auto" else self.target,
                          signature=repr(key[1:]))
            prepared = Prepared(fn, source, plan, low.equation, low.solved, low.snapshot)
            self._prepared[key] = prepared
        return prepared, low.ranges, low.bound_params

    def plan_for(self, arrays, rng, dtype, out_shape):
        """(plan, compile key, lowered statement) for one call signature; compiles nothing.
        Remembered per ranges and array signature: gradients run through here on every vjp,
        and planning costs about 0.3 ms per statement."""
        memo = (tuple((n, r.start, r.stop, r.step) for n, r in rng.items()), dtype.str,
                tuple(out_shape), tuple((n, a.dtype.str, a.shape, a.strides)
                                        if isinstance(a, np.ndarray) else (n, type(a).__name__)
                                        for n, a in arrays.items()))
        hit = self._plans.get(memo)
        if hit is None:
            hit = self._plans[memo] = self._plan_for(arrays, rng, dtype, out_shape)
        return hit

    def _plan_for(self, arrays, rng, dtype, out_shape):
        eq = self.equation
        if self._lowered is None:       # the statement's rewrite, once per kernel
            self._lowered = rewrite.lower(eq)
            self._lowered_text = str(self._lowered.equation)
        low = rewrite.lower(eq, rng, out_shape, static=self._lowered)
        work_eq, call_ranges = low.equation, low.ranges
        parallel = schedule.threading(work_eq, call_ranges, self.threads, jit.max_threads())
        target = "cpu" if self.target == "auto" else self.target
        # Memory layout of every array (loop order follows it), and sizes (which matter).
        layouts = {n: _dims_by_stride(a) for n, a in arrays.items() if isinstance(a, np.ndarray)}
        sizes = {n: a.size for n, a in arrays.items() if isinstance(a, np.ndarray)}
        sizes[eq.output] = int(np.prod(out_shape))
        for n in list(layouts):
            if n == eq.output and eq.assign != ":=":
                layouts["_old_" + n], sizes["_old_" + n] = layouts[n], sizes[n]
        plan = schedule.plan(work_eq, call_ranges, dtype.name, threads=parallel,
                             pad_value=self.pad, fastmath=self.fastmath,
                             layouts=layouts, sizes=sizes)
        plan = dtypes.with_dtypes(plan, arrays)
        # Every choice of the plan that changes the code (block depends on the sizes).
        key = (self._lowered_text, dtype.str, target, parallel, plan.loops, plan.fixed,
               plan.form, plan.block, plan.chunked, plan.partial, plan.collapse, plan.lanes,
               tuple((n, a.dtype.str, a.ndim, _layout(a)) if isinstance(a, np.ndarray)
                     else (n, type(a).__name__) for n, a in sorted(arrays.items())))
        return plan, key, low

    def _arguments(self, prepared, arrays, out, call_ranges, extra_params):
        eq = prepared.equation
        args = []
        for name in prepared.source.args:
            if name == eq.output:
                args.append(out.reshape(1) if out.ndim == 0 else out)
            elif name.startswith("_old_"):
                old = out.copy()
                args.append(old.reshape(1) if old.ndim == 0 else old)
            elif name.startswith(("_start_", "_stop_")):
                args.append(codegen.range_argument(name, call_ranges))
            elif name in extra_params:
                args.append(extra_params[name])
            else:
                args.append(arrays[name])
        return args

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

    def explain(self, **arrays):
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

    def vjp(self, cotangent, **arrays) -> dict:
        """{input: gradient of sum(out * cotangent)}; pass the output too to skip recomputing it."""
        if "dask.array" in sys.modules and _dask_frontend().wants({**arrays, "": cotangent}):
            return _dask_frontend().vjp(self, cotangent, arrays)
        return self._gradient().vjp(cotangent, **arrays)

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

    def jvp(self, tangents: dict, **arrays):
        """The output's tangent for {input: tangent} (a missing input has zero tangent)."""
        return self._tangent().jvp(tangents, arrays)

    @property
    def tangent_equations(self) -> list:
        """[tullio_py statements] reproducing jvp into a zeroed d<out> (bounds of the last call)."""
        return self._tangent().equations()

    def __repr__(self):
        return f"kernel({self.text!r})"




def _dask_frontend():
    from .frontends import dask
    return dask


def _covers_arrays(eq: Equation, rng: dict, arrays: dict, out: np.ndarray) -> bool:
    """Every bare index runs over exactly the whole extent of each dimension it indexes."""
    for acc in [eq.lhs] + eq.accesses():
        shape = out.shape if acc.array == eq.output else np.shape(arrays[acc.array])
        for d, s in enumerate(acc.indices):
            r = rng.get(s.names[0]) if isinstance(s, Affine) and s.is_bare else None
            if r is None or r.step != 1 or r.start != 0 or r.stop != shape[d]:
                return False
    return True


def _layout(a: np.ndarray):
    if a.flags.c_contiguous:
        return "C"
    return "F" if a.flags.f_contiguous else _dims_by_stride(a)


def _dims_by_stride(a: np.ndarray) -> tuple:
    """Dimensions from the largest stride to the smallest; empty when none is contiguous."""
    if a.flags.c_contiguous:
        return tuple(range(a.ndim))
    if a.flags.f_contiguous:
        return tuple(range(a.ndim - 1, -1, -1))
    dims = tuple(sorted(range(a.ndim), key=lambda d: -abs(a.strides[d])))
    return dims if dims and abs(a.strides[dims[-1]]) == a.itemsize else ()


def _extended(dtype: np.dtype) -> bool:
    """numpy's long double and its complex (80- or 128-bit): numba has no loops for them.
    Where they are the same as float64/complex128 they are not extended."""
    return dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f" else 16)


def _find(text: str, name: str):
    import re
    m = re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text or "")
    return (m.start(), m.end()) if m else None


# ----------------------------------------------------------------------------- public verbs
def kernel(expr: str, /, **options) -> Kernel:
    """A Kernel for `expr`, cached per expression and (validated) options."""
    if not isinstance(expr, str):
        parse(expr)                                 # the ParseError for a non-string
    if options:
        try:
            opts = Options.from_kwargs(**options)
        except ArgumentError:
            arrays = [n for n, v in options.items() if isinstance(v, np.ndarray)]
            if not arrays:
                raise
            Kernel._check_option_names(expr)       # the statement names an array like an option
            raise ArgumentError(f"option {', '.join(arrays)} got an array: option names are "
                                f"reserved and cannot name arrays ({', '.join(OPTIONS)})",
                                expr) from None
        # threads=1 (one thread) and threads=True (all) are equal as numbers: keyed apart
        key = (expr, None if opts == _DEFAULT else opts, type(opts.threads))
    else:
        opts, key = _DEFAULT, (expr, None, bool)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = Kernel(expr, opts)
    return k


_DEFAULT = Options()


def tullio(expr: str, /, **arrays_and_options):
    """Evaluate `expr`.  Arrays by keyword, or read from the caller's scope when not passed."""
    options = {k: v for k, v in arrays_and_options.items() if k in OPTIONS}
    arrays = {k: v for k, v in arrays_and_options.items() if k not in OPTIONS}
    k = kernel(expr, **options)
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
    return k(**arrays)
