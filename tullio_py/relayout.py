"""Reads taken as copies in another axis order, so that a statement's loops run register-blocked.

The rule.  Let `r` be the index of the output's last (contiguous) axis.  A statement whose
loops would sum a reduction index innermost -- one short sum per output element, whose
vector lanes the compiler adds across at its end -- runs several times faster in the row
form of schedule.jam_choice: `r` in the vector lanes, several values of another left index
at once, every loaded value feeding several accumulators.  That form needs every array read
along `r` to have `r` in its last axis.  So every array read with `r` (coefficient +-1) in an
axis other than its last gets that axis moved last, in a C-contiguous copy (so does an array
read along `r` in its last axis that is not C-contiguous), and the statement reads the copies.

Worked example: LocallyConnected2d's weight gradient, batch 16, 30x30 positions,

    dW[c1,i,j,c2,s,t] += dout[s,t,c2,b] * x[s+i,t+j,c1,b]

sums b (16 long, contiguous in both reads) innermost: 1.04 million sums of 16.  `t` is the
output's last index; it is axis 1 of dout and of x, so the statement reads
dout' = dout.transpose(0, 2, 3, 1) and x' = x.transpose(0, 2, 3, 1) instead:

    dW[c1,i,j,c2,s,t] += dout'[s,c2,b,t] * x'[s+i,c1,b,t+j]

and t runs in the vector lanes, b summed in registers, for several c2 at once.

When it applies (`choose`): no gathers; the output's last index a bare index; the statement
not a pure contraction that BLAS takes whole, nor a scatter; the copies small next to the work
(their elements at most an eighth of the iterations); and the moved statement then runs
register-blocked loops (not BLAS).  The sums then run in another order: the result may differ
from the statement's own loops in the last bits (as BLAS's would).  The choice depends only on
the statement and the arrays' shapes, dtypes and strides (a call signature), so one signature
always gets the same bits.  The gradient side (vjp_plan) and a Kernel's own call
(frontends/numpy) ask the same question, so a printed gradient statement run on its own
reproduces the vjp's numbers exactly.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import blas, memory
from .ir import Access, Affine, Equation, map_expr

# A copy pays when its elements are at most this fraction of the statement's iterations.
COPY_SHARE = 1 / 8


def axes(eq: Equation, rng: dict, arrays: dict) -> dict:
    """{array: axis order of its copy} for statement `eq` over ranges `rng` reading `arrays`
    (name -> array or scalar); {} where the rule of this module does not apply."""
    last = eq.lhs.indices[-1] if eq.lhs.indices else None
    if eq.gathers() or not (isinstance(last, Affine) and last.is_bare):
        return {}
    r = last.names[0]
    out: dict = {}
    for a in eq.accesses():
        v = arrays.get(a.array)
        if a.array == eq.output or not isinstance(v, np.ndarray) or v.ndim < 2:
            continue
        dims = [d for d, x in enumerate(a.indices) if r in x.names]
        if not dims:
            continue
        if len(dims) != 1 or not (isinstance(a.indices[dims[0]], Affine)
                                  and abs(a.indices[dims[0]].coef(r)) == 1):
            return {}
        order = tuple(d for d in range(v.ndim) if d != dims[0]) + tuple(dims)
        if out.setdefault(a.array, order) != order:
            return {}           # read along r in two different axes
    out = {n: o for n, o in out.items()
           if o != tuple(range(len(o))) or not arrays[n].flags.c_contiguous}
    work = 1
    for x in rng.values():
        work *= len(x)
    if not out or sum(arrays[n].size for n in out) > COPY_SHARE * work:
        return {}
    return out


def moved(eq: Equation, order: dict) -> Equation:
    """`eq` reading each array of `order` with its axes in that order (the copy's)."""
    return replace(eq, rhs=map_expr(eq.rhs, lambda n: Access(
        n.array, tuple(n.indices[d] for d in order[n.array]), n.span)
        if isinstance(n, Access) and n.array in order else n))


def copies(arrays: dict, order, run: bool = True) -> dict:
    """`arrays` with each array of `order` ((name, axes) pairs or a dict) replaced by a
    C-contiguous (and cache-line aligned) copy with its axes in that order (`run` False: a stand-in of its shape,
    for planning)."""
    out = dict(arrays)
    for n, ax in (order.items() if isinstance(order, dict) else order):
        v = out[n]
        shape = tuple(v.shape[d] for d in ax)
        if run:     # (memory.py's buffers: a new megabyte of numpy's faults its pages in)
            out[n] = memory.empty(shape, v.dtype)
            np.copyto(out[n], np.transpose(v, ax))
        else:
            out[n] = standin(shape, v.dtype)
    return out


def choose(kernel, kernel_for, arrays: dict, rng: dict, out: np.ndarray):
    """(axis orders, moved Equation) when `kernel`'s statement over `rng`, reading `arrays`
    into `out` (an array or a stand-in of its shape and dtype), should read relaid copies
    (the rule of this module); None when it runs as it stands.  `kernel_for(eq)`: the Kernel
    that runs a moved statement."""
    eq = kernel.equation
    if kernel.blas_plan is not None and blas.worth(kernel.blas_plan, rng, arrays):
        return None
    order = axes(eq, rng, arrays)
    if not order or kernel.plan_for(arrays, rng, out.dtype, out.shape)[0].scatter:
        return None
    m = moved(eq, order)
    gm, stand = kernel_for(m), copies(arrays, order, run=False)
    if gm.uses_blas(stand, rng, out) or not gm.plan_for(stand, rng, out.dtype, out.shape)[0].jam:
        return None
    return order, m


def standin(shape, dtype) -> np.ndarray:
    """A C-contiguous array of this shape and dtype backed by one element: what planning
    looks at (shape, dtype, strides) of an array a run will allocate or copy; never read."""
    dtype = np.dtype(dtype)
    strides, step = [], dtype.itemsize
    for n in reversed(tuple(shape)):
        strides.insert(0, step)
        step *= max(n, 1)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), tuple(shape), tuple(strides))
