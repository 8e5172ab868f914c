"""Running a vjp plan (vjp_plan.py): one runner for every frontend.

`run` allocates the plan's zeroed arrays and runs its steps in order; a frontend supplies only
`zeros(array)` (a zero-filled array of a `vjp_plan.Array`) and `launch(plan, step, ns)` (run
one step reading and writing the arrays of `ns`).  `Host` is the numpy frontend (the CPU: a
statement's own kernel, which may hand it to BLAS, or a fused loop nest);
frontends/cuda_vjp.py has the GPU's.
"""
from __future__ import annotations

import numpy as np

from . import jit, memory, schedule, step_args, vjp_rows
from .vjp_plan import VjpPlan, absent, arrays_of, spread


def run(plan: VjpPlan, frontend, ns: dict) -> dict:
    """Run `plan` on the arrays and scalars of `ns` (by name; the zeroed arrays are added to
    it): {input: its gradient array, in the gradient's dtype; a zero-stride view where the
    gradient is constant along some dimensions (vjp_plan.spread_dims)}."""
    for a in plan.arrays:
        ns[a.name] = frontend.zeros(a)
    for step in plan.steps:
        frontend.launch(plan, step, ns)
    return {a.input: spread(a, ns[a.name]) for a in plan.arrays if a.input is not None}


def run_on(k, arrays: dict, rng: dict, out: np.ndarray, params: dict):
    """Call Kernel k with the given index ranges (no range inference) into `out`."""
    return k.run_with_ranges(arrays, rng, out, params)


class Host:
    """The numpy frontend: `kernels[i]` runs `plan.statements[i]` over `ranges[i]` (its
    ranges as a dict); `fused_function(Nest or Rows)` gives a fused nest's (or a row group's)
    compiled function; what each statement ran is written to `record` (statement text ->
    run_with_ranges' result, or ("fused" or "rows", source)); the arrays named in `temporary`
    come from `scratch` (a scratch.Pool: the caller gives them back after the run)."""

    empty = staticmethod(memory.empty)      # an unfilled array (tests fill it with NaN)

    def __init__(self, kernels, ranges, params: dict, record: dict, fused_function, threads,
                 scratch=None, temporary=frozenset(), *, sources: dict):
        self.kernels, self.ranges, self.params, self.record = kernels, ranges, params, record
        self.sources = sources          # step_sources(plan, params)
        self.fused_function, self.threads = fused_function, threads
        self.scratch, self.temporary = scratch, temporary
        self.buffers: list = []         # block-local arrays' buffers, from `scratch`

    def zeros(self, a) -> np.ndarray:
        """Zero-filled; unfilled for an array written with `=` (vjp_written.py), but for the
        boxes of elements its statement never writes; a zero-stride stand-in for an array
        that lives in blocks of a row group (vjp_rows.block_local)."""
        if a.local:
            return absent(a.shape, a.dtype)
        scratch = a.name in self.temporary
        if not a.written:
            if not scratch:
                return memory.zeros(a.shape, a.dtype)
            out = self.scratch.empty(a.shape, a.dtype)
            out.fill(0)
            return out
        out = (self.scratch.empty if scratch else self.empty)(a.shape, a.dtype)
        for box in a.zero:
            out[tuple(slice(lo, hi) for lo, hi in box)] = 0
        return out

    def launch(self, plan: VjpPlan, step, ns: dict):
        params = self.params
        threads = schedule.thread_count(self.threads, jit.max_threads())
        if step.fused is None and step.rows is None:
            k = step.members[0]
            s = plan.statements[k]
            self.record[s.text] = run_on(self.kernels[k], arrays_of(s, ns, params, True, threads),
                                         self.ranges[k], ns[s.output], params)
            return
        f = step.fused or step.rows
        bufs = {}
        if step.rows is not None and f.local:
            bufs = vjp_rows.local_buffers(f, ns, self.scratch.empty)
            self.buffers += bufs.values()
        if step.rows is not None and f.partial:
            bufs.update(vjp_rows.partial_buffers(f, ns, memory.zeros))
        args = step_args.fill(self.sources[id(step)], ns, params, bufs)
        jit.call(self.fused_function(f), args, f.source.parallel, threads)
        for k in step.members:
            self.record[plan.statements[k].text] = (step.kind, f.source)



def step_sources(plan: VjpPlan, params: dict) -> dict:
    """{id(step): step_args sources} of the plan's fused and rows steps, worked out with the
    plan: its callers keep them beside it (per call signature) and give them to Host."""
    return {id(step): step_args.plan(step.fused or step.rows, plan.statements, step.members,
                                     params)
            for step in plan.steps if step.fused is not None or step.rows is not None}
