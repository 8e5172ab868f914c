"""A convolution's input gradient in gather form over a zero-padded im2col copy.

`dx[b,c,h+i,v+j] += dy[b,o,h,v] * w[o,c,i,j]` (the statement a conv2d's vjp runs) writes
each element of dx from several (h, i) pairs.  blas_shift.py's plans either loop over the
shift indices (a product per (i, j), each added into a shifted window of dx through a new
block: the window's rows are not one block of memory) or add a product's values into dx
one shift at a time (col2im).  Read the other way, dx[b,c,p,q] is the sum over (o, i, j) of
w[o,c,i,j] * dy[b,o,p-i,q-j], dy taken as 0 outside its array: one gemm per batch element,
dx[b] = W @ col[b], where col[b][(o,i,j), (p,q)] = dy[b,o,p-i,q-j] holds dy's values shifted
into each (i, j) row block and zeros around them.  The copy into col is one strided view of
the buffer per step (its (i, h) axes at stride col(i) + col(p), so each row block's values
land at p = h + i); the zeros around them are the same for every step, written once per
call.  A few batch elements per step share one batched gemm, as many as keep col in the
cache; the product is added into dx in place (beta 1, through the frontend's gemm where it
has one: torch's, on its pool), stored straight in dx's own layout.

Taken where the output has dimensions `d + k` (coefficient 1 each, no constant) with `d`
read by one operand (the data: dy) and `k` by the other (the kernel: w), every read index
bare, one batch index at most (a left index of the data alone), `+=` or `-=`, every range
of step 1, and the output's kernel-only indices and its `d + k` positions each merging into
one matrix dimension of it.  The cost model of blas_shift_cost.py prices the plan
(`cost`) against blas_shift.py's own; the cheaper runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import blas_shift_cost as model
from . import blas_threads, memory
from .blas_shift_cost import blasable, c_order, chain, prod


@dataclass(frozen=True)
class GatherPlan:
    data: int             # which read is the data (dy); the other is the kernel (w)
    batch: tuple          # the batch index (looped, `group` per step) or ()
    fk: tuple             # the output's kernel-only indices (the gemm's M), output order
    red: tuple            # indices summed over, read by both (o)
    pairs: tuple          # (data index, kernel index, output dimension) per `d + k` dim
    tmajor: bool          # col's axes (positions, kernel, summed) (else summed, kernel, positions)
    group: int            # batch elements per step
    rng: tuple            # (index, start, stop) of every index
    cost: float           # the model's seconds
    steps: tuple = ()     # (number of steps,) or ()
    res_shape: tuple = ()  # one step's product: (group, M, N)

    im2col = True         # (what explain and callers read from blas_shift's Plan)
    scatter = ()
    write = False
    direct = True
    gather = True

    @property
    def loop(self):
        return self.batch

    @property
    def split(self):        # steps write their own elements: they may share threads
        return 1 if self.batch else 0


def form(eq, reads):
    """(data read, batch, fk, red, pairs) of a statement this plan takes, else None."""
    if eq.assign not in ("+=", "-="):
        return None
    if not all(s.is_bare for a in reads for s in a.indices):
        return None
    names = [tuple(s.names[0] for s in a.indices) for a in reads]
    if any(len(set(n)) != len(n) for n in names):
        return None
    comp, bare = [], []
    for dim, s in enumerate(eq.lhs.indices):
        if s.is_bare:
            bare.append(s.names[0])
        elif s.const == 0 and len(s.terms) == 2 and all(c == 1 for _, c in s.terms):
            comp.append((dim, *s.names))
        else:
            return None
    lhs = bare + [n for _, a, b in comp for n in (a, b)]
    if not comp or len(set(lhs)) != len(lhs):
        return None
    for data in (0, 1):
        dset, kset = set(names[data]), set(names[1 - data])
        pairs = []
        for dim, a, b in comp:
            for d, k in ((a, b), (b, a)):
                if d in dset and d not in kset and k in kset and k not in dset:
                    pairs.append((d, k, dim))
                    break
        if len(pairs) != len(comp) or any(n in dset and n in kset for n in bare):
            continue
        batch = tuple(n for n in bare if n in dset)
        fk = tuple(n for n in bare if n in kset)
        red = tuple(n for n in names[data] if n in kset)
        if len(batch) > 1 or dset != set(batch) | set(red) | {p[0] for p in pairs} or \
                kset != set(fk) | set(red) | {p[1] for p in pairs}:
            continue
        return data, batch, fk, red, tuple(pairs)
    return None


def plan(eq, reads, arrays, rng, out_shape, out_strides, dtype,
         pool=0, slow=1.0) -> GatherPlan | None:
    """The gather plan of this call, priced by the model, or None where it does not apply
    (`pool`, `slow`: as for blas_shift_cost.cost)."""
    f = form(eq, reads)
    if f is None:
        return None
    data, batch, fk, red, pairs = f
    if any(rng[n].step != 1 for n in eq.indices):
        return None
    darr, karr = arrays[reads[data].array], arrays[reads[1 - data].array]
    if darr.dtype != dtype or karr.dtype != dtype:
        return None
    size = {n: len(rng[n]) for n in eq.indices}
    ost = {}
    for dim, s in enumerate(eq.lhs.indices):
        if s.is_bare:
            ost[s.names[0]] = out_strides[dim]
    tn = [f"_t{dim}" for _, _, dim in pairs]            # the positions' axes
    for (d, k, dim), t in zip(pairs, tn):
        size[t] = size[d] + size[k] - 1
        ost[t] = out_strides[dim]
    item = np.dtype(dtype).itemsize
    if not (chain(list(fk), size, ost) and chain(tn, size, ost) and
            blasable(list(fk), tn, ost, item)):
        return None
    # col's innermost axis is the data's own: its positions, or the summed indices
    dst = {reads[data].indices[a].names[0]: st for a, st in enumerate(darr.strides)}
    inner = min(dst, key=lambda n: abs(dst[n]) if size[n] > 1 else 1 << 62)
    tmajor = inner in red
    m, n = prod(size[x] for x in fk), prod(size[t] for t in tn)
    kk = prod(size[x] for x in red) * prod(size[k] for _, k, _ in pairs)
    nb = prod(size[x] for x in batch)
    colb = kk * n * item
    group = max(1, min(nb, model.CACHE // max(colb, 1)))
    steps = -(-nb // group)
    # one step: the copy of the data's values (first read from memory, the other kernel
    # positions from the cache; a cache line per run of its innermost axis), the gemm, and
    # (numpy's matmul has no beta) the product added into the output
    valid = group * prod(size[x] for x in red) * prod(size[k] * size[d] for d, k, _ in pairs)
    run = size[inner] if inner in red or inner in {d for d, _, _ in pairs} else 1
    copy = (group * prod(size[x] for x in red) * prod(size[d] for d, _, _ in pairs) * item
            / model.BW + valid * (item + model.LINE / max(run, 1)) / model.BW_CACHE)
    gemm = group * (model.T_CALL + 2.0 * m * n * kk / model.PEAK *
                    (1 + model.H / m + model.H / n + model.H / kk))
    zero = group * colb / model.BW
    if pool:
        gemm *= slow
        regions = 1 + (valid >= model.GRAIN)
        waits = regions * model.T_REGION if pool > 1 else 0
        cost = zero / pool + steps * (model.T_STEP + 2 * model.T_POOL + waits
                                      + (copy + gemm) / pool)
    else:
        add = 3 * group * m * n * item / model.BW_CACHE
        cost = zero + steps * (model.T_STEP + copy + gemm + add)
    return GatherPlan(data, batch, fk, red, pairs, tmajor, group,
                      tuple((x, rng[x].start, rng[x].stop) for x in eq.indices), cost,
                      (steps,) if batch else (), (group, m, n))


def run(p: GatherPlan, sh, arrays: dict, out: np.ndarray, groups: int = 1,
        threads: int | None = None, gemm=None, copy=None):
    """Add the statement into `out` (`-=`: subtract).  Under a frontend's gemm (`gemm`,
    `copy`) every step runs in order on this thread; else with `groups` > 1 the batch's
    steps are cut into that many groups (each its own buffer: they write their own output
    elements), shared by `threads` threads (blas_threads.py)."""
    reads = sh.reads
    start = {n: a for n, a, _ in p.rng}
    size = {n: b - a for n, a, b in p.rng}
    dacc, kacc = reads[p.data], reads[1 - p.data]
    darr, karr = arrays[dacc.array], arrays[kacc.array]
    ks = tuple(k for _, k, _ in p.pairs)
    ds = tuple(d for d, _, _ in p.pairs)
    # the kernel as a matrix (M, summed and kernel indices in col's order), scaled
    korder = p.fk + ((ks + p.red) if p.tmajor else (p.red + ks))
    kn = [s.names[0] for s in kacc.indices]
    kv = karr[tuple(slice(start[x], start[x] + size[x]) for x in kn)]
    kv = kv.transpose([kn.index(x) for x in korder])
    scale = sh.factor(arrays)
    m, g, n = p.res_shape[1], p.group, p.res_shape[2]
    kmat = np.multiply(kv, scale, dtype=out.dtype, casting="unsafe").reshape(m, -1)
    # col's axes and their element strides; the copy's destination (batch, summed, kernel,
    # data) and source views
    tsz = [size[d] + size[k] - 1 for d, k, _ in p.pairs]
    rsz = [size[x] for x in p.red]
    ksz = [size[k] for k in ks]
    body = (tsz + ksz + rsz) if p.tmajor else (rsz + ksz + tsz)
    cst = c_order(body)
    nr, nk = len(rsz), len(ksz)
    if p.tmajor:
        tst, kst, rst = cst[:len(tsz)], cst[len(tsz):len(tsz) + nk], cst[len(tsz) + nk:]
    else:
        rst, kst, tst = cst[:nr], cst[nr:nr + nk], cst[nr + nk:]
    item = out.itemsize
    whole = prod(body)
    dshape = tuple(rsz + ksz + [size[d] for d in ds])
    dstr = tuple(item * s for s in rst + [a + b for a, b in zip(kst, tst)] + tst)
    dn = [s.names[0] for s in dacc.indices]
    dorg = darr[tuple(slice(start[x], start[x] + 1) for x in dn)]
    dstride = dict(zip(dn, darr.strides))
    sstr = tuple([dstride[x] for x in p.red] + [0] * nk + [dstride[d] for d in ds])
    bstr = dstride[p.batch[0]] if p.batch else 0
    # the output's view: (batch, M axes, positions) as (batch, M, N)
    lhs = sh.eq.lhs.indices
    dim_of = {s.names[0]: dim for dim, s in enumerate(lhs) if s.is_bare}
    oorg = out[tuple(slice(start[s.names[0]], start[s.names[0]] + 1) if s.is_bare else
                     slice(sum(start[x] for x in s.names), sum(start[x] for x in s.names) + 1)
                     for s in lhs)]
    mst = out.strides[dim_of[p.fk[-1]]] if p.fk else item
    nst = out.strides[p.pairs[-1][2]]
    obst = out.strides[dim_of[p.batch[0]]] if p.batch else 0
    nb = size[p.batch[0]] if p.batch else 1
    tm = p.tmajor
    dmaster = as_strided(dorg, (nb,) + dshape, (bstr,) + sstr,
                         writeable=dorg.flags.writeable)
    omaster = as_strided(oorg, (nb, m, n), (obst, mst, nst), writeable=True)

    def steps(lo, hi):
        col = memory.zeros((g, whole), out.dtype)      # its zeros stay: each step rewrites the rest
        for b0 in range(lo, hi, g):
            gg = min(g, hi - b0)
            dest = as_strided(col, (gg,) + dshape, (col.strides[0],) + dstr, writeable=True)
            src = dmaster[b0:b0 + gg]
            if copy is None or not copy(dest, src):
                np.copyto(dest, src)
            cm = col[:gg].reshape(gg, n, -1).swapaxes(-1, -2) if tm else \
                col[:gg].reshape(gg, -1, n)
            o = omaster[b0:b0 + gg]
            if gemm is not None and gemm(kmat, cm, o, 1, 1):
                continue
            if o.strides[-2] == item and o.strides[-1] != item:
                np.add(o.swapaxes(-1, -2), np.matmul(cm.swapaxes(-1, -2), kmat.T),
                       out=o.swapaxes(-1, -2))
            else:
                np.add(o, np.matmul(kmat, cm), out=o)

    if gemm is not None or not p.batch:
        steps(0, nb)
        return out
    k = min(groups, -(-nb // g)) if blas_threads.available() else 1
    if k < 2:
        steps(0, nb)
        return out
    blocks = -(-nb // g)
    cut = [g * (blocks * j // k) for j in range(k)] + [nb]
    blas_threads.run([lambda a=a, b=b: steps(a, b) for a, b in pairwise(cut)],
                     None if threads is None else max(1, min(k, threads)))
    return out
