"""`Chain`: several statements as one kernel (`kernel("m[i] := ...; y[i,j] := ...")`).

The text's statements (chain_text.py: one per line or separated by ';', each `:=`) run in
order, each by its own Kernel, the arrays they define passed on by name; the result is the
last statement's array, the others are temporaries.  Options apply to every statement
(`ranges=` names go to the statements that have such an index); `nograd=` names inputs that
get no gradient, or temporaries whose value the gradient holds constant (a softmax's row
maximum: any value gives the same softmax).

Forward, numpy arrays: consecutive statements that satisfy codegen/rows.py's rule (a row index
bare on every left-hand side, the arrays they write read only at the row being written) run
as one parallel loop over blocks of rows, each statement's own compiled function over the
block in turn (vjp_rows.row_groups chooses them, as for gradient steps), so a block's rows are
still in the cache when the next statement reads them.  The values are those of the statements
run one by one, on any number of threads; bit for bit except in the last bits of sums the
compiler may reorder (codegen/rows.py: a member compiled serially, not as its own parallel
kernel), as a fused gradient nest may.  `fuse=False` runs every statement by its own kernel
(forward and gradient: bit for bit).  Statements that run through BLAS,
gather, read a 0-d temporary, or run on another target run on their own, as do all statements
of a chain with a gather.  Decided once per call signature (the inputs' dtypes, shapes and
strides).  Inside a `Tape`, and with dask or CUDA arrays, the statements run one by one
through their kernels (the Tape records each).  torch tensors: frontends/torch_chain.py, one
autograd node for the whole chain.

Memory: temporaries no caller sees (the result and `run`'s arrays are the caller's) come
from scratch.py's pool and go back to it after the call (under torch autograd, when the node
is freed); where the caller reads only the result, a temporary that only its row group reads
lives in a per-thread buffer of a block's rows (codegen/rows.py's localize) and never
reaches memory: the softmax's m, e and z.

Gradient: chain_grad.py.
"""
from __future__ import annotations

import sys

import numpy as np

from . import bind as binding, chain_grad, chain_text, factory, jit, memo, memory, schedule, scratch
from . import step_args, vjp_rows
from . import tape as _tape
from .errors import ArgumentError, GradientError
from .options import Options
from .vjp_plan import Statement, Step, absent, frozen_ranges, standin

# Consecutive statements sharing a row index run as one pass over blocks of rows (forward),
# each block's rows of the arrays they touch about BLOCK_BYTES: within a core's L1 cache, so
# a block's rows stay there from one statement to the next.  4096x512 float32 on the AMD
# Zen 5 (48 kB L1, 1 MB L2), median of 25 interleaved calls, blocks of 1 MB -> 16 kB: layer
# norm 0.49 -> 0.43 ms on 2 threads, softmax 1.14 -> 0.98 ms on one and 0.72 -> 0.63 ms on
# 2 (benchmarks/bench_blocks.py).  A group with column sums adds a partial array per block
# and keeps blocks of SUMS_BLOCK_BYTES (vjp_rows.row_groups).
ROWS = True
BLOCK_BYTES = 16 << 10
SUMS_BLOCK_BYTES = 1 << 20


class Chain:
    """Several tullio_py statements run as one kernel.  Call it with the inputs by keyword."""

    def __init__(self, text: str, options: Options | None = None, /, **kw):
        if options is None:
            options = Options.from_kwargs(**kw)
        self.text, self.options = text, options
        self.spec = chain_text.parse_chain(text, options.given)
        chain_text.check_nograd(self.spec, options.nograd)
        self.kernels = tuple(self.statement_kernel(k) for k in range(len(self.spec.parts)))
        # gathers: the index values decide shapes and ranges (no plan per signature)
        self.gathers = any(p.equation.gathers() for p in self.spec.parts)
        self._plans = memo.Memo("chain.plans", 32)        # call signature -> forward steps
        self._grad = chain_grad.ChainGradient(self)
        self.last_groups = None

    # ------------------------------------------------------------------ the statements
    @property
    def threads(self):
        """The thread option every statement runs with (as Kernel.threads)."""
        return self.options.threads

    @property
    def target(self) -> str:
        return self.options.target

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(p.text for p in self.spec.parts)

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.spec.inputs

    @property
    def result(self) -> str:
        return self.spec.result

    def statement_kernel(self, k: int, nograd=()):
        """The Kernel of statement k (its gradient side with inputs `nograd` held constant)."""
        p = self.spec.parts[k]
        kw = {n: v for n, v in self.options.as_kwargs().items() if n not in ("ranges", "nograd")}
        given = self.options.given
        ranges = {n: given[n] for n in p.given} or None
        return factory.kernel(p.text, **kw, ranges=ranges, nograd=tuple(nograd))

    # ------------------------------------------------------------------ calling
    def __call__(self, /, **arrays):
        torch = sys.modules.get("torch")
        if torch is not None and any(isinstance(v, torch.Tensor) for v in arrays.values()):
            self.check_inputs(arrays)
            from .frontends import torch_chain
            return torch_chain.call(self, arrays)
        temps: list = []
        try:
            return self.forward(arrays, temps, local=True)[self.spec.result]
        finally:
            scratch.pool.give(temps)

    def explain(self, /, **arrays):
        """How a call with these numpy arrays runs, step by step (row groups, statements on
        their own Kernels' paths), its FLOPs and bytes, the measured time and the fraction of
        the machine's limit (explain.explain_chain)."""
        self.check_inputs(arrays)
        if not all(isinstance(v, np.ndarray) or np.isscalar(v) for v in arrays.values()):
            raise ArgumentError("Chain.explain takes numpy arrays and scalars", self.text, None)
        from .explain import explain_chain
        return explain_chain(self, arrays)

    def check_inputs(self, arrays: dict) -> None:
        spec = self.spec
        for n in arrays:
            if n in spec.defined:
                k = spec.defined.index(n)
                raise ArgumentError(f"{n} is defined by statement {k + 1} of the chain: pass "
                                    "only its inputs", spec.parts[k].text,
                                    spec.parts[k].equation.lhs.span)
            if n not in spec.inputs:
                raise ArgumentError(f"not used by the chain: {n}", self.text, None,
                                    f"its inputs are {', '.join(spec.inputs)}")
        missing = [n for n in spec.inputs if n not in arrays]
        if missing:
            k = next(k for k, p in enumerate(spec.parts) if missing[0] in p.reads)
            p = spec.parts[k]
            raise ArgumentError(f"missing array{'s' if len(missing) > 1 else ''}: "
                                f"{', '.join(missing)}", p.text, binding.find(p.text, missing[0]),
                                f"pass {missing[0]}=... as a keyword")

    def run(self, /, **arrays) -> dict:
        """Every array of the chain by name: the inputs, the temporaries and the result."""
        return self.forward(arrays)

    def forward(self, arrays: dict, temps: list | None = None, local: bool = False) -> dict:
        """`run` with the arrays in a dict (the frontends call it).  With a list `temps`, the
        temporaries of row groups come from scratch.pool and are appended to it: the caller
        gives them back once nothing reads them (they must not reach the user).  `local`
        (with `temps`; the caller reads only the result): temporaries that only one row group
        reads live in blocks of rows (codegen/rows.py's localize) and `ns` holds a zero-stride
        stand-in for each."""
        self.check_inputs(arrays)
        ns = dict(arrays)
        host = all(isinstance(v, np.ndarray) or np.isscalar(v) for v in arrays.values())
        if not host or self.gathers or _tape.current() is not None:
            self.last_groups = tuple((k,) for k in range(len(self.spec.parts)))
            return self.one_by_one(ns)
        steps, fills, sources = self.plan(ns, local and temps is not None)
        threads = schedule.thread_count(self.options.threads, jit.max_threads())
        for step, src in zip(steps, sources):
            if step.rows is None:
                k = step.members[0]
                ns[self.spec.defined[k]] = self.kernels[k](
                    **{n: ns[n] for n in self.spec.parts[k].reads})
                continue
            f = step.rows
            _scalars(ns, self.spec.scalars)
            for k in step.members:
                (shape, dtype, fill), name = fills[k], self.spec.defined[k]
                if name in f.local:
                    ns[name] = absent(shape, dtype)
                    continue
                if temps is None or name == self.spec.result:
                    out = memory.empty(shape, dtype)
                else:
                    out = scratch.pool.empty(shape, dtype)
                    temps.append(out)
                if fill:
                    out.fill(self.options.pad)
                ns[name] = out
            # (no column sums here: those add with `+=`, and a chain's statements are `:=`)
            bufs = {}
            if f.local:
                bufs = vjp_rows.local_buffers(f, ns, scratch.pool.empty)
                temps += bufs.values()
            jit.call(self._grad.fused_function(f), step_args.fill(src, ns, {}, bufs),
                     f.source.parallel, threads)
        self.last_groups = tuple(s.members for s in steps)
        return ns

    def one_by_one(self, ns: dict) -> dict:
        for k, p in enumerate(self.spec.parts):
            ns[p.equation.output] = self.kernels[k](**{n: ns[n] for n in p.reads})
        return ns

    def plan(self, arrays: dict, local: bool = False):
        """(steps, (shape, dtype, fill) per statement, step_args sources per step: None for a
        statement run by its own kernel) of a forward with these inputs: "rows" steps for the
        row groups, one step per other statement; `local`: temporaries that only one row
        group reads, written whole, live in blocks of rows (callers that read only the
        result).  Checks every statement's arrays as its own call would."""
        key = chain_grad.signature(arrays)
        hit = self._plans.get(key)
        if hit is None:
            hit = self._plans[key] = self._plan(arrays)
        return hit[local]

    def bindings(self, arrays: dict) -> tuple[list, dict]:
        """(each statement's binding (bind.py) for these inputs, in order; the arrays by name,
        each temporary and the result as a stand-in of its shape and dtype)."""
        values = _scalars(dict(arrays), self.spec.scalars)
        out = []
        for p, kern in zip(self.spec.parts, self.kernels):
            b = binding.bind(p.equation, kern.options, {n: values[n] for n in p.reads})
            values[p.equation.output] = standin(b.shape, b.dtype)
            out.append(b)
        return out, values

    def _plan(self, arrays: dict) -> tuple:
        spec = self.spec
        bound, values = self.bindings(arrays)
        statements, steps, fills = [], [], []
        for k, (p, kern, b) in enumerate(zip(spec.parts, self.kernels, bound)):
            eq = p.equation
            alone = (not ROWS or not self.options.fuse or kern.blas_plan is not None
                     or kern.shift_plan is not None or kern.target not in ("auto", "cpu")
                     or any(n in spec.defined for n in eq.params))
            statements.append(Statement(eq, p.text, eq.output, frozen_ranges(b.ranges)))
            steps.append(Step("blas" if alone else "loops", (k,)))
            fills.append((b.shape, b.dtype, b.fill))
        steps = vjp_rows.row_groups(steps, statements, list(self.kernels), values, {}, True,
                                    BLOCK_BYTES, SUMS_BLOCK_BYTES)
        # for callers that read only the result: temporaries no other step reads, written
        # whole, live in blocks of rows
        local = tuple(vjp_rows.localized(st, vjp_rows.block_local(st, statements, [
            spec.defined[k] for k in st.members if spec.defined[k] != spec.result
            and not fills[k][2] and fills[k][0]])) if st.rows else st for st in steps)

        def sources(st):
            return st.rows and step_args.plan(st.rows, statements, st.members,
                                              skip=st.rows.local)
        fills = tuple(fills)
        return ((steps, fills, tuple(map(sources, steps))),
                (local, fills, tuple(map(sources, local))))

    # ------------------------------------------------------------------ gradients
    def vjp(self, cotangent, /, **arrays) -> dict:
        """{input: gradient of sum(result * cotangent)} for every float input not in nograd
        (numpy arrays; torch tensors get theirs through torch autograd)."""
        if not self.options.grad:
            raise GradientError("gradients are switched off for this kernel (grad=False)",
                                self.text, None, "create the kernel without grad=False")
        self.check_inputs(arrays)
        if not all(isinstance(v, np.ndarray) or np.isscalar(v) for v in arrays.values()):
            raise ArgumentError("Chain.vjp takes numpy arrays and scalars (torch tensors get "
                                "their gradients through torch autograd)", self.text, None)
        temps: list = []
        try:
            ns = self.forward(arrays, temps)
            return self._grad.vjp(ns, np.asarray(cotangent), arrays)
        finally:
            scratch.pool.give(temps)

    @property
    def gradient_side(self) -> chain_grad.ChainGradient:
        return self._grad

    @property
    def gradient_equations(self) -> list[str]:
        """Statements, valid tullio() input, that reproduce vjp when run one by one in order
        (chain_grad.py: into zero-filled arrays named by `gradient_names`, reading the inputs,
        the temporaries and the cotangent `d<result>`; bounds of the last vjp call)."""
        return self._grad.equations()

    @property
    def gradient_names(self) -> dict:
        """{array: the name of its gradient in gradient_equations}, inputs and temporaries."""
        return self._grad.names()

    @property
    def gradient_plan(self):
        """The vjp_plan.VjpPlan the last vjp ran (its steps say which statements ran how)."""
        return self._grad.last_plan

    def __repr__(self):
        return f"kernel({self.text!r})"


def _scalars(ns: dict, names) -> dict:
    """`ns` with the chain's scalar inputs as the compiled code takes them (a 0-d array as a
    Python scalar, bind.collect's rule)."""
    for n in names:
        v = ns.get(n)
        if isinstance(v, np.ndarray) and v.ndim == 0:
            ns[n] = v.item()
    return ns

