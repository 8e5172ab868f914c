"""Where each argument of a row group's or fused nest's compiled function comes from, worked
out once per call signature: a call then fills the list by lookups alone.

A row group's function (codegen/rows.py) takes, in `f.source.args` order, its generated
constants (bounds, rows per block), the arrays and scalars its member statements read (by
their names in the statements), each member's output array, and the buffers of block-local
arrays and column sums.  Working that list out by building a dict of every candidate per call
cost about a fifth of a small chain's time outside its kernel; with the sources fixed per
signature, a call only looks values up.  Example, layer norm's forward as one row group:

    args  ('_local_mu', 'x', 'inv_n', '_start_i', ..., 'y', 'g', 'bb', 'eps', ..., '_rows')
    plan  (BUF '_local_mu', NS 'x', NS 'inv_n', CONST 0, ..., OUT 'y', NS 'g', NS 'bb',
           NS 'eps', ..., CONST 3)

The rule for each name is the one `vjp_run.Host.launch` and `Chain.forward` apply by hand:
later sources replace earlier ones (constants, then each member's reads and output in
order; a statement's own `consts` before the call's arrays), `params` win over all, a 0-d
array read is passed as its element and a 0-d output as a 1-element view.  No member reads
relaid copies (`Statement.relayout`, made per call): such a statement runs alone on its own
kernel (vjp_plan.choose, vjp_rows.row_groups), and `plan` refuses one.
"""
from __future__ import annotations

import numpy as np

from .codegen import rows as rows_mod

CONST, NS, OUT, BUF, PARAM = range(5)


def plan(f, statements, members, params=(), skip=()) -> tuple:
    """((kind, key) per argument of `f.source.args`) for Rows or Nest `f` running
    `statements[k]` for k in `members`, each writing its array under `f.outputs`' name;
    `params`: names passed from the call's parameters; `skip`: outputs with no array of
    their own (block-local: no OUT source)."""
    src: dict = {}
    if hasattr(f, "consts"):
        src.update((n, (CONST, v)) for n, v in f.consts)
    else:
        src.update((n, (CONST, v)) for n, v in (*f.bound, *f.bounds))
    for k, name in zip(members, f.outputs):
        s = statements[k]
        if s.relayout:
            raise ValueError(f"{s.text} reads relaid copies: it runs on its own kernel")
        consts = dict(s.consts)
        for n in (*s.equation.arrays, *s.equation.params):     # vjp_plan.pick's rule
            src[n] = (CONST, _element(consts[n])) if n in consts else (NS, n)
        if s.output not in skip:
            src[name] = (OUT, s.output)
    for n in getattr(f, "local", ()):
        src[rows_mod.local_arg(n)] = (BUF, rows_mod.local_arg(n))
    for n in getattr(f, "partial", ()):
        src[rows_mod.partial_arg(n)] = (BUF, rows_mod.partial_arg(n))
    params = set(params)
    return tuple((PARAM, a) if a in params else src[a] for a in f.source.args)


def _element(v):
    return v[()] if isinstance(v, np.ndarray) and v.ndim == 0 else v


def fill(sources: tuple, ns: dict, params: dict, buffers: dict) -> list:
    """The argument values of `sources` (`plan`) from the arrays and scalars by name `ns`,
    the call's `params` and the step's `buffers` by argument name."""
    out = []
    for kind, key in sources:
        if kind == NS:
            v = ns[key]
            if isinstance(v, np.ndarray) and v.ndim == 0:
                v = v[()]
        elif kind == OUT:
            v = ns[key]
            if v.ndim == 0:
                v = v.reshape(1)
        elif kind == CONST:
            v = key
        elif kind == BUF:
            v = buffers[key]
        else:
            v = params[key]
        out.append(v)
    return out
