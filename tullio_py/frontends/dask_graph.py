"""The blocks of one statement lowered to dask (frontends/dask.py decides what is chunked):
the block-local statement, each block's ranges, parameters and array windows, and the graph
of tasks that cut the windows from the chunks, run the compiled loops and combine partials.

Every task calls `run_block` with a `BlockCall`: plain data (statement text, kernel options,
ranges, parameters, where each window's pieces go), so tasks pickle to dask.distributed
workers, which look the kernel up in their own cache (`kernel()` is cached per expression and
options, so a kernel compiles once per process and block sizes only change its ranges).  The
process that builds the graph files the block statement's Kernel, built from its Equation,
under that plain data (`_BLOCKS`): its tasks (dask's threaded scheduler, in-process workers)
run that Kernel; a worker process parses the text, once per process.
"""
from __future__ import annotations

import itertools
import operator
import sys
import threading
import warnings
from dataclasses import replace

import numpy as np

from .. import bind as binding
from .. import memo, ranges as ranges_mod, rewrite, schedule
from ..ir import (Access, Affine, Binary, Call, Compare, Const, Equation, Gather, IndexValue,
                  Param, Unary, Wrapped)

_LOCK = threading.Lock()     # compiling a block kernel: one thread at a time
SPLIT_EVERY = 8              # partial results combined per node of the reduction tree


def reads(eq: Equation) -> list[tuple[str, tuple]]:
    """(array, slots) of every read: right-hand accesses and the gathers' index arrays."""
    out = []
    for acc in eq.accesses():
        out.append((acc.array, acc.indices))
    for g in eq.gathers():
        out.append((g.array, g.indices))
    return list(dict.fromkeys(out))


def post_order(e, f):
    """Rebuild an expression bottom-up, f applied to each node after its children (the nodes
    f returns are not visited again)."""
    if isinstance(e, Unary):
        e = Unary(e.op, post_order(e.operand, f))
    elif isinstance(e, Binary):
        e = Binary(e.op, post_order(e.left, f), post_order(e.right, f))
    elif isinstance(e, Compare):
        e = Compare(e.ops, tuple(post_order(x, f) for x in e.operands))
    elif isinstance(e, Call):
        e = Call(e.func, tuple(post_order(x, f) for x in e.args), e.span)
    return f(e)


class BlockCall:
    """What one task runs (plain data)."""

    def __init__(self, text, indices, options, ranges, params, args, out):
        self.text, self.options, self.ranges, self.params = text, options, ranges, params
        self.indices = indices  # the statement's indices read only as values (for parse)
        self.args = args        # [(name, shape, dtype, [dst slices per piece])]
        self.out = out          # (shape, dtype, init, fill value, [dst slices]) ; init: "empty",
                                # "fill" or "copy" (pieces of the old value follow the args)


def _identity(reducer: str, dtype: np.dtype):
    if reducer == "+":
        return 0
    if reducer == "*":
        return 1
    if dtype.kind == "f":
        return -np.inf if reducer == "max" else np.inf
    if dtype.kind == "b":
        return reducer == "min"
    info = np.iinfo(dtype)
    return info.min if reducer == "max" else info.max


def slot_affine(s):
    """(affine, is pad) of a slot read through a window, or None for a whole dimension."""
    if isinstance(s, Affine):
        return s, False
    if isinstance(s, Wrapped) and s.kind == "pad" and isinstance(s.inner, Affine):
        return s.inner, True
    return None


class Blocks:
    def __init__(self, work: Equation, values, params, rng, out_shape, dtype, old, opts, plan,
                 fresh):
        self.eq, self.values, self.params, self.rng = work, values, params, rng
        self.out_shape, self.dtype, self.old, self.opts, self.plan = out_shape, dtype, old, opts, plan
        ch = plan.chunked
        lmax = {n: max(hi - o for o, lo, hi, _ in plan.blocks[n]) for n in ch}
        self.offsets = {n: fresh("o_" + n) for n in ch}
        self.pad_param = fresh("padv")
        # Group the reads of each array by which chunked indices step through which dimension:
        # a group shares one window (one argument); each read keeps its own constants.
        groups: dict = {}
        self.read_map: dict = {}
        for array, slots in reads(work):
            sig, ks = [], []
            for s in slots:
                a = slot_affine(s)
                if a is None:
                    sig.append(None)
                    ks.append(0)
                    continue
                aff = a[0]
                sig.append(tuple(sorted((n, c) for n, c in aff.terms if n in ch)))
                k = aff.const
                for n, c in aff.terms:
                    if n in ch:
                        k += min(0, c * (lmax[n] - 1))
                    elif len(rng[n]):
                        k += min(c * rng[n].start, c * (rng[n].stop - 1))
                ks.append(k)
            key = (array, tuple(sig))
            g = groups.get(key)
            if g is None:
                arg = array if not any(k[0] == array for k in groups) else fresh(array)
                g = groups[key] = dict(arg=arg, src=array, sig=sig, K=list(ks), members=[])
            g["K"] = [min(a, b) for a, b in zip(g["K"], ks)]
            g["members"].append(slots)
            self.read_map[(array, slots)] = g
        self.groups = list(groups.values())
        for g in self.groups:
            ndim = len(g["sig"])
            g["st"] = [fresh(f"st_{g['arg']}_{d}") for d in range(ndim)]
            g["N"] = [fresh(f"n_{g['arg']}_{d}") for d in range(ndim)]
            g["local"] = [[] for _ in range(ndim)]
            for slots in g["members"]:
                for d, s in enumerate(slots):
                    a = slot_affine(s)
                    if a is not None:
                        g["local"][d].append(replace(a[0], const=a[0].const - g["K"][d]))
        self.guarded = schedule.find_guards(work, opts["pad"])[1]

    # ------------------------------------------------------------------ the block statement
    def _slots(self, array, slots):
        g = self.read_map[(array, slots)]
        out = []
        for d, s in enumerate(slots):
            a = slot_affine(s)
            if a is not None:
                new = replace(a[0], const=a[0].const - g["K"][d])
                out.append(Wrapped("pad", new, s.lo, s.hi, s.span) if a[1] else new)
            else:
                out.append(self._whole(s))
        return g, tuple(out)

    def _whole(self, s):
        inner = s.inner if isinstance(s, Wrapped) else s
        if isinstance(inner, Gather):
            g, slots = self._slots(inner.array, inner.indices)
            inner = Gather(g["arg"], slots, inner.offset, inner.span)
            return Wrapped(s.kind, inner, s.lo, s.hi, s.span) if isinstance(s, Wrapped) else inner
        return s

    def statement(self, partial: str | None) -> Equation:
        """The block-local statement; `partial`: the name of a partial result (its reducer's
        in-place form), else the statement's own assignment and finaliser."""
        eq, masks = self.eq, []
        offsets = self.offsets

        def local(node):
            if isinstance(node, IndexValue) and node.name in offsets:
                return Binary("+", node, Param(offsets[node.name]))
            if not isinstance(node, Access):
                return node
            g, slots = self._slots(node.array, node.indices)
            new = Access(g["arg"], slots, node.span)
            conds = [Compare(("<=", "<"), (Const(0), Binary("+", rewrite.affine_expr(s.inner),
                                                             Param(g["st"][d])),
                                           Param(g["N"][d])))
                     for d, s in enumerate(slots) if isinstance(s, Wrapped) and s.kind == "pad"
                     and isinstance(s.inner, Affine)]
            if str(node) in self.guarded:
                masks.extend(conds)
                return new
            for c in conds:
                new = Call("where", (c, new, Param(self.pad_param)))
            return new

        rhs = post_order(eq.rhs, local)
        for m in masks:
            rhs = Binary("*", rhs, m)
        lhs = Access(partial or eq.output, tuple(self._whole(s) for s in eq.lhs.indices),
                     eq.lhs.span)
        if partial is None:
            return Equation(lhs, eq.assign, rhs, eq.reduction, eq.finaliser)
        if eq.reducer in ("+", "*"):
            return Equation(lhs, eq.reducer + "=", rhs)
        return Equation(lhs, "=", rhs, eq.reducer)

    def _options(self) -> tuple:
        return tuple(sorted(self.opts.items()))

    # ------------------------------------------------------------------ one block
    def _call(self, text, indices, options, origin: dict, out):
        """(BlockCall, [(dask array, window start, window stop)]) of one block."""
        ch = self.plan.chunked
        rng = {n: (range(origin[n][1] - origin[n][0], origin[n][2] - origin[n][0]) if n in ch
                   else self.rng[n]) for n in self.eq.indices}
        iv = {n: (r.start, r.stop) for n, r in rng.items()}
        params = dict(self.params)
        params.update({self.offsets[n]: origin[n][0] for n in ch})
        params[self.pad_param] = self.opts["pad"]
        windows = []
        for g in self.groups:
            src = self.values[g["src"]]
            start, stop = [], []
            for d, sig in enumerate(g["sig"]):
                params[g["N"][d]] = src.shape[d]
                if sig is None:
                    s0, s1 = 0, src.shape[d]
                else:
                    s0 = g["K"][d] + sum(c * origin[n][0] for n, c in sig)
                    b = [ranges_mod.affine_bounds(a, iv) for a in g["local"][d]]
                    s1 = s0 + max([x[1] + 1 for x in b if x is not None] or [0])
                params[g["st"][d]] = s0
                start.append(s0)
                stop.append(s1)
            windows.append((src, start, stop))
        return (BlockCall(text, indices, options, tuple((n, r.start, r.stop) for n, r in rng.items()),
                          params, [g["arg"] for g in self.groups], out), windows)

    def _layer(self, name, partial: str | None):
        """{key: task} of every block, the dask arrays they read, and the output chunks."""
        eq = self.statement(partial)
        text, indices, options = str(eq), eq.value_indices, self._options()
        block_kernel = _block_kernel(eq, text, options)     # checked once, here
        lhs, plan = self.eq.lhs.indices, self.plan
        dims = []
        for d, s in enumerate(lhs):
            n = s.names[0] if isinstance(s, Affine) and s.is_bare else None
            dims.append(n if n in plan.out_idx else None)
        out_lists = [list(enumerate(plan.blocks[n])) if n else [(0, None)] for n in dims]
        red_lists = [list(enumerate(plan.blocks[n])) for n in plan.red_idx] if partial else []
        layer, deps, results = {}, {}, {}
        for ob in itertools.product(*out_lists):
            bidx = tuple(i for i, _ in ob)
            shape = tuple(b[3] if b else self.out_shape[d] for d, (_, b) in enumerate(ob))
            corner = [b[0] if b else 0 for _, b in ob]
            origin = {n: b for n, (_, b) in zip(dims, ob) if n}
            keys = []
            for rb in itertools.product(*red_lists):
                o = dict(origin)
                o.update({n: b for n, (_, b) in zip(plan.red_idx, rb)})
                rflat = tuple(i for i, _ in rb)
                if partial:
                    init = ("fill", _identity(self.eq.reducer, self.dtype))
                elif self.old is not None:
                    init = ("copy", None)
                else:
                    init = ("fill" if binding.needs_fill(block_kernel.equation) else "empty",
                            self.opts["pad"])
                out = (shape, self.dtype.str, init[0], init[1])
                call, windows = self._call(text, indices, options, o, out)
                if init[0] == "copy":
                    windows.append((self.old, corner, [c + s for c, s in zip(corner, shape)]))
                key = (name, *bidx, *rflat)
                task = [run_block, call]
                pieces = []
                for w, (arr, start, stop) in enumerate(windows):
                    deps[arr.name] = arr
                    placed = []
                    for j, (src_key, src_sl, dst_sl, whole) in enumerate(_pieces(arr, start, stop)):
                        if whole:
                            task.append(src_key)
                        else:
                            pk = (name + "-piece", *bidx, *rflat, w, j)
                            layer[pk] = (operator.getitem, src_key, src_sl)
                            task.append(pk)
                        placed.append(dst_sl)
                    pieces.append((tuple(b - a for a, b in zip(start, stop)),
                                   arr.dtype.str, placed))
                call.pieces = pieces
                layer[key] = tuple(task)
                keys.append(key)
            results[bidx] = keys
        chunks = tuple(tuple(b[3] for b in plan.blocks[n]) if n else (self.out_shape[d],)
                       for d, n in enumerate(dims))
        return layer, list(deps.values()), results, chunks

    def _array(self, name, layer, deps, chunks):
        from dask.highlevelgraph import HighLevelGraph
        import dask.array as da
        hg = HighLevelGraph.from_collections(name, layer, dependencies=deps)
        return da.Array(hg, name, chunks, meta=np.empty((0,) * len(chunks), self.dtype))

    def _token(self, kind):
        from dask.base import tokenize
        return f"tullio-{kind}-" + tokenize(str(self.eq), self.out_shape, self.dtype.str,
                                            sorted((n, v.name) for n, v in self.values.items()),
                                            None if self.old is None else self.old.name,
                                            sorted(self.params.items(), key=str),
                                            sorted((n, r.start, r.stop) for n, r in self.rng.items()),
                                            sorted(self.opts.items(), key=str))

    def direct(self):
        name = self._token("block")
        layer, deps, _, chunks = self._layer(name, None)
        return self._array(name, layer, deps, chunks)

    def partials(self):
        """The combined partial results R (output chunks): a tree of the reducer per block."""
        name = self._token("partial")
        pname = name + "-p"
        layer, deps, results, chunks = self._layer(pname, self.eq.output)
        for bidx, keys in results.items():
            level = 0
            while len(keys) > 1:
                nxt = []
                for g in range(0, len(keys), SPLIT_EVERY):
                    part = keys[g:g + SPLIT_EVERY]
                    if len(part) == 1:
                        nxt.append(part[0])
                        continue
                    k = (name + "-tree", *bidx, level, g)
                    layer[k] = (combine, self.eq.reducer, *part)
                    nxt.append(k)
                keys, level = nxt, level + 1
            layer[(name, *bidx)] = (combine, self.eq.reducer, keys[0])
        return self._array(name, layer, deps, chunks)


def _pieces(arr, start, stop):
    """(source chunk key, slices within it, slices within the window, whole chunk?) of every
    chunk of `arr` overlapping the window [start, stop) (clipped to the array)."""
    per_dim = []
    for d, (s, e) in enumerate(zip(start, stop)):
        lo, hi = max(s, 0), min(e, arr.shape[d])
        edges = [0] + list(itertools.accumulate(arr.chunks[d]))
        opts = []
        for c in range(len(arr.chunks[d])):
            a, b = max(lo, edges[c]), min(hi, edges[c + 1])
            if b > a:
                opts.append((c, slice(a - edges[c], b - edges[c]), slice(a - s, b - s),
                             a == edges[c] and b == edges[c + 1]))
        if not opts:
            return []
        per_dim.append(opts)
    out = []
    for combo in itertools.product(*per_dim):
        key = (arr.name, *[c[0] for c in combo])
        out.append((key, tuple(c[1] for c in combo), tuple(c[2] for c in combo),
                    all(c[3] for c in combo)))
    return out


def combine(reducer, *parts):
    f = {"+": np.add, "*": np.multiply, "max": np.maximum, "min": np.minimum}[reducer]
    out = np.array(parts[0], copy=True)
    for p in parts[1:]:
        f(out, p, out=out)
    return out


# ----------------------------------------------------------------------------- in the task
# Block statement (text, value-only indices, options) -> its Kernel.  Tasks carry the text, as
# plain data, because dask.distributed pickles them to worker processes that hold no Kernel
# objects; in the process that built the graph the Kernel made from the block's Equation is
# found here, so nothing is printed and parsed again.
_BLOCKS = memo.Memo("dask_graph.blocks", 256)


def _block_kernel(eq: Equation, text: str, options: tuple):
    """The Kernel of a block statement, built from its Equation, filed for its tasks."""
    k = _BLOCKS.get((text, eq.value_indices, options))
    if k is None:
        k = _BLOCKS[(text, eq.value_indices, options)] = _kernel(eq, options)
    return k


def _task_kernel(call: "BlockCall"):
    """The Kernel a task runs: the one filed when its graph was built, else (a worker process)
    the text parsed with the statement's value-only indices; threads capped by the worker's."""
    key = (call.text, call.indices, _capped(call.options))
    k = _BLOCKS.get(key)
    if k is None:
        from ..parse import parse
        k = _BLOCKS[key] = _kernel(parse(call.text, call.indices), key[2])
    return k


def _capped(options: tuple) -> tuple:
    """The options with an explicit thread count capped by a dask.distributed worker's."""
    opts = dict(options)
    t = opts.get("threads")
    if isinstance(t, int) and not isinstance(t, bool) and t > 1 and _worker_threads():
        opts["threads"] = min(t, _worker_threads())
    return tuple(sorted(opts.items()))


def _kernel(statement, options: tuple):
    """kernel(statement, **options) (text or Equation), threads capped by the worker's."""
    from ..factory import kernel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kernel(statement, **dict(_capped(options)))


def _worker_threads():
    """The thread count of the dask.distributed worker running this task, else None."""
    dist = sys.modules.get("distributed")
    if dist is None:
        return None
    try:
        return dist.get_worker().state.nthreads
    except (ValueError, AttributeError):
        return None


def _assemble(shape, dtype, placed, pieces):
    if len(placed) == 1 and all(sl.start == 0 and sl.stop == n for sl, n in zip(placed[0], shape)):
        return np.ascontiguousarray(pieces[0])
    a = np.zeros(shape, dtype)
    for sl, p in zip(placed, pieces):
        a[sl] = p
    return a


def run_block(call: BlockCall, *data):
    """One block: assemble the windows, run the block statement's kernel on its ranges."""
    k = _task_kernel(call)
    arrays, pos = {}, 0
    assembled = []
    for shape, dtype, placed in call.pieces:
        assembled.append(_assemble(shape, np.dtype(dtype), placed, data[pos:pos + len(placed)]))
        pos += len(placed)
    for name, a in zip(call.args, assembled):
        arrays[name] = a
    shape, dtype, init, fill = call.out
    if init == "copy":
        out = np.array(assembled[-1], dtype=dtype, copy=True)
    elif init == "fill":
        out = np.full(shape, fill, dtype)
    else:
        out = np.empty(shape, dtype)
    rng = {n: range(a, b) for n, a, b in call.ranges}
    if not k.uses_blas(arrays, rng, out):
        with _LOCK:         # compiles at most once per signature, whatever the thread count
            k.prepare(arrays, rng, out.dtype, out.shape)
    k.run_with_ranges(arrays, rng, out, call.params)
    return out
