"""Bounded in-memory memos, registered in one place so `clear_cache()` can empty them all.

Every result tullio_py remembers in memory (kernels per expression and options, derivations,
compiled functions, plans and replayed calls per call signature) lives in a `Memo`: a dict
with a size bound and a name.  Past the bound the oldest entry is dropped, so a program that
calls one kernel with ever new shapes holds at most `maxsize` specialisations, never an
unbounded list.  Reads are plain `dict.get` (the call path's hot lookup costs what a dict costs);
only inserting checks the bound.

    >>> m = Memo("example", maxsize=2)
    >>> m["a"], m["b"], m["c"] = 1, 2, 3        # "a" is the oldest: dropped
    >>> sorted(m), m.get("a")
    (['b', 'c'], None)

Every Memo, module-level or belonging to one Kernel, is registered (weakly: a Kernel that is
garbage-collected takes its memos with it); `clear_all()` empties every live one.
"""
from __future__ import annotations

import functools
import weakref

_REGISTRY: "weakref.WeakSet[Memo]" = weakref.WeakSet()
_FUNCTIONS: list = []          # functools.lru_cache'd functions (pure functions of frozen IR)


def lru(maxsize: int):
    """functools.lru_cache(maxsize), registered so clear_all() empties it too."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _FUNCTIONS.append(cached)
        return cached
    return wrap


class Memo(dict):
    """A dict that keeps at most `maxsize` entries (oldest inserted dropped first).
    `on_drop(value)`, if given, is called for each value the bound or clear_all() drops."""

    def __init__(self, name: str, maxsize: int, on_drop=None):
        super().__init__()
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.name = name
        self.maxsize = maxsize
        self.on_drop = on_drop
        _REGISTRY.add(self)

    def __setitem__(self, key, value):
        if key not in self:
            while len(self) >= self.maxsize:
                try:      # another thread may drop the same oldest entry: pop with a default
                    dropped = self.pop(next(iter(self)), None)
                except (StopIteration, RuntimeError):
                    break
                if dropped is not None and self.on_drop is not None:
                    self.on_drop(dropped)
        super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs):
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __hash__(self):           # registered in a WeakSet, which hashes by identity
        return id(self)

    def __repr__(self):
        return f"Memo({self.name!r}, {len(self)}/{self.maxsize})"


def clear_all() -> int:
    """Empty every live memo; returns how many entries were dropped."""
    dropped = 0
    for m in list(_REGISTRY):
        dropped += len(m)
        values = list(m.values()) if m.on_drop is not None else ()
        dict.clear(m)
        for v in values:
            m.on_drop(v)
    for fn in _FUNCTIONS:
        dropped += fn.cache_info().currsize
        fn.cache_clear()
    return dropped


def registered() -> list:
    """Every live Memo and every lru-cached function: what clear_all() empties."""
    return list(_REGISTRY) + list(_FUNCTIONS)


def sizes() -> dict[str, int]:
    """{memo name: entries held}, summed over memos of the same name (one per Kernel)."""
    out: dict[str, int] = {}
    for m in list(_REGISTRY):
        out[m.name] = out.get(m.name, 0) + len(m)
    for fn in _FUNCTIONS:
        name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        out[name] = fn.cache_info().currsize
    return out
