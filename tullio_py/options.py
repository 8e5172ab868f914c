"""The options of a kernel: one frozen, validated `Options`, with every default in one place.

`Options.from_kwargs(**options)` checks each value's type and form at the boundary and
normalises it (ranges to `range`s, nograd to a tuple, pad to a Python int or float);
`Options.check(equation)` checks the names the options mention against the statement.  Every
problem is an `ArgumentError` that names the option and the values it allows.  Nothing here
calls a method of a value that is not already known to be a plain int, float, str, range or
bool (no `repr`, `str`, `format`, `float` or `int` of a user's object), so a value with a
crafted `__repr__` cannot run code through an error message either.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from .errors import ArgumentError

TARGETS = ("auto", "cpu", "cuda", "python")
_NAN = float("nan")


def show(v) -> str:
    """How an error message shows a value: repr for plain values, else only its type."""
    if v is None or type(v) in (bool, int, float, str, range):
        return repr(v)
    if type(v) in (tuple, list) and len(v) <= 4 and all(
            x is None or type(x) in (bool, int, float, str) for x in v):
        return repr(v)
    return f"a {type(v).__name__}"


def _integer(v) -> int | None:
    """v as a Python int when it is an integer (not a bool), else None."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, int):
        return int.__int__(v)           # the value itself, not a subclass's __int__
    if isinstance(v, np.integer):
        return int(v.item())
    return None


def _real(v) -> int | float | None:
    """v as a Python int or float when it is a real number (not a bool), else None."""
    i = _integer(v)
    if i is not None:
        return i
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, np.floating) and v.dtype.itemsize <= 8:
        return float(v.item())
    return None


def _name(v) -> str | None:
    return str.__str__(v) if isinstance(v, str) else None


def _range(name: str, v) -> range:
    """One entry of ranges=: a range with step 1, a size >= 0, or a (start, stop) pair."""
    allowed = ("a range with step 1, a size (an int >= 0) or a (start, stop) tuple of ints "
               "with start <= stop")
    if isinstance(v, range):
        if v.step == 1 and v.stop >= v.start:
            return v
    elif _integer(v) is not None:
        if _integer(v) >= 0:
            return range(_integer(v))
    elif type(v) is tuple and len(v) == 2:
        start, stop = _integer(v[0]), _integer(v[1])
        if start is not None and stop is not None and start <= stop:
            return range(start, stop)
    raise ArgumentError(f"option ranges: ranges[{name!r}] must be {allowed}, not {show(v)}")


@dataclass(frozen=True)
class Options:
    """The options of `kernel()` / `tullio()` (see README), validated and normalised."""
    threads: bool | int = True
    target: str = "auto"
    grad: bool = True
    nograd: tuple[str, ...] = ()
    ranges: tuple[tuple[str, range], ...] = ()     # (index, range) pairs, in the order given
    fastmath: bool = False
    verbose: int = 0
    pad: int | float = 0
    blas: bool = True
    fuse: bool = True

    @classmethod
    def from_kwargs(cls, **options) -> "Options":
        """Validated Options from keyword arguments; an unknown keyword is an ArgumentError."""
        bad = [k for k in options if k not in NAMES]
        if bad:
            raise ArgumentError(f"unknown option{'s' if len(bad) > 1 else ''}: {', '.join(bad)}",
                                hint=f"options are {', '.join(NAMES)}; arrays go to the kernel "
                                     "call")
        out = {}
        for key, value in options.items():
            out[key] = _CHECKS[key](value)
        return cls(**out)

    @property
    def given(self) -> dict[str, range]:
        """ranges= as a dict {index: range}."""
        return dict(self.ranges)

    def as_kwargs(self) -> dict:
        """Keyword arguments that `kernel()` turns back into these options."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw["ranges"] = self.given or None
        return kw

    def check(self, eq) -> None:
        """The names in ranges= must be indices of `eq`, those in nograd= its inputs."""
        for name, _ in self.ranges:
            if name not in eq.indices:
                raise ArgumentError(
                    f"option ranges names {name!r}, which is not an index of the statement",
                    eq.text or str(eq), None,
                    f"indices are {', '.join(eq.indices) or '(none)'}")
        inputs = list(eq.arrays) + list(eq.params) + ([eq.output] if eq.assign != ":=" else [])
        for name in self.nograd:
            if name not in inputs:
                raise ArgumentError(
                    f"option nograd names {name!r}, which is not an input of the statement",
                    eq.text or str(eq), None,
                    f"inputs are {', '.join(dict.fromkeys(inputs)) or '(none)'}")


def _switch(option: str):
    def check(v) -> bool:
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        raise ArgumentError(f"option {option} must be True or False, not {show(v)}")
    return check


def _threads(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    n = _integer(v)
    if n is None or n < 1:
        raise ArgumentError(f"option threads must be True, False or a positive int, not {show(v)}")
    return n


def _target(v):
    name = _name(v)
    if name not in TARGETS:
        raise ArgumentError(f"option target must be one of {', '.join(map(repr, TARGETS))}, "
                            f"not {show(v)}")
    return name


def _verbose(v):
    if isinstance(v, (bool, np.bool_)):
        return int(bool(v))
    n = _integer(v)
    if n not in (0, 1, 2):
        raise ArgumentError(f"option verbose must be 0, 1, 2, True or False, not {show(v)}")
    return n


def _pad(v):
    x = _real(v)
    if x is None:
        raise ArgumentError(f"option pad must be a real number (an int or a float, inf and nan "
                            f"included; not a bool or a string), not {show(v)}")
    return _NAN if x != x else x        # one nan object: equal options, one cached kernel


def _nograd(v):
    if v is None:
        return ()
    if isinstance(v, str) or not isinstance(v, (tuple, list, set, frozenset)):
        raise ArgumentError(f"option nograd must be a tuple or list of input names, not "
                            f"{show(v)}", hint="e.g. nograd=('W',)")
    names = tuple(_name(n) for n in v)
    if any(n is None for n in names):
        raise ArgumentError("option nograd must be a tuple or list of input names (strings), "
                            f"not {show(v)}", hint="e.g. nograd=('W',)")
    return tuple(dict.fromkeys(sorted(names) if isinstance(v, (set, frozenset)) else names))


def _ranges(v):
    if v is None:
        return ()
    if not isinstance(v, Mapping):
        raise ArgumentError(f"option ranges must be a dict from index names to ranges, not "
                            f"{show(v)}", hint="e.g. ranges={'i': range(0, 10)} or {'i': 10}")
    out = []
    for k, r in v.items():
        name = _name(k)
        if name is None:
            raise ArgumentError(f"option ranges: the keys must be index names (strings), not "
                                f"{show(k)}", hint="e.g. ranges={'i': range(0, 10)}")
        out.append((name, _range(name, r)))
    return tuple(out)


_CHECKS = {"threads": _threads, "target": _target, "grad": _switch("grad"), "nograd": _nograd,
           "ranges": _ranges, "fastmath": _switch("fastmath"), "verbose": _verbose, "pad": _pad,
           "blas": _switch("blas"), "fuse": _switch("fuse")}
NAMES = tuple(f.name for f in fields(Options))
