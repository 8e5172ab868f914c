"""The plan of a vjp call: which gradient statements run how, decided once per call signature.

`Kernel.vjp` runs the helper statements (`:=` arrays the gradients read, e.g. the argmax of a
`(max)` reduction) and then the gradient statements accumulating into zeroed `d<x>` arrays,
each over the FORWARD's index ranges (gradient_kernel.py says why).  What depends only on the
shapes, dtypes and strides of a call is planned here, as frozen data (no arrays, no compiled
functions):

- `Array`: a zero-filled array the run allocates (a helper's result or a gradient), its shape
  and dtype;
- `Statement`: a helper or gradient statement, the array it writes and the ranges it iterates,
  and the reads it takes as copies in another axis order (`relaid`: so that it runs
  register-blocked);
- `Step`: how statements run: "loops" (its own kernel), "blas" (its own kernel hands the call
  to BLAS: blas.py / blas_shift.py), "fused" (several statements sharing one loop nest,
  codegen/fused.py, with the rendered source in `Nest`), or "rows" (consecutive steps that
  share a row index, run block of rows by block of rows, codegen/rows.py, in `Rows`: chosen
  by vjp_rows.py after the others);
- `VjpPlan`: all of it, in run order.

vjp_run.py runs a plan with numpy arrays, frontends/cuda_vjp.py with arrays in GPU memory.  On
the CPU the steps are chosen by the statements' kernels (`choose`); on the GPU every statement
is a "loops" step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import bind as binding, grad as grad_mod, memo, relayout, schedule, vjp_written
from .relayout import standin
from .codegen import Source, fused, range_argument
from .ir import Access, Affine, Equation, IndexValue, walk

Pairs = tuple       # ((name, value), ...): a dict as frozen, ordered data
Ranges = tuple      # ((index, start, stop, step), ...): ranges as data (range objects compare
                    # as sequences: every empty range equals every other)


def frozen_ranges(rng: dict) -> Ranges:
    return tuple((n, r.start, r.stop, r.step) for n, r in rng.items())


def as_ranges(t: Ranges) -> dict:
    """{index: range} of frozen ranges."""
    return {n: range(a, b, c) for n, a, b, c in t}


@dataclass(frozen=True)
class Array:
    """A zero-filled array of the run: a helper's result (`input` None) or a gradient."""
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    input: str | None = None        # the input whose gradient it holds
    written: bool = False           # its one statement writes each element at most once
                                    # (`=`): the run allocates it unzeroed (vjp_written.py)
    zero: tuple = ()                # ... and zeroes these boxes ((start, stop) per dimension),
                                    # the elements that statement never writes
    spread: tuple = ()              # (full shape, dims): a gradient constant along `dims`,
                                    # held without them and returned as a zero-stride view
                                    # of the full shape (`spread_dims`)
    local: bool = False             # lives in blocks of a row group (vjp_rows.block_local):
                                    # never allocated whole


@dataclass(frozen=True)
class Statement:
    equation: Equation
    text: str                       # str(equation): the key of the run's record
    output: str                     # the Array it accumulates into
    ranges: Ranges                  # the forward's index ranges (a bare left index clipped)
    relayout: Pairs = ()            # ((array, axes), ...): `equation` reads a copy of each
                                    # array with its axes in that order (`relaid`)
    consts: Pairs = ()              # ((parameter, value), ...) `equation` reads besides the
                                    # call's (vjp_written.gather_form's mask bounds)


@dataclass(frozen=True)
class Nest:
    """One loop nest running several statements (codegen/fused.py)."""
    source: Source
    key: tuple                      # the member statements' compile keys: its compile key
    outputs: tuple[str, ...]        # the nest's output argument of each member
    bound: Pairs                    # bound parameters of the members' rewrites
    ranges: Ranges                  # the (rewritten) ranges the nest iterates
    bounds: Pairs                   # its `_start_<v>` / `_stop_<v>` arguments' values


@dataclass(frozen=True)
class Rows:
    """Consecutive steps run as one loop over blocks of a row index (codegen/rows.py)."""
    source: Source
    key: tuple                      # the members' compile keys: its compile key
    outputs: tuple[str, ...]        # the function's output argument of each member statement
    consts: Pairs                   # its generated arguments' values (bounds, block rows, ...)
    local: tuple[str, ...] = ()     # arrays living in blocks (codegen/rows.py's localize)
    partial: tuple[str, ...] = ()   # column sums, added per block (codegen/rows.py's rule)


@dataclass(frozen=True)
class Step:
    kind: str                       # "loops", "blas", "fused" or "rows"
    members: tuple[int, ...]        # indices into VjpPlan.statements (one unless fused/rows)
    fused: Nest | None = None
    rows: Rows | None = None


@dataclass(frozen=True)
class VjpPlan:
    cotangent: str                  # the cotangent's name in the statements
    ranges: Ranges                  # the forward's index ranges
    params: Pairs                   # helper parameters (lengths of ranges, ...)
    arrays: tuple[Array, ...]       # allocated zeroed before the steps: helpers, then gradients
    statements: tuple[Statement, ...]   # helpers first, then gradient statements
    steps: tuple[Step, ...]         # in run order

    @property
    def gradients(self) -> tuple[Array, ...]:
        return tuple(a for a in self.arrays if a.input is not None)


# ----------------------------------------------------------------------------- planning
def plan(d, rng: dict, params: dict, values: dict, cot_shape, cot_dtype, inputs: dict,
         complex_mode: bool, kernel_for=None, fuse: bool = False) -> VjpPlan:
    """The plan of derivation `d` for one call signature.  `values`: the arrays (host or
    device, or stand-ins of their shape, dtype and strides) and scalars the statements read,
    by name; `inputs`: input -> array (or 0-d parameter) whose gradient is wanted.
    `kernel_for` (CPU): statement -> Kernel, whose BLAS and loop plans choose the steps, with
    `fuse` whether statements sharing their loops run as one nest and statements may read
    relaid copies (`relaid`); None: one "loops" step per statement."""
    values = dict(values)
    arrays, statements = [], []
    whole = frozen_ranges(rng)
    for h in d.helpers:
        dtype = helper_dtype(h, {**values, **params})
        values[h.output] = standin(cot_shape, dtype)
        arrays.append(Array(h.output, tuple(cot_shape), dtype))
        statements.append(Statement(h, str(h), h.output, whole))
    for name, gname, shape, dtype, eqs in gradient_arrays(d, rng, inputs, cot_dtype, complex_mode):
        dims = spread_dims(eqs, shape) if kernel_for is not None else ()
        if dims:        # the statement without the indices it does not read (its text kept)
            g, grng = eqs[0]
            names = [g.lhs.indices[d].names[0] for d in dims]
            small = tuple(n for d, n in enumerate(shape) if d not in dims)
            lhs = replace(g.lhs, indices=tuple(x for d, x in enumerate(g.lhs.indices)
                                               if d not in dims))
            arrays.append(Array(gname, small, dtype, name, spread=(tuple(shape), dims)))
            statements.append(Statement(replace(g, lhs=lhs), str(g), gname, frozen_ranges(
                {n: r for n, r in grng.items() if n not in names})))
            values[gname] = standin(small, dtype)
            continue
        arrays.append(Array(gname, shape, dtype, name))
        values[gname] = standin(shape, dtype)
        statements += [Statement(g, str(g), gname, frozen_ranges(grng)) for g, grng in eqs]
    if kernel_for is None:
        steps = tuple(Step("loops", (k,)) for k in range(len(statements)))
    else:
        if fuse:        # (fuse=False: each statement's own kernel, as printed)
            statements = statements[:len(d.helpers)] + [
                relaid(s, kernel_for, values, params) for s in statements[len(d.helpers):]]
        arrays, statements = vjp_written.unzeroed(arrays, statements, kernel_for, values,
                                                  params, arrays_of)
        steps = choose(statements, len(d.helpers), [kernel_for(s.equation) for s in statements],
                       values, params, fuse)
    statements = tuple(statements)
    return VjpPlan(d.cotangent, whole, tuple(params.items()), tuple(arrays), statements, steps)


def choose(statements, helpers: int, kernels: list, values: dict, params: dict,
           fuse: bool) -> tuple[Step, ...]:
    """The CPU's steps: helpers one by one; then the gradient statements their kernels hand to
    BLAS, that read relaid copies (`relaid`: register-blocked on their own), or that cannot
    share a loop nest, one by one; then the others as one fused nest
    when codegen/fused.py can render them together (else one by one)."""
    steps, loops = [], []
    for k, (s, gk) in enumerate(zip(statements, kernels)):
        arrays, rng, out = arrays_of(s, values, params), as_ranges(s.ranges), values[s.output]
        blas = gk.uses_blas(arrays, rng, out)
        # (a statement relayout.py may read through a padded copy runs alone: its kernel's
        # call makes that choice, on the call's values, as the statement printed would)
        if k >= helpers and fuse and gk.target in ("auto", "cpu") and not blas and \
                not s.relayout and not relayout.may_pad(gk, arrays, rng, out):
            loops.append((k, *gk.plan_for(arrays, rng, out.dtype, out.shape)))
        else:
            steps.append(Step("blas" if blas else "loops", (k,)))
    plans, lows = [j[1] for j in loops], [j[3] for j in loops]
    if not fused.fusable(plans, [low.ranges for low in lows]):
        return tuple(steps + [Step("loops", (j[0],)) for j in loops])
    bound = {}
    for low in lows:
        bound.update(low.bound_params)
    source, rng = fused.render(schedule.fuse(plans)), lows[0].ranges
    nest = Nest(source, tuple(j[2] for j in loops), tuple(p.equation.output for p in plans),
                tuple(bound.items()), frozen_ranges(rng),
                tuple((a, range_argument(a, rng)) for a in source.args
                      if a.startswith(("_start_", "_stop_"))))
    return tuple(steps + [Step("fused", tuple(j[0] for j in loops), nest)])


def relaid(s: Statement, kernel_for, values: dict, params: dict) -> Statement:
    """`s` reading copies of some arrays with other axis orders, when that turns its loops
    into register-blocked rows (relayout.py states the rule, on a locally connected layer's dW).  The
    local convolution's dW[p,q,i,j,c1,c2] += dout[p-i,q-j,c2,b] * x[p,q,c1,b] (b innermost, 16
    long) reads dout[p-i,q-j,b,c2] instead, and c2 runs in the vector lanes for 4 values of
    c1 at once.  The relaid statement is weighed against BLAS over strided views itself (its
    blocked loops at their own rate; a pure contraction BLAS runs whole stays with BLAS): on
    one thread the local convolution's dW as it stands went to an im2col plan (1.8 ms CPU)
    while its relaid loops take 0.73 ms.  A Kernel called on its own asks the same question
    (frontends/numpy.py), so the statement printed and run alone gives the same bits."""
    got = relayout.choose(kernel_for(s.equation), kernel_for, arrays_of(s, values, params),
                          as_ranges(s.ranges), values[s.output], pad=False)
    if got is None:
        return s
    order, moved, _ = got       # (the statement's own ranges: no rewritten gather unpadded)
    return replace(s, equation=moved, relayout=tuple(order.items()))


def arrays_of(s: Statement, ns: dict, params: dict, run: bool = False,
              threads: int | None = None) -> dict:
    """The arrays and scalars statement `s` reads (`pick`), each array it reads relaid
    (Statement.relayout) as a C-contiguous copy with its axes in that order (`run`: a real
    copy, on at most `threads` threads; else a stand-in, for planning)."""
    out = pick(s.equation, {**ns, **dict(s.consts)} if s.consts else ns, params)
    return relayout.copies(out, s.relayout, run, threads) if s.relayout else out


def gradient_arrays(d, rng: dict, inputs: dict, cot_dtype, complex_mode: bool) -> list:
    """(input, gradient array, shape, dtype, [(statement, ranges)]) per differentiable input:
    float and complex inputs only (an integer input's gradient simplified to zero)."""
    names = dict(d.gradient_names)
    out = []
    for name, eqs in d.grads:
        x = inputs[name]
        xdt = np.dtype(x.dtype)
        if xdt.kind not in "fc":
            continue
        shape = tuple(np.shape(x)) if isinstance(x, np.ndarray) else tuple(x.shape)
        out.append((name, names[name], shape, gradient_dtype(xdt, cot_dtype, complex_mode),
                    [(g, clip_bare(g, rng, shape)) for g in eqs]))
    return out


def spread_dims(eqs: list, shape) -> tuple[int, ...]:
    """The dimensions along which the one gradient statement of an array is constant: its
    left-hand side bare and distinct indices, an index there that nothing on the right reads,
    over the array's whole extent (`dx[i,j] += dmu[i] * inv_n`, the gradient of a row mean;
    `de[i,j] += dz[i]`, of a row sum).  The statement then runs without them (`dx[i] +=
    dmu[i] * inv_n`: each element gets the same single term, so the same value) and the
    gradient is that array spread along them with stride 0, as torch's own sum backward
    returns an expanded tensor: 8 MB neither written nor read at 4096x512 float32."""
    if len(eqs) != 1:
        return ()
    g, rng = eqs[0]
    lhs = g.lhs.indices
    if (g.assign != "+=" or g.reducer != "+" or g.finaliser or len(lhs) != len(shape)
            or not all(isinstance(x, Affine) and x.is_bare for x in lhs)):
        return ()
    names = [x.names[0] for x in lhs]
    if len(set(names)) != len(names):
        return ()
    used = set()
    for n in walk(g.rhs):
        if isinstance(n, Access):
            used |= {v for x in n.indices for v in x.names}
        elif isinstance(n, IndexValue):
            used.add(n.name)
    return tuple(d for d, n in enumerate(names)
                 if n not in used and rng.get(n) == range(0, shape[d]))


def spread(a: Array, v):
    """The gradient of Array `a` (`spread_dims`) from its array `v`: a zero-stride view of
    the full shape (numpy; `v` itself otherwise)."""
    if not a.spread:
        return v
    full, dims = a.spread
    view = np.expand_dims(v, dims)
    return np.lib.stride_tricks.as_strided(view, full, tuple(
        0 if d in dims else st for d, st in enumerate(view.strides)))


def absent(shape, dtype) -> np.ndarray:
    """A zero-stride array of this shape and dtype (one zero): what the arrays of a run hold
    for an array that is never allocated whole (a block-local one, vjp_rows.block_local).
    Read-only, so one per shape and dtype is kept (made again each call, it cost several
    microseconds of a softmax chain's call)."""
    key = (tuple(shape), np.dtype(dtype).str)
    a = _ABSENT.get(key)
    if a is None:
        a = _ABSENT[key] = np.broadcast_to(np.zeros((), dtype), key[0])
    return a


_ABSENT = memo.Memo("vjp_plan.absent", 256)


def pick(eq: Equation, ns: dict, params: dict) -> dict:
    """The arrays and scalar parameters a statement reads (a helper's scalar result, a 0-d
    array, is read as a parameter: it prints, and compiles, without brackets)."""
    out = {}
    for n in (*eq.arrays, *eq.params):
        v = params[n] if n in params else ns[n]
        out[n] = v[()] if isinstance(v, np.ndarray) and v.ndim == 0 else v
    return out


# ----------------------------------------------------------------------------- rules
def gradient_dtype(x, cot, complex_mode: bool) -> np.dtype:
    """The dtype a gradient accumulates in: complex for a complex input, else real (a real
    input of a complex statement takes the real part), never narrower than the input or the
    cotangent."""
    x, cot = np.dtype(x), np.dtype(cot)
    if complex_mode and x.kind == "c":
        return np.result_type(x, cot, np.complex64)
    return np.result_type(x, np.finfo(cot).dtype if cot.kind == "c" else cot)


def helper_dtype(h: Equation, values: dict) -> np.dtype:
    """The dtype of a helper statement's array: the dtype `tullio()` gives the printed helper
    (bind.result_dtype), so the printed equations run as the vjp does: real where complex
    values reach it only through abs/real/imag (the argmax helper of `(max) m[i] :=
    abs(z[i,j])`), integer positions for an argmax helper (its arrays are read only in the
    conditions of `where`).  `values`: arrays (host or device) and scalars by name."""
    return binding.result_dtype(h, values)


def reads(d, name) -> bool:
    """Whether a helper or gradient statement of derivation `d` reads array `name`."""
    return any(grad_mod.uses_array(e, name) for e in d.helpers) or any(
        grad_mod.uses_array(e, name) for _, eqs in d.grads for e in eqs)


def params_for(d, rng) -> dict:
    """The values of the derivation's helper parameters for the forward's ranges."""
    out = {}
    for name, (kind, what) in d.params:
        if kind == "len":
            out[name] = len(rng[what])
        else:   # one past the largest linear index of the reduction's tuples
            lin = rng[what[0]].stop - 1
            for n in what[1:]:
                lin = lin * len(rng[n]) + rng[n].stop - 1
            out[name] = lin + 1
    return out


def clip_bare(g: Equation, rng: dict, shape) -> dict:
    """A bare left-hand index never leaves the gradient array (it can, when the forward read
    was `pad(i, lo, hi)`: those tuples only touched the padding)."""
    out = dict(rng)
    for d, s in enumerate(g.lhs.indices):
        if isinstance(s, Affine) and s.is_bare:
            r = out[s.names[0]]
            out[s.names[0]] = range(max(r.start, 0), max(max(r.start, 0), min(r.stop, shape[d])))
    return out
