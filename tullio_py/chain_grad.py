"""Reverse mode through a chain (chain.py): one vjp plan for all its statements.

The statements are walked from the last to the first.  A statement whose array gets a
gradient (it reads some input or temporary that does, through statements not in `nograd=`)
contributes its own gradient statements (grad.py, through its Kernel's gradient side, with the
inputs that get none held constant): they read its array's cotangent `d<out>` and add into
`d<x>` for each array x it reads -- a temporary's cotangent (read by the statements of the
statement that defines it, further down the walk) or an input's gradient.  Names are the
chain's: `d<name>` for every array, a trailing `_` where that name is taken; helper statements
and helper parameters are renamed where two statements would share one.

All of it is one vjp_plan.VjpPlan, run by vjp_run.py like a statement's own: each statement's
gradient statements are chosen as its Kernel's vjp chooses them (BLAS, one fused nest, loops),
the first statement writing an array that it covers element by element writes it with `=`
into an unzeroed array (vjp_written.overwrites: nothing added before; not with `fuse=False`,
which runs exactly the printed statements, each by its own kernel), and consecutive steps that
share a row index run as one pass over blocks of rows (vjp_rows.row_groups: the softmax's
`dz`, `de` and `dx` statements, each block's rows still in the cache for the next; a layer
norm's whole gradient, its column sums `dg`, `dbb` added per block).

`equations()` prints the statements in run order: run one by one with `tullio()` into
zero-filled `d<x>` arrays (the inputs' and the temporaries'), with the inputs, the forward's
temporaries and result and the cotangent `d<result>`, they reproduce vjp (bit for bit with
`fuse=False` and `blas=False`, as a statement's own printed gradient does).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import bind as binding, jit, memo, memory, scratch, vjp_inline, vjp_plan, vjp_rows, vjp_run
from . import vjp_written
from .gradient_kernel import learnable_scalars
from .ir import Access, Gather, Param, Wrapped, map_expr
from .vjp_plan import Array, Statement, VjpPlan, frozen_ranges, standin

# Consecutive gradient steps sharing a row index run as one pass over blocks of rows of
# about BLOCK_BYTES (chain.py says why that size), SUMS_BLOCK_BYTES for a group with column
# sums: the softmax's vjp at 4096x512 float32 on one thread took 1.9 ms grouped against
# 2.5 ms as its steps one by one (blocks of 1 MB); forward and vjp, 2.23 ms in blocks of
# 1 MB and 1.79 ms in blocks of 16 kB.
ROWS = True
# A temporary's cotangent written element by element and read once is computed where it
# is read (vjp_inline.py); False keeps every gradient statement as printed.
INLINE = True
BLOCK_BYTES = 16 << 10
SUMS_BLOCK_BYTES = 1 << 20


class ChainGradient:
    def __init__(self, chain):
        self.chain = chain
        self._plans = memo.Memo("chain.vjp_plans", 32)
        self._fused = memo.Memo("chain.fused", 64)
        self.last_plan = None
        self._last = None           # (entries, shapes) of the last vjp, for printing

    # ------------------------------------------------------------------ names
    def names(self) -> dict:
        """{array: its gradient's name}: `d<name>`, a trailing `_` while the name is taken."""
        hit = self.__dict__.get("_names")
        if hit is None:
            used = self._used()
            hit = {}
            for n in (*self.chain.spec.inputs, *self.chain.spec.defined):
                d = "d" + n
                while d in used:
                    d += "_"
                used.add(d)
                hit[n] = d
            self._names = hit
        return dict(hit)

    def _used(self) -> set:
        used = set()
        for p in self.chain.spec.parts:
            eq = p.equation
            used |= {eq.output, *eq.arrays, *eq.params, *eq.indices}
        return used

    def needs(self, arrays: dict | None) -> set:
        """The names whose gradient flows: inputs not in nograd= that are float or complex
        arrays (or 0-d such arrays read as scalars: `arrays` None, every array input), and
        the temporaries not in nograd= computed from one."""
        spec, nograd = self.chain.spec, set(self.chain.options.nograd)
        need = set()
        for n in spec.inputs:
            if n in nograd:
                continue
            if arrays is None:
                ok = n not in spec.scalars
            else:
                v = arrays[n]
                ok = (isinstance(v, np.ndarray) or hasattr(v, "dtype")) and \
                    np.dtype(v.dtype).kind in "fc" and (n not in spec.scalars or v.ndim == 0)
            if ok:
                need.add(n)
        for p in spec.parts:
            if p.equation.output not in nograd and any(r in need for r in p.reads):
                need.add(p.equation.output)
        return need

    # ------------------------------------------------------------------ planning
    def _statements(self, need: set, values: dict | None, arrays: dict | None):
        """Per differentiated statement, last first: (its Gradient, renamed helpers, renamed
        gradients as (input, dtype or None, [(statement, ranges or None)]), renamed params,
        call state or None).  `values` (None: no call, symbolic printing): the forward's
        arrays and the gradient stand-ins so far, by name; stand-ins are added to it."""
        chain, spec, dn = self.chain, self.chain.spec, self.names()
        used = self._used() | set(dn.values())
        out = []
        for k in reversed(range(len(spec.parts))):
            p = spec.parts[k]
            eq = p.equation
            if eq.output not in need or (values is not None and dn[eq.output] not in values):
                continue
            fixed = tuple(sorted(r for r in p.reads if r not in need))
            if all(r in fixed for r in p.reads):
                continue
            G = chain.statement_kernel(k, fixed).gradient_side()
            if values is None:
                d, st = G.derivation(False), None
            else:
                reads = {n: arrays[n] if n in arrays else values[n] for n in p.reads}
                collected = binding.collect(eq, reads)
                scalars = {n: v for n, v in learnable_scalars(eq, reads).items() if n in need}
                st = G.call_state(collected, values[dn[eq.output]], scalars)
                d = st.d
            amap = {d.cotangent: dn[eq.output], **{dx: dn[x] for x, dx in d.gradient_names}}
            pmap = {}
            for h in d.helpers:
                amap[h.output] = _fresh(h.output, used)
            for name, _ in d.params:
                pmap[name] = _fresh(name, used)
            helpers = [_rename(h, amap, pmap) for h in d.helpers]
            if st is None:
                grads = [(x, None, [(_rename(g, amap, pmap), None) for g in eqs])
                         for x, eqs in d.grads]
                params = {}
            else:
                grads = [(x, dt, [(_rename(g, amap, pmap), r) for g, _, r in eqs])
                         for x, dt, eqs in st.grads]
                params = {pmap[n]: v for n, v in st.params.items()}
                for x, dt, _ in grads:
                    shape = () if np.ndim(values[x]) == 0 else tuple(np.shape(values[x]))
                    old = values.get(dn[x])
                    if old is not None and old.dtype != dt:
                        dt = np.result_type(old.dtype, dt)
                    values[dn[x]] = standin(shape, dt)
            out.append((G, helpers, grads, params, st))
        return out

    def plan(self, ns: dict, cot: np.ndarray, arrays: dict, need: set):
        """(VjpPlan, kernels, ranges as dicts, params, printing entries, shapes)."""
        chain, dn = self.chain, self.names()
        fuse = chain.options.fuse
        values = dict(ns)
        values[dn[chain.spec.result]] = cot
        parts = self._statements(need, values, arrays)
        arrays_out: dict = {}
        statements, kernels, steps, entries, params = [], [], [], [], {}
        written = set()
        built = []          # per part: (its Gradient, its helpers' count, its statements)
        for G, helpers, grads, prm, st in parts:
            params.update(prm)
            rng = st.rng
            mine = []
            for h in helpers:
                dtype = vjp_plan.helper_dtype(h, {**values, **params})
                hshape = tuple(st.shapes[st.d.cotangent])   # the statement's array's shape
                values[h.output] = standin(hshape, dtype)
                arrays_out[h.output] = Array(h.output, hshape, dtype)
                mine.append(Statement(h, str(h), h.output, frozen_ranges(rng)))
                entries.append((G, h, rng, prm))
            for x, dt, eqs in grads:
                name = dn[x]
                shape, dtype = values[name].shape, values[name].dtype
                a = arrays_out.get(name)
                arrays_out[name] = (Array(name, shape, dtype, x) if a is None
                                    else replace(a, dtype=dtype))
                for g, grng in eqs:
                    entries.append((G, g, rng, prm))
                    mine.append(Statement(g, str(g), name, frozen_ranges(grng)))
            # the first statement writing an array it covers element by element: '=' into
            # an unzeroed array (the only one of this statement's writing it); fuse=False
            # runs the printed statements as they are
            for j, s in enumerate(mine):
                if j < len(helpers) or s.output in written or not fuse:
                    continue
                alone = sum(t.output == s.output for t in mine) == 1
                a, rng_s = arrays_out[s.output], vjp_plan.as_ranges(s.ranges)
                zero = vjp_written.overwrites(s.equation, rng_s, a.shape)
                if zero is None or not all(x.is_bare for x in s.equation.lhs.indices):
                    # a contraction BLAS writes whole (attention's dp, dv, dq, dk: gemms
                    # with beta 0, not zero-filled arrays added to)
                    zero = () if vjp_written.whole_blas(
                        s.equation, rng_s, G.kernel_for,
                        vjp_plan.arrays_of(s, values, params), values) else None
                if alone and zero is not None:
                    mine[j] = replace(s, equation=replace(s.equation, assign="="))
                    arrays_out[s.output] = replace(a, written=True, zero=zero)
            written |= {s.output for s in mine[len(helpers):]}
            built.append((G, len(helpers), mine))
        if fuse and INLINE:
            built = self._inlined(built, arrays_out)
        for G, n_helpers, mine in built:
            base = len(statements)
            if fuse:
                mine = mine[:n_helpers] + [vjp_plan.relaid(s, G.kernel_for, values, params)
                                           for s in mine[n_helpers:]]
            ks = [G.kernel_for(s.equation) for s in mine]
            local = vjp_plan.choose(mine, n_helpers, ks, values, params, fuse)
            steps += [replace(s, members=tuple(m + base for m in s.members)) for s in local]
            statements += mine
            kernels += ks
        if fuse and ROWS:
            steps = list(vjp_rows.row_groups(steps, statements, kernels, values, params, True,
                                             BLOCK_BYTES, SUMS_BLOCK_BYTES))
            # the cotangent of a temporary that one row group writes whole and reads (the
            # softmax's de) lives in blocks of rows: never written to memory
            inputs = set(chain.spec.inputs)
            whole = [a.name for a in arrays_out.values() if a.input not in inputs and a.written
                     and not a.zero and not a.spread and a.shape]
            steps = [vjp_rows.localized(st, vjp_rows.block_local(st, statements, whole))
                     if st.rows else st for st in steps]
            for st in steps:
                for n in st.rows.local if st.rows else ():
                    arrays_out[n] = replace(arrays_out[n], local=True)
        p = VjpPlan(dn[chain.spec.result], (), tuple(params.items()), tuple(arrays_out.values()),
                    tuple(statements), tuple(steps))
        shapes = {n: tuple(np.shape(v)) for n, v in values.items()
                  if isinstance(v, np.ndarray) or np.isscalar(v)}
        return (p, tuple(kernels), tuple(vjp_plan.as_ranges(s.ranges) for s in statements),
                params, tuple(entries), shapes)

    def _inlined(self, built: list, arrays_out: dict) -> list:
        """`built` with the cotangents of temporaries that vjp_inline.py inlines into their
        one reader gone (their writers dropped, their Arrays removed from `arrays_out`)."""
        flat = [s for _, _, mine in built for s in mine]
        temporaries = set(self.chain.spec.defined)
        candidates = {a.name for a in arrays_out.values()
                      if a.input in temporaries and a.shape and not a.spread}
        if not candidates:
            return built
        new, gone = vjp_inline.inline(flat, {a.name: a.shape for a in arrays_out.values()},
                                      {a.name: np.dtype(a.dtype) for a in arrays_out.values()},
                                      candidates)
        if not gone:
            return built
        for n in gone:
            del arrays_out[n]
        out, k = [], 0
        for G, n_helpers, mine in built:
            part = new[k:k + len(mine)]
            k += len(mine)
            kept = [s for s in part if s is not None]
            if kept:
                out.append((G, n_helpers, kept))
        return out

    # ------------------------------------------------------------------ running
    def vjp(self, ns: dict, cot: np.ndarray, arrays: dict, wanted=None) -> dict:
        """{input: gradient} from the forward's arrays `ns` (inputs, temporaries, result),
        the cotangent and the inputs as passed (0-d arrays get gradients); `wanted`: the
        inputs asked for (None: every one that has a gradient)."""
        from .errors import GradientError
        chain = self.chain
        result = ns[chain.spec.result]
        if cot.shape != np.shape(result):
            raise GradientError(f"the cotangent has shape {cot.shape}, but the chain's result "
                                f"{chain.spec.result} has shape {np.shape(result)}", chain.text)
        # (what flows, and so the plan, follows from the signature and the inputs wanted)
        key = (signature(arrays), cot.dtype.str, cot.shape, cot.strides,
               None if wanted is None else tuple(sorted(wanted)))
        hit = None if chain.gathers else self._plans.get(key)
        if hit is None:
            need = self.needs(arrays)
            if wanted is not None:
                need = self._only(need, set(wanted))
            hit = self.plan(ns, cot, arrays, need)
            # the cotangents of temporaries and helpers' arrays reach no caller: scratch
            inputs = set(chain.spec.inputs)
            hit += (need, frozenset(a.name for a in hit[0].arrays if a.input not in inputs),
                    vjp_run.step_sources(hit[0], hit[3]))
            if not chain.gathers:
                self._plans[key] = hit
        p, kernels, ranges, params, entries, shapes, need, temporary, sources = hit
        run_ns = dict(ns)
        run_ns[p.cotangent] = cot[()] if cot.ndim == 0 else cot
        record: dict = {}
        host = vjp_run.Host(kernels, ranges, params, record, self.fused_function,
                            chain.options.threads, scratch.pool, temporary, sources=sources)
        got = vjp_run.run(p, host, run_ns)
        self.last_plan, self._last = p, (entries, shapes)
        out = {}
        for n in chain.spec.inputs:
            if n not in need:
                continue
            x = np.asarray(arrays[n])
            dx = got.get(n)
            if dx is None:
                dx = memory.zeros(x.shape, x.dtype)
            if x.dtype.kind != "c" and dx.dtype.kind == "c":
                dx = dx.real
            out[n] = np.ascontiguousarray(dx.astype(x.dtype, copy=False))
        scratch.pool.give([*(run_ns[n] for n in temporary), *host.buffers])
        return out

    def _only(self, need: set, wanted: set) -> set:
        """`need` restricted to what the wanted inputs' gradients pass through."""
        flows = {n for n in need if n in wanted}
        for p in self.chain.spec.parts:
            if p.equation.output in need and any(r in flows for r in p.reads):
                flows.add(p.equation.output)
        return flows

    def fused_function(self, f):
        """The compiled function of a fused nest or a row group (the vjp's, and the forward's
        row groups: chain.py), once per compile key."""
        key = (type(f), f.key, getattr(f, "local", ()))
        fn = self._fused.get(key)
        if fn is None:
            fn = self._fused[key] = jit.load(f.source, "cpu", signature="; ".join(
                k.arguments for k in f.key))
        return fn

    # ------------------------------------------------------------------ printing
    def equations(self) -> list[str]:
        """The gradient statements in run order (module docstring)."""
        if self._last is None:
            out = []
            for G, helpers, grads, _, _ in self._statements(self.needs(None), None, None):
                out += [G.printable(h, None, None, {}) for h in helpers]
                out += [G.printable(g, None, None, {}) for _, _, eqs in grads for g, _ in eqs]
            return out
        entries, shapes = self._last
        return [G.printable(g, rng, shapes, prm) for G, g, rng, prm in entries]


def _fresh(name: str, used: set) -> str:
    while name in used:
        name += "_"
    used.add(name)
    return name


def _rename(eq, amap: dict, pmap: dict):
    """`eq` with arrays renamed by `amap` (also read as 0-d parameters) and parameters by
    `pmap`."""
    def slot(s):
        if isinstance(s, Wrapped):
            return replace(s, inner=slot(s.inner))
        if isinstance(s, Gather) and s.array in amap:
            return replace(s, array=amap[s.array])
        return s

    def access(a):
        return Access(amap.get(a.array, a.array), tuple(slot(s) for s in a.indices), a.span)

    def node(n):
        if isinstance(n, Access):
            return access(n)
        if isinstance(n, Param):
            new = pmap.get(n.name, amap.get(n.name))
            return Param(new, n.span) if new else n
        return n
    return replace(eq, lhs=access(eq.lhs), rhs=map_expr(eq.rhs, node), text="")


def signature(arrays: dict) -> tuple:
    """The call signature plans are cached by (chain.py's and the vjp's): each input's name,
    dtype, shape and strides, or a scalar's type."""
    return tuple(sorted(
        (n, v.dtype.str, v.shape, v.strides) if isinstance(v, np.ndarray)
        else (n, type(v).__name__, str(getattr(v, "dtype", ""))) for n, v in arrays.items()))
