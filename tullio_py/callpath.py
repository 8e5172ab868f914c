"""The fast call path of a Kernel: a call that looks like an earlier one replays it.

What a call does beyond running the compiled loops -- checking the arrays, inferring ranges,
choosing the output's shape and dtype, picking the specialisation, building the argument list --
depends only on the names passed, each array's dtype, shape and strides, the types of scalar
parameters, whether an in-place output is writeable, and the extrema of index arrays over the
elements the statement's text selects (its constant positions; a call whose loops read fewer
elements than that is not remembered).  That is the key.  The first call with a key goes the full way and leaves behind a small generated
function that allocates the output and calls the compiled kernel with its arguments in place
(bounds baked in as constants); later calls with the same key run only that.  A call that
ran on relaid copies (relayout.py) is replayed as the copies, the moved statement's loops and
the take back (`remember_relaid`): the dW of a locally connected layer, 30x30 positions,
float32, one thread, called on its own with `+=`, 0.92 -> 0.78 ms a call, of which 0.62 ms
are its loops (AMD Zen 4).

The key is built inside one function generated per kernel (no loops, no dict of shapes) that
also looks it up and calls the entry; the newest remembered call is replayed inline before
that, behind checks cheaper than the key.  The same code is generated twice: taking the arrays
as a dict (tullio() has one), and as the Kernel's own `__call__` with the statement's names as
keyword parameters (no dict built, one Python frame), so a repeated `k(A=A, B=B)` costs
Python's call of an object, a few attribute reads, the output allocation and the compiled
entry point (numba's type dispatch skipped).  It is the one cache key not built as a signature.CallSignature, on purpose: it
holds the same facts as that signature's ArraySigs (dtype, shape and strides of each array, the
type of each scalar, in the kernel's own argument order) plus writeability and gather extrema,
but as one flat tuple read straight from the arguments, which is what keeps a repeated call
near the bare compiled function's cost (CallSignature.of would loop over a dict and build a
tuple per argument).  It lives only in this Kernel's memory (never on disk).
"""
from __future__ import annotations

import numpy as np

from . import memo, memory, overlap, ranges

_ND = np.ndarray
_SCALARS = (int, float, complex, bool)
_MAX_ENTRIES = 256      # distinct keys remembered per kernel; past that, start again
# numpy's array flags (ndarray.flags.num)
_C, _F, _ALIGNED, _WRITEABLE = 0x1, 0x2, 0x100, 0x400
_INT64, _UINT64 = (-2**63, 2**63 - 1), (2**63, 2**64 - 1)


def _extrema(J, box):
    """(min, max) of the elements of index array J that a statement can read (box: its
    constant positions selected, as ranges.gather_extrema without ranges), None if none."""
    try:
        J = J[box]
    except IndexError:          # a constant position outside J: the slow path reports it
        return False
    return (int(J.min()), int(J.max())) if J.size else None


class _Missing:
    """The default of a name not passed to a generated `__call__` (never an array or scalar)."""
    __slots__ = ()

    def __repr__(self):
        return "<not passed>"


_MISSING = _Missing()
_GIVE_UP = "<give up>"      # a replay's line that hands the call to the full path


def _packed(names, rest, values) -> dict:
    """The arrays of a call to a generated `__call__` as the dict Kernel's full path takes."""
    arrays = {n: a for n, a in zip(names, values) if a is not _MISSING}
    arrays.update(rest)
    return arrays


class CallCache:
    """Per Kernel: key of a call -> generated function that replays it."""

    def __init__(self, eq, threads, publish=None, tape=lambda: None):
        """`publish(fn, method)`: told each new call function and `__call__` method (the
        kernel calls the newest; method None: the names cannot be its keyword parameters).
        `tape()`: the active Tape or None (a call inside one goes the full way)."""
        self.tape = tape
        self.output = eq.output
        self.in_place = eq.assign != ":="
        self.params = frozenset(eq.params)
        self.names = tuple(([eq.output] if self.in_place else []) + list(eq.arrays)
                           + list(eq.params))
        self.gathers = []       # (index array, the elements its text selects), no repeats
        for g in eq.gathers():
            if (g.array, ranges.read_box(g)) not in self.gathers:
                self.gathers.append((g.array, ranges.read_box(g)))
        self.threads = threads
        self.entries = memo.Memo("callpath.entries", _MAX_ENTRIES)
        self.publish = publish
        self.key = self._key_function()
        self.call = self._call_function()
        self.method = None

    # ------------------------------------------------------------------ generated code
    def _read_lines(self):
        """Source lines that read the arguments into locals v0, v1, ... (returning None when
        the names differ or an array's name holds no numpy array), and the key's parts."""
        v = {n: f"v{i}" for i, n in enumerate(self.names)}
        lines = [f"    if len(_a) != {len(self.names)}:",
                 "        return None"]
        if self.names:
            lines += ["    try:"] + [f"        {v[n]} = _a[_n{i}]" for i, n in enumerate(self.names)]
            lines += ["    except KeyError:", "        return None"]
        parts = []
        for n in self.names:
            if n in self.params:
                # a 0-d array parameter is keyed by its dtype; a Python scalar by its type
                parts.append(f"({v[n]}.dtype if {v[n]}.__class__ is _ND and {v[n]}.ndim == 0 "
                             f"else {v[n]}.__class__)")
            else:
                lines += [f"    if {v[n]}.__class__ is not _ND:", "        return None"]
                # alignment: a replay calls the compiled entry for the remembered types
                parts += [f"{v[n]}.dtype", f"{v[n]}.shape", f"{v[n]}.strides",
                          f"{v[n]}.flags.aligned"]
        if self.in_place:
            parts.append(f"{v[self.output]}.flags.writeable")
        parts += [f"_extrema({v[g]}, _box{i})" for i, (g, _) in enumerate(self.gathers)]
        return lines, f"({''.join(p + ', ' for p in parts)})"

    def _namespace(self) -> dict:
        return {"_ND": _ND, "_extrema": _extrema, **self._name_constants(),
                **{f"_box{i}": box for i, (_, box) in enumerate(self.gathers)}}

    def _key_function(self):
        """def _key(arrays) -> tuple or None (None: this call cannot take the fast path)."""
        lines, key = self._read_lines()
        ns = self._namespace()
        exec("\n".join(["def _key(_a):", *lines, f"    return {key}"]), ns)
        return ns["_key"]

    def _call_function(self, hot=None):
        """def _call(arrays) -> output array, or None when the call is not a known one.
        The key's reads, the lookup and the replay in one function: each argument read from
        the dict once.  `hot`: (conditions, body lines, namespace) of the newest remembered
        call, replayed inline when its conditions hold (no key built, no hash, no lookup, no
        second frame) and the memo still holds entries (memo.clear_all empties it: then
        nothing is replayed until a full call remembers again)."""
        lines, key = self._read_lines()
        v = ", ".join(f"v{i}" for i in range(len(self.names)))
        ns = {**self._namespace(), "_get": self.entries.get, "_entries": self.entries}
        inline = []
        if hot is not None:
            conditions, body, hot_ns = hot
            ns.update(hot_ns)
            inline = [f"    if {' and '.join(['_entries', *conditions])}:",
                      *("    " + line.replace(_GIVE_UP, "None") for line in body)]
        exec("\n".join(["def _call(_a):", *lines, *inline,
                        f"    _e = _get({key})",
                        "    if _e is None:",
                        "        return None",
                        f"    return _e({v})"]), ns)
        return ns["_call"]

    def _method_function(self, hot):
        """def __call__(self, *, <the names>=<not passed>, **rest): a Kernel's call with the
        arrays as keyword parameters (numpy arrays and scalars only; no dict of the arguments
        built, no second frame, and a Kernel's own class calls it as its `__call__`: the
        cheapest Python call of an object with keywords).  The newest remembered call inline
        as in _call_function, then the lookup by key; anything else goes to the Kernel's full
        path with the arguments as passed.  The text names its parameters v0, v1, ...; they
        are renamed to the statement's names in the code object (no name pasted into text).
        None when a name cannot be a parameter (it is one of the function's own locals)."""
        n = len(self.names)
        v = [f"v{i}" for i in range(n)]
        _, key = self._read_lines()
        full = f"_self._call_full(_pack(_rest, ({''.join(x + ', ' for x in v)})))"
        arrays = [v[i] for i, name in enumerate(self.names) if name not in self.params]
        conditions, body, hot_ns = hot
        ours = [f"{x}.__class__ is _ND" for x in arrays] + ["not _rest", "_cur() is None"]
        keywords = f"*, {''.join(x + '=_M, ' for x in v)}" if v else ""
        lines = [f"def __call__(_self, {keywords}**_rest):",
                 f"    if {' and '.join(ours)}:",
                 f"        if {' and '.join(['_entries', *conditions])}:",
                 *("        " + line.replace(_GIVE_UP, full) for line in body),
                 f"        _e = _get({key})",
                 "        if _e is not None:",
                 f"            _r = _e({', '.join(v)})",
                 "            if _r is not None:",
                 "                return _r",
                 f"    return {full}"]
        ns = {**self._namespace(), **hot_ns, "_get": self.entries.get, "_entries": self.entries,
              "_M": _MISSING, "_cur": self.tape,
              "_pack": lambda rest, values, names=self.names: _packed(names, rest, values)}
        exec("\n".join(lines), ns)
        fn = ns["__call__"]
        code = fn.__code__
        rename = dict(zip(v, self.names))
        varnames = tuple(rename.get(x, x) for x in code.co_varnames)
        if len(set(varnames)) != len(varnames):
            return None
        fn.__code__ = code.replace(co_varnames=varnames, co_qualname="Kernel.__call__")
        fn.__kwdefaults__ = {name: _MISSING for name in self.names}
        return fn

    def _conditions(self, given: dict, key: tuple):
        """Conditions on v0, v1, ... (source, and the namespace of their constants) that hold
        exactly when a call's key is `key` (the key of `given`), cheaper to test than the key
        is to build and look up: dtypes and scalar types by identity (an equal dtype that is
        another object fails them: the lookup then decides), numpy's flags as one integer
        (contiguity, alignment, writeable), and strides only where shape and contiguity do
        not fix them (a dimension of length 0 or 1, or neither C nor F contiguous)."""
        conds, ns = [], {}
        for i, n in enumerate(self.names):
            a, v = given[n], f"v{i}"
            if n in self.params:
                if a.__class__ is _ND and a.ndim == 0:
                    conds += [f"{v}.__class__ is _ND", f"{v}.ndim == 0", f"{v}.dtype is _h{i}"]
                    ns[f"_h{i}"] = a.dtype
                else:
                    conds.append(f"{v}.__class__ is _h{i}")
                    ns[f"_h{i}"] = a.__class__
                continue
            conds += [f"{v}.dtype is _h{i}", f"{v}.shape == _s{i}"]
            if a.flags.carray:      # C-contiguous, aligned and writeable: numpy's one flag
                conds.append(f"{v}.flags.carray")
            else:
                mask = _C | _F | _ALIGNED | (_WRITEABLE if self.in_place and n == self.output
                                             else 0)
                conds.append(f"{v}.flags.num & {mask} == {a.flags.num & mask}")
            ns[f"_h{i}"], ns[f"_s{i}"] = a.dtype, a.shape
            if not (a.ndim == 0 or min(a.shape) > 1 and a.flags.num & (_C | _F)):
                conds.append(f"{v}.strides == _t{i}")
                ns[f"_t{i}"] = a.strides
        var = {n: f"v{i}" for i, n in enumerate(self.names)}
        for j, (g, _) in enumerate(self.gathers):
            conds.append(f"_extrema({var[g]}, _box{j}) == _x{j}")
            ns[f"_x{j}"] = key[len(key) - len(self.gathers) + j]
        return conds, ns

    def _name_constants(self) -> dict:
        """The names as constants of the generated functions (not pasted into their text)."""
        return {f"_n{i}": n for i, n in enumerate(self.names)}

    # ------------------------------------------------------------------ learning a call
    def remember(self, kernel, given: dict, collected: dict, prepared, args, out, fill: bool):
        """After a full call: record how `args` were made from the arrays in `given`.  Every
        argument is the output, its snapshot, an input as passed, or a constant that the key
        determines (loop bounds); anything else (an input replaced by its snapshot) and the
        call is simply not remembered.  An in-place replay first checks that no input's
        memory bounds meet the output's, else it hands the call back to the full path."""
        try:
            key = self.key(given)
        except Exception:          # an odd object under an array's name: slow path decides
            return
        if key is None or prepared.fn is None:
            return
        var = {n: f"v{i}" for i, n in enumerate(self.names)}
        consts: dict = {}
        code, values = [], []      # the replay's arguments: source, and as this call has them
        checks = []                # a Python int parameter in the remembered int type's range
        out_name = prepared.equation.output
        for i, name in enumerate(prepared.source.args):
            a = args[i]
            if name == out_name:
                code.append("_out.reshape(1)" if out.ndim == 0 else "_out")
                values.append(a)
            elif name.startswith("_old_"):
                code.append("_out.copy().reshape(1)" if out.ndim == 0 else "_out.copy()")
                values.append(a)
            elif name in var and name in collected and a is collected[name]:
                item = name in self.params and given[name].__class__ is _ND
                code.append(var[name] + (".item()" if item else ""))
                values.append(given[name].item() if item else given[name])
                if values[-1].__class__ is int:     # numba types an int by its value
                    lo, hi = _INT64 if -2**63 <= values[-1] < 2**63 else _UINT64
                    if item:
                        checks.append(f"    _p{i} = {code[-1]}")
                        code[-1] = f"_p{i}"
                    checks += [f"    if not {lo} <= {code[-1]} <= {hi}:",
                               f"        return {_GIVE_UP}"]
            elif isinstance(a, (int, float, bool, np.integer, np.floating)):
                consts[f"_c{i}"] = a
                code.append(f"_c{i}")
                values.append(a)
            else:
                return
        body = checks + self._output_lines(var, fill)
        body.append("    _ran[0] = _prepared")
        from . import jit, schedule
        n = schedule.thread_count(self.threads, jit.max_threads())
        if prepared.source.parallel:         # thread count, budget and layer: jit.call
            body.append(f"    _launch(_fn, ({''.join(c + ', ' for c in code)}), True, _n)")
        else:
            # numba's type dispatch skipped: the key fixes every argument's type (dtype, rank,
            # layout, alignment; constants are the same values; an int parameter's range)
            entry = jit.entry_point(prepared.fn, values)
            consts["_run"] = entry if entry is not None else prepared.fn
            body.append(f"    _run({', '.join(code)})")
        body.append("    return _out")
        self._install(given, key, body, {
            **self._output_names(kernel, out), "_ran": kernel.last_cell, "_prepared": prepared,
            "_fn": prepared.fn, "_launch": jit.call, "_n": n, **consts})

    def remember_relaid(self, kernel, given: dict, collected: dict, run, out, fill: bool):
        """After a full call that ran on relaid copies (relayout.py): record it, so that a
        later call with the same key runs `run(arrays, out)` (the copies, the moved
        statement's loops, the take back into `out`) without binding, range inference or
        relayout's choice again.  Only where every array and scalar went in as passed (an
        input replaced by its snapshot, a 0-d parameter read as a Python scalar: not
        remembered); an in-place replay checks the output's memory against the inputs' as
        `remember`'s does."""
        if any(collected.get(n) is not given.get(n) for n in self.names):
            return
        try:
            key = self.key(given)
        except Exception:          # an odd object under an array's name: slow path decides
            return
        if key is None:
            return
        var = {n: f"v{i}" for i, n in enumerate(self.names)}
        body = self._output_lines(var, fill)
        body += [f"    _relaid(dict(zip(_names, ({''.join(var[n] + ', ' for n in self.names)}))), "
                 "_out)", "    return _out"]
        self._install(given, key, body, {**self._output_names(kernel, out), "_relaid": run,
                                          "_names": self.names})

    def _output_lines(self, var: dict, fill: bool) -> list:
        """A replay's lines that bind `_out`: the in-place output (giving up where an input's
        memory meets it: the full path snapshots such an input), or a new array."""
        if self.in_place:
            lines = [f"    _out = {var[self.output]}"]
            reads = [var[n] for n in self.names if n != self.output and n not in self.params]
            if reads:
                lines += [f"    if _overlap(_out, ({''.join(r + ', ' for r in reads)})):",
                          f"        return {_GIVE_UP}"]
            return lines
        return ["    _out = _full(_shape, _pad, _dtype)" if fill else
                "    _out = _empty(_shape, _dtype)"]

    @staticmethod
    def _output_names(kernel, out) -> dict:
        """The names `_output_lines` uses.  (An output of SMALL bytes and more starts a cache
        line: memory.py.)"""
        big = out.nbytes >= memory.SMALL
        return {"_full": memory.full if big else np.full,
                "_empty": memory.empty if big else np.empty, "_shape": out.shape,
                "_dtype": out.dtype, "_pad": kernel.pad, "_overlap": overlap.bounds_meet}

    def _install(self, given: dict, key: tuple, body: list, ns: dict) -> None:
        """Make `body` the replay of calls with `key` (the key of `given`) and the newest,
        inlined call."""
        var = {n: f"v{i}" for i, n in enumerate(self.names)}
        exec("\n".join([f"def _entry({', '.join(var[n] for n in self.names)}):",
                         *(line.replace(_GIVE_UP, "None") for line in body)]), ns)
        self.entries[key] = ns["_entry"]
        conditions, constants = self._conditions(given, key)
        hot = (conditions, body, {**ns, **constants})
        self.call = self._call_function(hot)
        self.method = self._method_function(hot)
        if self.publish is not None:
            self.publish(self.call, self.method)
