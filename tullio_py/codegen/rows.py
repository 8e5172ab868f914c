"""Consecutive statements that share a row index, run as one loop over blocks of rows.

Statements run one after the other each stream their arrays through memory: the softmax's
`(max) m[i] := x[i,j]`, `e[i,j] := exp(x[i,j] - m[i])`, `z[i] := e[i,j]`,
`y[i,j] := e[i,j] / z[i]` make four passes over 8 MB arrays at 4096x512 float32.  Run as
one parallel loop over blocks of rows i, whose body runs each statement over that block in
turn, the block's rows are still in the cache when the next statement reads them.

The rule (`row_index`), for statements S1..Sn run in this order and an index r:
- r is bare (no shift, stride or wrapper) in one position of every statement's left-hand
  side, which has no gather nor wrapper anywhere: the tuples with r in a block write only
  elements whose coordinate there is in that block;
- every statement iterates r over the same range;
- every access (left or right) of an array that some statement of the group writes has r
  bare in the position where the statements write it (the same for every statement writing
  it), and no gather reads such an array.  So once Sk ran over a block, the rows of its
  output in that block hold their final values; a later statement reads only those rows
  (read after write), an earlier one read them before Sk wrote them (write after read), and
  two writers of an array write it in statement order (write after write) -- each row
  sees exactly the order of the statements run one by one, and blocks share no element,
  so they may run on different threads;
- except column sums: a statement that lacks r on its left-hand side and adds to it (`+=`)
  while r runs, whose array no statement of the group reads and every writer of which is
  such a statement (a layer norm gradient's `dg[j] += dy[i,j] * xhat[i,j]` beside
  `dx[i,j] += ...`).  Each block adds into a zeroed partial array of its own, and after the
  blocks the partials are added to the array in block order: the result depends on the
  block size (the shapes), never on the threads, and differs from the statement run alone in
  the last bits of the sum.
Arrays that no statement of the group writes may be read anywhere.

Worked example, the softmax above with r = i: every left-hand side has i bare first; the
written arrays m, e, z, y are read only as m[i], e[i,j], z[i] (position 0, as written): the
four statements run as `for block of rows (threads): m rows; e rows; z rows; y rows`.
`e[i,j] := exp(x[i,j] - m[i+1])` breaks it (m's next row belongs to the next block, not yet
written), as does `y[i,j] := e[j,i] / z[i]` (e read with i in another position) and a column
sum `g[j] := e[i,j]` (its left-hand side lacks i: every block adds to all of g).

Each statement runs the function its own kernel would run (`render`): the source rendered
from its plan, compiled serial and called with the block's bounds for r.  Every element is
computed by the same code in the same order whatever the blocks and threads, so the results
do not depend on the number of threads.  They equal the statements run one by one bit for
bit, except where a member's code lets the compiler reorder a sum (fastmath flag `reassoc`,
as the 8-lane reductions have): numba compiles the same text differently as a parallel
kernel (its own, which numba's parfor pass outlines) and as a serial function (here), and a
float32 row variance came out in other last bits (a member compiled parallel and nested in
the block's task gives the same bits, but the group's function then cannot be cached on
disk: 5-7 s of compiling in every new process).  Statements whose plan
fixes r's bounds in the code (`Plan.fixed`), splits work into chunks with partial results,
scatters, or reads a snapshot of its output are not grouped (the callers check).

`localize` keeps arrays that only the group reads (and writes whole) in a buffer of a
block's rows per thread instead of whole arrays: same members, same values.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..ir import Affine, Equation, Gather, Wrapped
from .source import Source
from .text import code_name, user_arg

BLOCK_BYTES = 1 << 18   # a block's rows of every array the group touches: about an L2 cache
_MODULE_NAMES = ("_T", "_pad")    # module-level names of a rendered function's text


def row_index(members: list[tuple[list[Equation], dict]]) -> str | None:
    """The row index of the rule (module docstring) for `members` run in order, each the
    statements run by one function and the index ranges it iterates; None when the rule
    holds for no index."""
    if len(members) < 2:
        return None
    eqs = [e for es, _ in members for e in es]
    for s in dict.fromkeys(s.names[0] for e in eqs for s in e.lhs.indices
                           if isinstance(s, Affine) and s.is_bare):
        if _holds(s, members, eqs):
            return s
    return None


def column_sums(eqs: list[Equation], r: str) -> set[str]:
    """The arrays that `eqs` (a group with row index r) only add to with r absent from the
    left-hand side (the rule's column sums; the caller checks that nothing reads them)."""
    def adds_across(e):
        return e.assign == "+=" and e.reducer == "+" and not any(
            r in s.names for s in e.lhs.indices if isinstance(s, Affine))
    writers: dict = {}
    for e in eqs:
        writers.setdefault(e.output, []).append(adds_across(e))
    return {n for n, adds in writers.items() if all(adds)}


def blocks(rows: int, per_block: int) -> int:
    """The blocks of `per_block` rows that cover `rows` rows (the generated loop's `_n`)."""
    return max(-(-rows // per_block), 0)


def _holds(r: str, members, eqs: list[Equation]) -> bool:
    rng = members[0][1].get(r)
    if rng is None or any(m[1].get(r) != rng for m in members):
        return False
    columns = column_sums(eqs, r)
    where: dict = {}            # written array -> position of r on its left-hand side
    for e in eqs:
        lhs = e.lhs.indices
        if any(not isinstance(s, Affine) for s in lhs):
            return False
        if e.output in columns:
            continue
        pos = [d for d, s in enumerate(lhs) if r in s.names]
        if len(pos) != 1 or not lhs[pos[0]].is_bare or where.setdefault(e.output, pos[0]) != pos[0]:
            return False
    if not where:
        return False            # column sums only: nothing for a row's block to share
    for e in eqs:
        if columns.intersection(e.params):
            return False        # a 0-d column sum read as a scalar
        for a in e.accesses():
            if a.array in columns:
                return False
            for s in a.indices:
                inner = s.inner if isinstance(s, Wrapped) else s
                if isinstance(inner, Gather) and (inner.array in where or inner.array in columns):
                    return False
            d = where.get(a.array)
            if d is None:
                continue
            s = a.indices[d] if d < len(a.indices) else None
            if not (isinstance(s, Affine) and s.is_bare and s.names == (r,)):
                return False
    return True


def block_rows(rows: int, bytes_per_row: int, block_bytes: int | None = None) -> int:
    """Rows per block: the group's rows of a block fill about `block_bytes` (BLOCK_BYTES by
    default; at least one row)."""
    return max(1, min(max(rows, 1), (block_bytes or BLOCK_BYTES) // max(bytes_per_row, 1)))


def render(sources: list[Source], row: str, columns=()) -> tuple[Source, list[list[tuple[str, str]]]]:
    """One function running the functions of `sources` (each rendered for its statements as
    its kernel runs them) block by block of rows of index `row`, the blocks across threads.
    Returns its Source, whose `args` are the caller's names (user names, `_start_<row>` /
    `_stop_<row>`, `_rows` the rows of a block, `_m<k>...` a member's other generated
    arguments, `partial_arg(n)` the zeroed (blocks, n's shape) partials of each column sum
    n in `columns`), and per member the (driver argument, member argument) pairs, by the
    caller's names, that say where each driver argument's value comes from."""
    lo, hi = f"_start_{code_name(row)}", f"_stop_{code_name(row)}"
    part = {code_name(n): partial_arg(n) for n in columns}
    parts, calls, driver, members = [], [], [], []
    for k, src in enumerate(sources):
        text = src.text
        for name in (*_MODULE_NAMES, src.name):
            text = re.sub(rf"(?<![\w.]){name}(?!\w)", f"{name}_m{k}", text)
        # the flags as a sorted set literal: the module text (the disk cache's key) must not
        # depend on the process's string hash seed
        flags = ("{" + ", ".join(map(repr, sorted(src.fastmath))) + "}"
                 if isinstance(src.fastmath, tuple) else repr(src.fastmath))
        params = re.search(rf"def {src.name}_m{k}\((.*?)\):", text).group(1).split(", ")
        parts.append(f"{text}\n_f{k} = _njit(fastmath={flags}, error_model='numpy')"
                     f"({src.name}_m{k})\n")
        names = [p if p in (lo, hi) or not p.startswith("_") else f"_m{k}{p}" for p in params]
        driver += [n for n in names if n not in driver and n not in (lo, hi)]
        members.append([(user_arg(n), user_arg(p)) for n, p in zip(names, params)
                        if n not in (lo, hi)])
        calls.append(f"        _f{k}({', '.join(f'{part[n]}[_b]' if n in part else _block(n, lo, hi) for n in names)})")
    args = driver + list(part.values()) + [lo, hi, "_rows"]
    # the blocks' partial column sums, added in block order (not thread order)
    sums = "".join(f"    for _b in range(max(_n, 0)):\n        {n} += {p}[_b]\n"
                   for n, p in part.items())
    text = ("from numba import njit as _njit\n" + "\n".join(parts)
            + f"\n\ndef _tullio_rows({', '.join(args)}):\n"
            f"    _n = ({hi} - {lo} + _rows - 1) // _rows\n"
            f"    for _b in _prange(max(_n, 0)):\n"
            f"        _lo = {lo} + _b * _rows\n"
            f"        _hi = min(_lo + _rows, {hi})\n" + "\n".join(calls) + "\n" + sums)
    return Source(text, "_tullio_rows", tuple(user_arg(a) for a in args), True, False), members


def partial_arg(name: str) -> str:
    """The row group function's argument for the blocks' partial sums of column sum `name`."""
    return f"_part_{code_name(name)}"


def local_arg(name: str) -> str:
    """The row group function's argument for block-local array `name` (`localize`)."""
    return f"_local_{code_name(name)}"


def localize(source: Source, local) -> Source:
    """A `render`ed row group with the arrays named in `local` (the caller's names) block-local:
    each is read and written only by the group, at the block's rows, and nothing reads it
    after the group (the callers check), so instead of the whole array the function takes
    `local_arg(name)`, a buffer of (threads, rows of a block, the array's other dimensions),
    and each block works in its thread's rows of it (intrinsics.shifted_rows: the members'
    code is unchanged) -- the rows stay in the cache and never reach memory.  The row index
    is the array's first dimension."""
    if not local:
        return source
    text = source.text
    head = f"def {source.name}("
    at = text.index(head)
    args = text[at + len(head):text.index("):", at)].split(", ")
    names = {code_name(n): local_arg(n) for n in local}
    new = [names.get(a, a) for a in args]
    block = "".join(f"        {c} = _shifted_rows({names[c]}[_t], _lo, _hi)\n" for c in names)
    body = text[at:].replace(", ".join(args), ", ".join(new), 1)
    marker = "        _hi = min(_lo + _rows, "
    cut = body.index("\n", body.index(marker)) + 1
    body = body[:cut] + "        _t = _thread_id()\n" + block + body[cut:]
    text = ("from numba import get_thread_id as _thread_id\n"
            "from tullio_py.intrinsics import shifted_rows as _shifted_rows\n" + text[:at] + body)
    return replace(source, text=text, args=tuple(user_arg(a) for a in new))


def _block(name: str, lo: str, hi: str) -> str:
    return "_lo" if name == lo else "_hi" if name == hi else name
