"""`Tape`: reverse mode through a sequence of tullio_py statements, with exact overwrite semantics.

Inside `with Tape() as tape:` every Kernel call is recorded.  `tape.backward(outputs,
cotangents)` walks the records in reverse and calls each kernel's `vjp`.  Adjoints are keyed by
array identity, so an array overwritten in place has one adjoint slot whose meaning changes as
the walk passes the statement that wrote it:

- `:=`  the array did not exist before: its adjoint is consumed.
- `=`   covered elements are overwritten: their adjoint is replaced by the partial the
        statement's own right-hand side gives the old value (zero if it does not read it);
        elements the statement does not cover pass through.
- `+=`, `-=`  the old value passes through (plus any partial from reading it).
- `*=`  the old value's adjoint is multiplied by the factor.

Values a backward needs are kept: arrays are held by reference and copied only when a later
recorded statement is about to overwrite them (copy on overwrite; `tape.saved_bytes`).  A write
that makes an earlier, never-read write dead emits `OverwriteWarning` (per element where the
written region is known).  Arrays mutated outside the tape before `backward` are detected
(a checksum for numpy, version counters for torch) and raise.
"""
from __future__ import annotations

import contextvars
import sys
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np

from . import overlap
from .errors import ArgumentError, OverwriteError, OverwriteWarning
from .ir import Affine, Gather

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("tullio_py_tape", default=None)


def current():
    """The innermost active Tape, or None (fast: one ContextVar read)."""
    return _CURRENT.get()


# torch.compile cannot trace ContextVar.get: it reads current() once, while tracing (torch's
# assume_constant_result marks a function exactly this way; setting it here needs no torch).
current._dynamo_marked_constant = True
# current() without its Python frame, for the call path after it has seen numpy arrays (which
# torch.compile does not trace into the compiled loops anyway).
current_fast = _CURRENT.get


# ----------------------------------------------------------------------------- arrays
def _is_torch(a) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _as_numpy(a):
    if _is_torch(a):
        return a.detach().resolve_conj().resolve_neg().cpu().numpy()
    return np.asarray(a)


def _copy(a):
    return a.detach().clone() if _is_torch(a) else np.array(a, copy=True)


def _shares(a, b) -> bool:
    """Whether two arrays (numpy, or torch tensors) share the memory of an element."""
    if a is b:
        return True
    if _is_torch(a) or _is_torch(b):
        devices = {x.device.type if _is_torch(x) else "cpu" for x in (a, b)}
        if devices != {"cpu"}:
            return (len(devices) == 1 and "cpu" not in devices and _is_torch(a) and _is_torch(b)
                    and a.device == b.device and overlap.device_overlaps(a.detach(), b.detach()))
        a, b = _memory(a), _memory(b)
    return overlap.overlaps(np.asarray(a), np.asarray(b))


def _memory(a):
    """A numpy view of a CPU tensor's memory (a lazily conjugated tensor's, without the bit)."""
    if not _is_torch(a):
        return a
    t = a.detach()
    if t.is_conj():
        t = t.conj()          # the same memory, the bit cleared
    return t.resolve_neg().numpy()


def _fingerprint(a):
    if _is_torch(a):
        return ("version", a._version)
    a = np.ascontiguousarray(a)
    return ("crc32", zlib.crc32(a.view(np.uint8).reshape(-1)) if a.size else 0)


def _nbytes(a) -> int:
    return a.element_size() * a.numel() if _is_torch(a) else np.asarray(a).nbytes


@dataclass
class _Slot:
    """A value a backward needs: the live array (checked by fingerprint) or a saved copy."""
    value: object
    live: bool
    fingerprint: object = None


@dataclass(frozen=True)
class Record:
    """One recorded statement: the kernel, the arrays by identity, the assignment form."""
    index: int
    kernel: object
    text: str
    assign: str
    output: str
    output_id: int
    ids: tuple           # (name, id) of every array argument
    scalars: tuple       # (name, value) of scalar parameters
    reads_output: bool
    covered: object = field(repr=False, compare=False)  # bool mask of written elements or None


class Tape:
    """Records tullio_py statements for reverse mode.  `Tape(strict=True)` raises on dead writes."""

    def __init__(self, strict: bool = False):
        self.strict = strict
        self._token = None
        self.reset()

    # ------------------------------------------------------------------ context
    def __enter__(self):
        if self._token is not None:
            raise ArgumentError("this Tape is already active: a tape cannot be entered twice",
                                hint="use a new Tape() for a nested recording")
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc):
        _CURRENT.reset(self._token)
        self._token = None
        return False

    def reset(self):
        """Forget every record, saved value and adjoint."""
        self.records: list[Record] = []
        self._arrays: dict[int, object] = {}            # id -> array (keeps ids unique)
        self._slots: dict[tuple[int, str], _Slot] = {}  # (record, name or '<out>') -> value
        self._unread: dict[int, list] = {}               # id -> [(record, covered mask)]
        self._adjoints: dict[int, object] = {}
        self.saved_bytes = 0

    def zero(self):
        """Forget the adjoints of the last backward, keep the records."""
        self._adjoints = {}

    # ------------------------------------------------------------------ recording
    def run(self, kernel, arrays: dict):
        """Record one kernel call (called by Kernel.__call__), then run it untaped."""
        eq = kernel.equation
        token = _CURRENT.set(None)          # the call itself (and its frontends) is not recorded
        try:
            out_obj = arrays.get(eq.output)
            index = len(self.records)
            names = [n for n in eq.arrays if n in arrays and not np.isscalar(arrays[n])]
            if eq.assign == "*=" and eq.output not in names:
                names.append(eq.output)
            for n in dict.fromkeys(names):
                a = arrays[n]
                self._arrays[id(a)] = a
                if (index, n) not in self._slots:
                    self._slots[(index, n)] = _Slot(a, True, _fingerprint(a))
            if eq.assign != ":=" and out_obj is not None:
                # after this statement's own slots exist: an input that is the output's memory
                # under another name (the same array, a view) keeps its value from before
                self._before_write(out_obj, kernel, arrays)
            for n in names:                           # a read makes earlier writes live,
                if n in eq.arrays:                    # also through a view of their memory
                    a = arrays[n]
                    for key in [k for k in self._unread
                                if k == id(a) or _shares(self._arrays[k], a)]:
                        del self._unread[key]
            result = kernel(**arrays)
        finally:
            _CURRENT.reset(token)
        out = result
        self._arrays[id(out)] = out
        covered = self._covered(kernel, arrays, out)
        self._note_write(out, index, covered, kernel)
        self._slots[(index, "<out>")] = _Slot(out, True, _fingerprint(out))
        scalars = tuple((p, arrays[p]) for p in eq.params if p in arrays)
        self.records.append(Record(index, kernel, eq.text or str(eq), eq.assign, eq.output,
                                   id(out), tuple((n, id(arrays[n])) for n in dict.fromkeys(names)),
                                   scalars, eq.output in eq.arrays, covered))
        return result

    def _before_write(self, target, kernel, arrays):
        """`target` is about to be overwritten: every slot holding it live, or an array that
        shares its memory (a view, a slice that overlaps it), gets a copy."""
        copies: dict = {}
        for key, slot in self._slots.items():
            if slot.live and _shares(slot.value, target):
                saved = copies.get(id(slot.value))
                if saved is None:
                    saved = copies[id(slot.value)] = _copy(slot.value)
                    self.saved_bytes += _nbytes(saved)
                self._slots[key] = _Slot(saved, False)
        eq = kernel.equation
        if eq.output in eq.arrays or eq.assign == "*=":   # needs its own old value
            index = len(self.records)
            saved = copies.get(id(target))
            if saved is None:
                saved = _copy(target)
                self.saved_bytes += _nbytes(saved)
            self._slots[(index, kernel.equation.output)] = _Slot(saved, False)

    def _covered(self, kernel, arrays, out):
        return covered(kernel, arrays, out)

    def _note_write(self, out, index, covered, kernel):
        """Warn when this write overwrites elements an earlier write left unread."""
        key = id(out)
        eq = kernel.equation
        pending = self._unread.get(key, [])
        if eq.assign in ("=", ":="):
            for earlier, mask in pending:
                overlap = (mask is None or covered is None or bool((mask & covered).any()))
                if overlap:
                    msg = (f"statement {index} `{eq.text}` overwrites what statement {earlier} "
                           f"`{self.records[earlier].text}` wrote, before anything read it: "
                           "the earlier write is dead")
                    if self.strict:
                        raise OverwriteError(msg)
                    warnings.warn(msg, OverwriteWarning, stacklevel=4)
            pending = []
        self._unread[key] = pending + [(index, covered)]

    # ------------------------------------------------------------------ backward
    def backward(self, outputs, cotangents=None):
        """Propagate cotangents of `outputs` (an array or a sequence) back through the records."""
        if not isinstance(outputs, (list, tuple)):
            outputs, cotangents = [outputs], [cotangents]
        if cotangents is None:
            cotangents = [None] * len(outputs)
        self._check_untouched()
        adj = self._adjoints
        for o, c in zip(outputs, cotangents):
            c = np.ones(_as_numpy(o).shape, _as_numpy(o).dtype) if c is None else _as_numpy(c)
            adj[id(o)] = adj[id(o)] + c if id(o) in adj else np.array(c, copy=True)
            self._arrays.setdefault(id(o), o)
        for rec in reversed(self.records):
            g = adj.get(rec.output_id)
            if g is None:
                continue
            arrays = {n: _as_numpy(self._slots[(rec.index, n)].value) for n, _ in rec.ids}
            arrays.update(dict(rec.scalars))
            post = _as_numpy(self._slots[(rec.index, "<out>")].value)
            if rec.assign != ":=" and not rec.reads_output:
                arrays[rec.output] = post      # the value after the statement (finalisers, max)
            vjp_kernel = rec.kernel
            if rec.assign == "*=":
                # y = y_old * F(inputs): inputs get vjp of F with cotangent g*y_old, and the
                # old value's adjoint is g*F.
                factor_kernel = _factor_kernel(rec.kernel)
                old = self._slots[(rec.index, rec.output)].value
                arrays[rec.output] = _as_numpy(old)
                reads = {n: v for n, v in arrays.items()
                         if n in factor_kernel.equation.arrays or n in factor_kernel.equation.params}
                factor = factor_kernel(**reads)
                grads = factor_kernel.vjp(g * _as_numpy(old), **reads)
                adj[rec.output_id] = g * factor
                for name, i in rec.ids:
                    if name in grads:
                        adj[i] = adj[i] + grads[name] if i in adj else grads[name]
                continue
            if rec.reads_output:
                # The statement reads its own old value: differentiate the same statement with
                # that read renamed, so the old value gets its own gradient.
                vjp_kernel, old = old_value_kernel(rec.kernel)
                arrays[old] = arrays.pop(rec.output)
                arrays[rec.output] = post
                grads = vjp_kernel.vjp(g, **arrays)
                if old in grads:
                    grads[rec.output] = grads.pop(old)
            else:
                grads = vjp_kernel.vjp(g, **arrays)
            if rec.assign == ":=":
                del adj[rec.output_id]
            elif rec.assign == "=":
                keep = g * ~rec.covered if rec.covered is not None else np.zeros_like(g)
                adj[rec.output_id] = keep
            # "+=", "-=": the old value's adjoint passes through unchanged
            for name, i in rec.ids:
                if name in grads:
                    adj[i] = adj[i] + grads[name] if i in adj else grads[name]
            if rec.reads_output and rec.assign == ":=":
                adj.pop(rec.output_id, None)
        return self

    def _check_untouched(self):
        for (index, name), slot in self._slots.items():
            if slot.live and _fingerprint(slot.value) != slot.fingerprint:
                raise ArgumentError(
                    f"array '{name if name != '<out>' else self.records[index].output}' of "
                    f"statement {index} `{self.records[index].text}` was changed outside the tape "
                    "after it was recorded, so its gradient would be computed at the wrong value",
                    hint="record every update inside the tape, or copy the array before changing it")

    def grad(self, array):
        """The adjoint of `array`'s value at the start of the tape (zeros if none flows)."""
        g = self._adjoints.get(id(array))
        if g is None:
            g = np.zeros(_as_numpy(array).shape, _as_numpy(array).dtype)
        if _is_torch(array):           # torch is loaded: the array is a tensor
            return sys.modules["torch"].from_numpy(np.asarray(g)).to(array.device)
        return g


def covered(kernel, arrays, out):
    """Bool mask of the output elements the statement writes (None: all of them)."""
    eq = kernel.equation
    o = _as_numpy(out)
    if not eq.lhs.indices:
        return None
    try:
        rng = kernel.ranges(**{n: _as_numpy(v) if not np.isscalar(v) else v
                               for n, v in arrays.items()})
    except Exception:
        return None
    left = list(eq.lhs_indices)
    grids = {}
    for k, n in enumerate(left):
        shape = [1] * len(left)
        shape[k] = -1
        grids[n] = np.arange(rng[n].start, rng[n].stop).reshape(shape)

    def value(a: Affine):
        v = a.const
        for n, c in a.terms:
            v = v + c * grids[n]
        return v
    pos = []
    for s in eq.lhs.indices:
        if isinstance(s, Affine):
            pos.append(value(s))
        elif isinstance(s, Gather):
            J = _as_numpy(arrays[s.array])
            pos.append(J[tuple(value(a) for a in s.indices)] + value(s.offset))
        else:
            return None
    pos = np.broadcast_arrays(*pos)
    mask = np.zeros(o.shape, bool)
    mask[tuple(pos)] = True
    return mask


def _fresh(eq, suffix: str) -> str:
    """A name for a derived array that the statement does not use."""
    taken = set(eq.indices) | set(eq.arrays) | set(eq.params) | {eq.output}
    name = eq.output + suffix
    while name in taken:
        name += "_"
    return name


def _derived_kernel(k, eq):
    """A kernel for a statement derived from k's, with k's ranges, pad and threads: built from
    the Equation itself (factory.kernel caches it like a text)."""
    from .factory import kernel as make
    options = {o: v for o, v in k.options.as_kwargs().items()
               if o in ("ranges", "pad", "threads") and v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # the user was warned about the original
        return make(eq, **options)


def old_value_kernel(k):
    """(kernel of the statement with reads of its output renamed, the new name)."""
    from dataclasses import replace

    from .ir import rename_reads
    eq = k.equation
    old = _fresh(eq, "_old")
    return _derived_kernel(k, replace(eq, rhs=rename_reads(eq.rhs, eq.output, old), text="")), old


def _factor_kernel(k):
    """The kernel of the factor F of `y[...] *= rhs`: `F[...] := (*) rhs`."""
    from dataclasses import replace

    from .ir import Access
    eq = k.equation
    new = replace(eq, lhs=Access(_fresh(eq, "_factor"), eq.lhs.indices), assign=":=", text="",
                  reduction="*" if eq.reduction_indices else None)
    return _derived_kernel(k, new)
