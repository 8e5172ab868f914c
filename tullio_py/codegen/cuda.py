"""Plan -> numba-cuda kernel source (target "cuda").

Expressions (expr.Expr with the "cuda" math table), guards and loop bounds (bounds.py) are
rendered by the pieces the CPU renderer uses; this module only decides which indices run on
threads and how results are combined:

- "map": no scatter, some left-hand index.  One thread per element of the left-hand indices
  (all of them are thread-safe after the shifted-LHS rewrite); the reduction loops run inside
  the thread with a register accumulator.  No atomics.
- "scatter": the left-hand side keeps a gather or a non-unit shift.  One thread per tuple of
  the left-hand indices, the reduction loops inside, then one atomic combine into the element.
- "scalar": no left-hand index (a full reduction).  The reduction indices run on threads; each
  block combines its threads' accumulators in shared memory and either adds one atomic per
  block into a scratch cell (`+`, `max`, `min` of 32/64-bit ints and floats) or writes one
  partial per block that the finishing kernel combines (other reductions and dtypes).
- "single": nothing to thread: the CPU loop nest on one thread.

Threaded indices use grid-stride loops (1-, 2- or 3-D grid, the last left-hand index on x for
coalesced writes to C-ordered outputs; a flattened 1-D grid when there are more than three), so
the partial last block needs no early return and every thread reaches `syncthreads`.  Guards
clip those loops exactly as they clip the CPU loops.  Generated names start with '_'.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import ArgumentError
from ..schedule import Plan
from .bounds import loop_bounds, loop_header
from .cpu import render_renamed
from .emit import Emitter, under
from .expr import STORE, Expr, combine, identity_code, pad_condition
from .text import pad_line, rename_plan, user_arg

# dtypes numba-cuda's atomic add/max/min accept.
ATOMIC_DTYPES = ("int32", "int64", "uint32", "uint64", "float32", "float64")
DEFAULT_BLOCK = 256
SCALAR_MAX_BLOCKS = 1024
_AXES = ("x", "y", "z")
_ATOMIC = {"+": "add", "max": "max", "min": "min"}


@dataclass(frozen=True)
class CudaSource:
    text: str
    kernels: tuple[str, ...]     # launch order; "_tullio_finish" runs on one thread
    args: tuple[str, ...]        # shared by every kernel of the source
    threaded: tuple[str, ...]    # indices on threads, outer to inner (last one on x)
    kind: str                    # "map" | "scatter" | "scalar" | "single"
    atomic: bool                 # the main kernel uses atomics
    scratch: str | None          # scalar kind: dtype of `_red` ("partials" or one atomic cell)
    partials: bool
    fastmath: bool


def _atomic(red: str, array: str, index: str, v: str, dtype) -> str:
    """Atomic combine of `v` into array[index].  CUDA's float atomic max/min ignore a NaN
    value, so a NaN is stored plainly instead (and then stays: those atomics leave a NaN
    element as it is)."""
    if red in ("max", "min") and dtype.kind == "f":
        return (f"_w = {v}\nif _w != _w:\n    {array}[{index}] = _w\nelse:\n"
                f"    cuda.atomic.{_ATOMIC[red]}({array}, {index}, _w)")
    return f"cuda.atomic.{_ATOMIC[red]}({array}, {index}, {v})"


def render(plan: Plan) -> CudaSource:
    """The CUDA kernels of `plan`; user names appear renamed (text.rename_plan), `args` and
    `threaded` are the caller's names."""
    src = _render(rename_plan(plan), plan)
    return replace(src, args=tuple(user_arg(a) for a in src.args),
                   threaded=tuple(user_arg(v) for v in src.threaded))


def _render(plan: Plan, shown: Plan) -> CudaSource:
    # The CPU nest with CUDA math: the argument order, and the whole nest for "single".
    cpu = render_renamed(plan, shown, "cuda")
    r = Expr(plan, "cuda")               # reads stay in place: registers are the GPU's cache
    eq, dtype = plan.equation, r.dtype
    left = [l for l in plan.loops if not l.reduction]
    red_loops = [l for l in plan.loops if l.reduction]
    order = {n: k for k, n in enumerate(eq.lhs_indices)}
    left.sort(key=lambda l: order.get(l.index, len(order)))
    if plan.scatter:
        kind = "scatter" if left else "single"
    elif left:
        kind = "map"
    else:
        kind = "scalar" if red_loops else "single"
    fin = r.result
    ident = identity_code(eq.reducer, dtype)
    header = [f"# {shown.equation}", f"# cuda kind: {kind}", f"_T = _np.{dtype.name}",
              *filter(None, [pad_line(plan)]), f"_DT = _np.dtype('{dtype.name}')"]
    if kind == "single":
        text = cpu.text.replace("_tullio_kernel(", "_tullio_single(", 1)
        d = text.index("\n", text.index("def _tullio_single(")) + 1
        text = text[:d] + "    if cuda.grid(1) != 0:\n        return\n" + text[d:]
        return CudaSource("\n".join(header[:2]) + "\n" + text, ("_tullio_single",), cpu.args, (),
                          kind, False, None, False, plan.fastmath)

    threaded = [l.index for l in (red_loops if kind == "scalar" else left)]
    inner = [] if kind == "scalar" else red_loops
    args = cpu.args + (("_red",) if kind == "scalar" else ())
    guards = list(plan.guards)
    value = r.rhs_without_guards()
    lhs_idx = [r.slot(s, eq.output, d) for d, s in enumerate(eq.lhs.indices)] or ["0"]
    lhs = f"{eq.output}[{', '.join(lhs_idx)}]"
    lhs_tuple = lhs_idx[0] if len(lhs_idx) == 1 else f"({', '.join(lhs_idx)})"
    out = Emitter()
    outer: set[str] = set()

    def thread_loops(lines: Emitter):
        if len(threaded) > 3:          # flattened: the last index varies fastest
            for v in threaded:
                lines.add(f"_n_{v} = max(_stop_{v} - _start_{v}, 0)")
            lines.add(f"_total = {' * '.join(f'_n_{v}' for v in threaded)}")
            lines.add("for _t in range(cuda.grid(1), _total, cuda.gridsize(1)):")
            lines.depth += 1
            lines.add("_r = _t")
            for k, v in enumerate(reversed(threaded)):
                last = k == len(threaded) - 1
                lines.add(f"{v} = _start_{v} + " + ("_r" if last else f"_r % _n_{v}"))
                if not last:
                    lines.add(f"_r = _r // _n_{v}")
            for v in threaded:
                start, stop, checks = loop_bounds(v, outer, guards)
                outer.add(v)
                if (start, stop) != (f"_start_{v}", f"_stop_{v}"):
                    lines.add(f"if not ({start} <= {v} < {stop}):\n    continue")
                for c in checks:
                    lines.add(c)
            return
        for k, v in enumerate(threaded):
            ax = _AXES[len(threaded) - 1 - k]
            start, stop, checks = loop_bounds(v, outer, guards)
            outer.add(v)
            lines.add(f"for {v} in range({start} + cuda.blockIdx.{ax} * cuda.blockDim.{ax} + "
                      f"cuda.threadIdx.{ax}, {stop}, cuda.gridDim.{ax} * cuda.blockDim.{ax}):")
            lines.depth += 1
            for c in checks:
                lines.add(c)

    def inner_loops(lines: Emitter):
        for l in inner:
            head, checks = loop_header(l.index, outer, guards)
            outer.add(l.index)
            lines.add(head)
            lines.depth += 1
            for c in checks:
                lines.add(c)

    def signature(name):
        return f"def {name}({', '.join(args)}):"

    kernels: list[str] = []
    text = "\n".join(header) + "\n"
    atomic, partials, scratch = False, False, None
    if kind == "map":
        thread_loops(out)
        if inner:
            base = out.depth
            out.add(f"_acc = {ident}")
            inner_loops(out)
            out.add(combine(eq.reducer, "_acc", value, dtype, branch=True))
            out.depth = base
            result = fin("_acc")
        else:
            result = value
        store = STORE[eq.assign]
        out.add(f"{lhs} {store} {result}")
        kernels.append("_tullio_kernel")
        text += signature("_tullio_kernel") + "\n" + out.text()
    elif kind == "scatter":
        red = "+" if eq.assign == "-=" else "*" if eq.assign == "*=" else eq.reducer
        if red not in _ATOMIC or dtype.name not in ATOMIC_DTYPES:
            raise ArgumentError(
                f"the cuda target cannot combine a scattered ({red}) reduction into {dtype} "
                "elements (no atomic operation for it)", eq.text or str(eq), eq.lhs.span,
                f"use target='cpu', or an output of dtype {', '.join(ATOMIC_DTYPES)} with a "
                "(+), (max) or (min) reduction")
        if eq.assign in (":=", "="):     # every element the statement reaches starts at identity
            init = Emitter()
            thread_loops(init)
            inner_loops(init)
            init.add(f"{lhs} = {ident}")
            outer.clear()
            kernels.append("_tullio_init")
            text += signature("_tullio_init") + "\n" + init.text()
        thread_loops(out)
        base = out.depth
        if inner:
            out.add(f"_acc = {identity_code(red, dtype)}")
            inner_loops(out)
            out.add(combine(red, "_acc", value, dtype, branch=True))
            out.depth = base
            acc = "_acc"
        else:
            acc = value
        acc = f"-({acc})" if eq.assign == "-=" else acc
        write = _atomic(red, eq.output, lhs_tuple, f"_T({acc})", dtype)
        # a left-hand pad(...) (the gradient of a padded gather) drops writes outside
        inside = pad_condition(eq.lhs, lhs_idx)
        if inside:
            write = under(inside, write)
        out.add(write)
        atomic = True
        kernels.append("_tullio_kernel")
        text += signature("_tullio_kernel") + "\n" + out.text()
    else:                                 # scalar
        red = eq.reducer
        atomic = red in _ATOMIC and dtype.name in ATOMIC_DTYPES
        partials, scratch = not atomic, dtype.name
        out.add(f"_acc = {ident}")
        base = out.depth
        thread_loops(out)
        out.add(combine(red, "_acc", value, dtype, branch=True))
        out.depth = base
        out.add("_sm = cuda.shared.array(0, _DT)\n"
                "_tid = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + "
                "cuda.blockDim.y * cuda.threadIdx.z)\n"
                "_sm[_tid] = _acc\ncuda.syncthreads()\n"
                "_s = (cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z) // 2\n"
                "while _s > 0:\n    if _tid < _s:")
        out.depth += 2
        out.add(combine(red, "_sm[_tid]", "_sm[_tid + _s]", dtype, branch=True))
        out.depth -= 1
        out.add("cuda.syncthreads()\n_s //= 2")
        out.depth -= 1
        out.add("if _tid == 0:")
        if atomic:
            out.depth += 1
            out.add(_atomic(red, "_red", "0", "_sm[0]", dtype))
            out.depth -= 1
            kernels.append("_tullio_init")
            text += (signature("_tullio_init") + "\n    if cuda.grid(1) == 0:\n"
                     f"        _red[0] = {ident}\n")
        else:
            out.add("    _red[cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + "
                    "cuda.gridDim.y * cuda.blockIdx.z)] = _sm[0]")
        kernels.append("_tullio_kernel")
        text += signature("_tullio_kernel") + "\n" + out.text()
        fin_lines = Emitter()
        fin_lines.add("if cuda.grid(1) == 0:")
        fin_lines.depth += 1
        if atomic:
            fin_lines.add("_acc = _red[0]")
        else:
            fin_lines.add(f"_acc = {ident}\nfor _b in range(_red.shape[0]):")
            fin_lines.depth += 1
            fin_lines.add(combine(red, "_acc", "_red[_b]", dtype, branch=True))
            fin_lines.depth -= 1
        store = STORE[eq.assign]
        fin_lines.add(f"{lhs} {store} {fin('_acc')}")
        kernels.append("_tullio_finish")
        text += signature("_tullio_finish") + "\n" + fin_lines.text()
    return CudaSource(text, tuple(kernels), args, tuple(threaded), kind, atomic, scratch, partials,
                      plan.fastmath)


# ----------------------------------------------------------------------------- launching
def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def block_size(threads) -> int:
    """Threads per block: `threads=N` on this target, rounded down to a power of two (the block
    reduction halves it) and kept within CUDA's 1024."""
    if isinstance(threads, bool) or not isinstance(threads, int):
        return DEFAULT_BLOCK
    n = max(1, min(int(threads), 1024))
    return 1 << (n.bit_length() - 1)


def launch_config(src: CudaSource, extents: list[int], threads=True):
    """(grid, block, shared memory bytes) of the main kernel for these threaded extents, or
    None when there is nothing to run.  Blocks are no larger than the work needs."""
    if src.kind == "single":
        return (1,), (1,), 0
    if any(n <= 0 for n in extents):
        return None
    nt = block_size(threads)
    cap = SCALAR_MAX_BLOCKS if src.kind == "scalar" else 2**31 - 1
    if len(extents) > 3:
        total = int(np.prod(extents, dtype=np.int64))
        b = min(nt, _pow2_ceil(total))
        grid, block = (min(-(-total // b), cap),), (b,)
    else:
        exts = list(reversed(extents))           # x, y, z
        block, left = [], nt
        for k, n in enumerate(exts):
            b = min(left, _pow2_ceil(n), 64 if k == 2 else 1024)
            block.append(b)
            left //= b
        limits = (2**31 - 1, 65535, 65535)
        grid = [min(-(-n // b), lim) for n, b, lim in zip(exts, block, limits)]
        budget = cap
        for k in range(len(grid)):
            grid[k] = max(1, min(grid[k], budget))
            budget = max(1, budget // grid[k])
        grid, block = tuple(grid), tuple(block)
    shmem = int(np.prod(block)) * np.dtype(src.scratch).itemsize if src.kind == "scalar" else 0
    return grid, block, shmem
