"""numpy arrays in, numpy arrays out: the CPU path of a call (frontends/registry.py asks it
last; it takes whatever the others do not: numpy arrays, Python scalars, 0-d arrays).

describe: bind.py checks the arrays and infers the ranges, output shape and dtype;
allocate: a new output (filled where some elements may not be written), or the in-place one;
launch:   BLAS through numpy for a pure contraction worth it (blas.py), strided-view matmuls
          when the cost model says so (blas_shift.py), the compiled loops of a moved
          statement on relaid copies of some reads when relayout.py's rule says so, else the
          compiled loops of `Kernel.prepare` on the `threads` the kernel asks for.
A call that ran the loops, as they stand or on relaid copies, is remembered by the kernel's
fast path (callpath.py), which replays later calls of the same signature without coming here.
`run_with_ranges` runs a statement over given ranges instead of inferred ones (the gradient
side and dask blocks).
"""
from __future__ import annotations

import numpy as np

from .. import bind as binding
from .. import blas, codegen, jit, memory, overlap, relayout, schedule
from ..ir import Gather


def wants(arrays: dict, kernel=None) -> bool:
    """The last frontend asked: every call the others leave."""
    return True


def call(kernel, arrays: dict):
    given = arrays
    eq = kernel.equation
    b = binding.bind(eq, kernel.options, arrays)     # every check of the arrays
    collected, rng = b.arrays, b.ranges
    arrays = overlap.snapshot_aliases(eq, collected)   # inputs aliasing an in-place output
    contraction, shifted = kernel.blas_plan, kernel.shift_plan
    if contraction is not None and blas.worth(contraction, rng, arrays):
        return blas.run(contraction, eq, arrays, b.dtype,
                        None if eq.assign == ":=" else arrays[eq.output])
    if shifted is not None:
        given_out = None if eq.assign == ":=" else arrays[eq.output]
        done = shifted.call(arrays, rng, given_out, b.dtype, kernel.pad, shift_groups(),
                            loops_blocked(kernel, arrays, rng, b.dtype, b.shape if given_out
                                          is None else given_out.shape),
                            threads=shift_threads(kernel))
        if done is not None:
            return done
    if eq.assign == ":=":
        out = (memory.full(b.shape, kernel.pad, b.dtype) if b.fill else
               memory.empty(b.shape, b.dtype))
    else:
        out = arrays[eq.output]

    # remembered only where any call with this key is safe: the fast path's key holds `ext`,
    # not the index values themselves (asked after the run, as the key is built)
    def safe():
        return b.read == b.extrema or (binding.check_gathers(eq, arrays, b.extrema, raises=False)
                                       and not (eq.assign == ":=" and any(
                                           isinstance(s, Gather) for s in eq.lhs.indices)))
    got = relaid(kernel, arrays, rng, out)
    if got is not None:
        run = relaid_runner(kernel, *got)
        run(arrays, out)
        if safe():
            kernel.call_cache.remember_relaid(kernel, given, collected, run, out, b.fill)
        return out
    prepared, call_ranges, extra_params = kernel.prepare(arrays, rng, b.dtype, out.shape)
    args = arguments(prepared, arrays, out, call_ranges, extra_params)
    launch(kernel, prepared, args)
    kernel.last = prepared
    if safe():
        kernel.call_cache.remember(kernel, given, collected, prepared, args, out, b.fill)
    return out


def vjp(kernel, cotangent, arrays: dict) -> dict:
    """{input: gradient} with numpy arrays (gradient_kernel.py)."""
    return kernel.gradient_side().vjp(cotangent, **arrays)


# ----------------------------------------------------------------------------- launching
def arguments(prepared, arrays: dict, out: np.ndarray, call_ranges: dict, extra_params: dict):
    """The compiled function's positional arguments, in its order: the output (and, for an
    in-place statement that reads it, a snapshot of its old value) besides the inputs."""
    output = prepared.equation.output
    values = dict(arrays)
    values[output] = out.reshape(1) if out.ndim == 0 else out
    if "_old_" + output in prepared.source.args:
        old = out.copy()
        values["_old_" + output] = old.reshape(1) if old.ndim == 0 else old
    return codegen.arguments(prepared.source.args, values, call_ranges, extra_params)


def launch(kernel, prepared, args) -> None:
    """Call the compiled function on the thread count the `threads` option asks for."""
    jit.call(prepared.fn, args, prepared.source.parallel,
             schedule.thread_count(kernel.threads, jit.max_threads()))


def run_with_ranges(kernel, arrays: dict, rng: dict, out: np.ndarray, params: dict):
    """Kernel.run_with_ranges: into `out`, over the given ranges."""
    if whole_blas(kernel, arrays, rng, out):        # both write into the given `out`
        blas.run(kernel.blas_plan, kernel.equation, {**arrays, **params}, out.dtype, out)
        return None
    if kernel.shift_plan is not None and kernel.shift_plan.call(
            {**arrays, **params}, rng, out, out.dtype, kernel.pad, shift_groups(),
            loops_blocked(kernel, arrays, rng, out.dtype, out.shape),
            shift_threads(kernel)) is not None:
        return None
    done, ran = run_relaid(kernel, {**arrays, **params}, rng, out)
    if done:
        return ran
    prepared, call_ranges, extra = kernel.prepare(arrays, rng, out.dtype, out.shape)
    launch(kernel, prepared, arguments(prepared, {**arrays, **params}, out, call_ranges, extra))
    return prepared, call_ranges, extra


def relaid(kernel, arrays: dict, rng: dict, out: np.ndarray):
    """relayout.choose for a call of `kernel` running its loops on the CPU: (axis orders,
    moved statement, its ranges) when the call should read relaid copies, else None."""
    if kernel.target not in ("auto", "cpu"):
        return None
    return relayout.choose(kernel, kernel.kernel_for, arrays, rng, out)


def run_relaid(kernel, arrays: dict, rng: dict, out: np.ndarray):
    """Run the call as its moved statement on relaid copies (relayout.py) where the rule says
    so, into `out`: (whether it did, (prepared, ranges, bound parameters) of what ran).  The
    moved statement's own loops run directly: relayout.choose has already found that they are
    register-blocked and that BLAS does not take it."""
    got = relaid(kernel, arrays, rng, out)
    if got is None:
        return False, None
    return True, relaid_runner(kernel, *got)(arrays, out)


def relaid_runner(kernel, order, moved, rng):
    """run(arrays, out): the call as relayout.choose's moved statement `moved` (over `rng`)
    on copies of the arrays in `order`, into `out`; returns (prepared, ranges, bound
    parameters) of what ran.  What it does depends only on the call's signature, so the
    fast path replays it (callpath.remember_relaid) with the arrays of a later call."""
    mk = kernel.kernel_for(moved)
    mk.relaid_reads = tuple(order.items())      # (what it reads, for gradient_code)
    eq = kernel.equation

    def run(arrays: dict, out: np.ndarray):
        threads = shift_threads(kernel)
        copies = relayout.copies(arrays, order, threads=threads)
        dest = relayout.scratch(order, eq.output, out)
        prepared, call_ranges, extra = mk.prepare(copies, rng, dest.dtype, dest.shape)
        launch(mk, prepared, arguments(prepared, copies, dest, call_ranges, extra))
        relayout.take(order, eq, out, dest, threads)
        kernel.last = mk.last = prepared
        return prepared, call_ranges, extra
    return run


def uses_blas(kernel, arrays: dict, rng: dict, out: np.ndarray) -> bool:
    """Kernel.uses_blas: whether run_with_ranges hands this call to BLAS."""
    if whole_blas(kernel, arrays, rng, out):
        return True
    return (kernel.shift_plan is not None and out.flags.writeable
            and kernel.shift_plan.plan(arrays, rng, out.shape, out.strides, out.dtype,
                                       shift_groups(),
                                       loops_blocked(kernel, arrays, rng, out.dtype, out.shape))
            is not None)


def whole_blas(kernel, arrays: dict, rng: dict, out: np.ndarray) -> bool:
    """A pure contraction whose ranges cover every array, worth running through BLAS."""
    return (kernel.blas_plan is not None
            and blas.covers(kernel.equation, rng, arrays, out.shape)
            and blas.worth(kernel.blas_plan, rng, arrays))


def loops_blocked(kernel, arrays: dict, rng: dict, dtype, shape):
    """blas_shift's question, asked only when it has a plan to weigh: would the generated
    loops of this call be register-blocked (Plan.jam), as they stand or on relaid copies
    (relayout.py: a padded copy of conv1d's dy turns its dx into blocked loops), and so several
    times faster than plain loops?  The answer is the tiles' waste (schedule.tile_waste, >= 1:
    the blocked loops' work over the statement's), 0 for no.  A planning failure answers no
    (the plain-loop rate, the older rule); the loops report it themselves if they run."""
    def blocked() -> float:
        try:
            plan = kernel.plan_for(arrays, rng, dtype, shape)[0]
            if plan.jam:
                return schedule.tile_waste(plan, rng)
            got = relaid(kernel, arrays, rng, relayout.standin(shape, dtype))
            if got is None:
                return 0.0
            order, moved, mrng = got
            stand = relayout.copies(arrays, order, run=False)
            return schedule.tile_waste(kernel.kernel_for(moved).plan_for(
                stand, mrng, dtype, relayout.target_shape(order, kernel.equation.output,
                                                          shape))[0], mrng)
        except Exception:       # noqa: BLE001  (a cost question only; see above)
            return 0.0
    return blocked


def shift_groups() -> int:
    """The thread count blas_shift.py chooses its plans and cuts its step groups for: the
    machine's (jit.max_threads), at most the thread budget (torch's intra-op thread count
    under the torch frontend), the same for every call whatever its `threads`, so that a
    call's thread count never changes a bit of its result."""
    return _budgeted(jit.max_threads())


def shift_threads(kernel) -> int:
    """Threads blas_shift.py may use: the loops' count, at most the caller's thread budget
    (jit.thread_budget: torch's intra-op thread count under the torch frontend)."""
    return _budgeted(kernel.loop_threads())


def _budgeted(n: int) -> int:
    """n, at most this Python thread's thread budget (jit.thread_budget) where it has one."""
    budget = getattr(jit.budgets, "n", None)
    return min(n, budget) if budget else n
