"""The on-disk cache: generated kernel modules (with numba's compiled code beside them) and
pickled derivations, under $TULLIO_CACHE_DIR (default: the user cache directory).

    <dir>/kernels/_tullio_<sha256>.py      generated module; the name is the hash of the text
    <dir>/kernels/__pycache__/...           numba's `cache=True` files for that module
    <dir>/pickles/<sha256 of key>.pkl      sha256 of the payload, newline, payload (the key's
                                            text is signature.stable's, never a repr)

Why files: numba can only cache a function that lives in a real source file, and it reloads it
in a new process only if the module is importable by name (it looks the module up in
sys.modules), so a module is registered there before its code runs.

Safety: files are written to a temporary name and renamed into place, so a reader never sees a
partial file; the directories are user-only.  A module is executed only if its bytes hash to
the name it is stored under, a pickle only if its payload matches its stored hash: a truncated
or corrupted file is rewritten, never run.  Least recently used entries are removed when the
directory grows past TULLIO_CACHE_SIZE_MB (default 512).  `TULLIO_CACHE_DIR=` (set and empty)
disables the disk cache; nothing is then written anywhere.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

from . import signature

_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# tullio_py cache: safe to delete\n"
_made: set[Path] = set()          # directories created or checked in this process


class Stats:
    """What the cache did in this process (read by tests and benchmarks).  `compiles` and
    `disk_hits` are counted by jit.py from numba's own per-signature counters."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.modules_written = 0     # generated module files written
        self.modules_reused = 0      # existing, intact module files used as they were
        self.modules_rebuilt = 0     # corrupt or truncated module files replaced
        self.pickle_hits = 0
        self.pickle_misses = 0
        self.pickles_written = 0
        self.pruned = 0              # entries removed by the size bound
        self.log: list[tuple[str, str]] = []   # (event, file stem), in order

    def event(self, what: str, name: str):
        self.log.append((what, name))

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "log"}


stats = Stats()


class CompileStats:
    """Counters for this process (jit.stats).  `compiles`: specialisations numba compiled;
    `disk_hits`: specialisations loaded from numba's disk cache instead (numba's counters on
    the compiled functions in `loaded`, jit.py's memo); the rest comes from `stats` (module
    files written / reused / rebuilt, pickles, pruning) and `log` lists file events."""

    def __init__(self, loaded: dict):
        self.loaded = loaded
        self.retired = [0, 0]       # the counts of functions `loaded` no longer holds

    def retire(self, fn) -> None:
        """`fn` leaves `loaded` (its bound, clear_cache()): its counts stay in the totals."""
        hits, misses = self._counts(fn)
        self.retired[0] += hits
        self.retired[1] += misses

    @staticmethod
    def _counts(fn):
        st = getattr(fn, "stats", None)
        if st is None:
            return 0, 0
        return sum(st.cache_hits.values()), sum(st.cache_misses.values())

    def _numba_counts(self):
        hits, misses = self.retired
        for fn in list(self.loaded.values()):
            h, m = self._counts(fn)
            hits += h
            misses += m
        return hits, misses

    @property
    def compiles(self) -> int:
        return self._numba_counts()[1]

    @property
    def disk_hits(self) -> int:
        return self._numba_counts()[0]

    def __getattr__(self, name):
        return getattr(stats, name)

    def snapshot(self) -> dict:
        hits, misses = self._numba_counts()
        return {"compiles": misses, "disk_hits": hits, "kernels_loaded": len(self.loaded),
                **stats.as_dict()}

    def __repr__(self):
        return f"jit.stats({self.snapshot()})"


# ----------------------------------------------------------------------------- location
def directory() -> Path | None:
    """The cache root, or None when disabled.  Read from the environment on every use, so tests
    (and users) can switch it at run time."""
    env = os.environ.get("TULLIO_CACHE_DIR")
    if env is not None:
        return Path(os.path.expanduser(env)) if env.strip() else None
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~\\AppData\\Local")
        return Path(base) / "tullio_py" / "Cache"
    if sys.platform == "darwin":
        return Path(os.path.expanduser("~/Library/Caches/tullio_py"))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "tullio_py"


def _subdir(name: str) -> Path | None:
    root = directory()
    if root is None:
        return None
    d = root / name
    if d not in _made:
        fresh_root = not root.exists()
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        # mkdir's mode is filtered by the umask; a root the user made is left as it is.
        for p in ((root, d) if fresh_root else (d,)):
            os.chmod(p, 0o700)
        if name == "kernels":     # numba writes its files here; make it user-only up front
            (d / "__pycache__").mkdir(exist_ok=True, mode=0o700)
        tag = root / "CACHEDIR.TAG"   # tells backup tools to skip the directory
        if not tag.exists():
            _write_atomic(tag, _TAG.encode())
        _made.add(d)
    return d


def _write_atomic(path: Path, data: bytes, replace: bool = True) -> bool:
    """Write `data` to `path` through a temporary file in the same directory (mode 0600).
    With replace=False an existing file is left alone (hard link, which fails if the name
    exists); returns whether this call put its data there."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if not replace:
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            except OSError:
                pass              # no hard links on this file system: rename instead
        os.replace(tmp, path)
        tmp = None
        return True
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _touch(path: Path):
    """Mark as used now for the LRU bound: set the access time, keep the modification time."""
    try:
        st = path.stat()
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except OSError:
        pass


def digest(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- kernel modules
def load_module(text: str) -> types.ModuleType | None:
    """Import `text` as a module backed by a file in the cache (written if absent or damaged).
    None when the cache is disabled or unwritable: the caller then executes it in memory."""
    try:
        d = _subdir("kernels")
    except OSError:
        return None
    if d is None:
        return None
    data = text.encode()
    stem = "_tullio_" + digest(data)[:40]
    path = d / (stem + ".py")
    try:
        if _write_atomic(path, data, replace=False):
            stats.modules_written += 1
            stats.event("write", stem)
            prune()
        elif path.read_bytes() == data:   # same bytes <=> hashes to its name
            stats.modules_reused += 1
            stats.event("reuse", stem)
        else:
            _write_atomic(path, data)
            stats.modules_rebuilt += 1
            stats.event("rebuild", stem)
        _touch(path)
    except OSError:
        return None
    # One Python thread at a time registers and runs a module: the module is in sys.modules
    # before its code has run (numba finds it by that name), and another thread taking it from
    # there meanwhile would read a namespace without the kernel yet.
    with _MODULES:
        module = sys.modules.get(stem)
        if module is None:
            module = types.ModuleType(stem)
            module.__file__ = str(path)
            sys.modules[stem] = module    # before running it: numba finds it by this name
            # The verified in-memory bytes are what runs, not a second read of the file.
            try:
                exec(compile(text, str(path), "exec"), module.__dict__)
            except BaseException:         # nothing half-loaded stays registered
                del sys.modules[stem]
                raise
    return module


_MODULES = threading.RLock()


# ----------------------------------------------------------------------------- pickles
_FINGERPRINT: str | None = None


def code_fingerprint() -> str:
    """Version plus sizes and mtimes of this package's source files, so an edited checkout
    never reads derivations pickled by older code of the same version number."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        from .version import __version__
        here = Path(__file__).parent
        parts = [__version__, sys.version.split()[0]]
        for p in sorted(here.rglob("*.py")):
            st = p.stat()
            parts.append(f"{p.relative_to(here)}:{st.st_size}:{st.st_mtime_ns}")
        _FINGERPRINT = digest("\n".join(parts))
    return _FINGERPRINT


def _pickle_path(key) -> Path | None:
    d = _subdir("pickles")
    if d is None:
        return None
    return d / (signature.digest((code_fingerprint(), key))[:40] + ".pkl")


def load_pickle(key):
    """The object stored under `key` (a value `signature.stable` writes: strings, numbers,
    tuples of them, signatures), or None when absent, damaged, or the cache is disabled."""
    try:
        path = _pickle_path(key)
        if path is None:
            return None
        blob = path.read_bytes()
    except OSError:
        stats.pickle_misses += 1
        return None
    head, _, payload = blob.partition(b"\n")
    if head.decode("ascii", "replace") != digest(payload):
        stats.pickle_misses += 1
        stats.event("bad pickle", path.stem)
        return None
    try:
        obj = pickle.loads(payload)
    except Exception:          # e.g. a class renamed since it was written
        stats.pickle_misses += 1
        return None
    stats.pickle_hits += 1
    _touch(path)
    return obj


def store_pickle(key, obj) -> bool:
    """Store `obj` under `key`; returns False (and stores nothing) when disabled or on error."""
    try:
        path = _pickle_path(key)
        if path is None:
            return False
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        _write_atomic(path, digest(payload).encode() + b"\n" + payload)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return False
    stats.pickles_written += 1
    prune()
    return True


# ----------------------------------------------------------------------------- housekeeping
def limit_bytes() -> int:
    try:
        return int(float(os.environ.get("TULLIO_CACHE_SIZE_MB", "512")) * 2**20)
    except ValueError:
        return 512 * 2**20


def _entries(root: Path) -> dict[str, list]:
    """stem -> [last use, total bytes, paths]; a kernel's entry is its module plus every file
    numba made for it (they share the stem before the first dot)."""
    out: dict[str, list] = {}
    for sub in ("kernels", "kernels/__pycache__", "pickles"):
        try:
            it = os.scandir(root / sub)
        except OSError:
            continue
        with it:
            for e in it:
                if not e.is_file(follow_symlinks=False):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if e.name.startswith(".tmp-"):
                    if time.time() - st.st_mtime > 3600:   # left by a killed process
                        _unlink(Path(e.path))
                    continue
                stem = e.name.split(".", 1)[0]
                ent = out.setdefault(sub[:7] + "/" + stem, [0.0, 0, []])
                ent[1] += st.st_size
                ent[2].append(Path(e.path))
                if e.name.endswith((".py", ".pkl")):
                    ent[0] = st.st_atime
    return out


def _unlink(p: Path):
    try:
        p.unlink()
    except OSError:
        pass


def size() -> int:
    root = directory()
    return 0 if root is None else sum(e[1] for e in _entries(root).values())


def prune(limit: int | None = None) -> int:
    """Remove least recently used entries until the cache is under `limit` bytes (default:
    TULLIO_CACHE_SIZE_MB).  Returns how many entries were removed."""
    root = directory()
    if root is None:
        return 0
    limit = limit_bytes() if limit is None else limit
    entries = _entries(root)
    total = sum(e[1] for e in entries.values())
    removed = 0
    for stem, (used, nbytes, paths) in sorted(entries.items(), key=lambda kv: kv[1][0]):
        if total <= limit:
            break
        for p in paths:
            _unlink(p)
        total -= nbytes
        removed += 1
    stats.pruned += removed
    return removed


def clear() -> None:
    """Empty the disk cache (kernels and derivations).  Kernels already loaded in this process
    keep working; they are compiled again (and re-cached) by the next process that needs them."""
    _made.clear()             # directories are checked (and made) again on next use
    root = directory()
    if root is None:
        return
    for sub in ("kernels/__pycache__", "kernels", "pickles"):
        d = root / sub
        try:
            it = list(os.scandir(d))
        except OSError:
            continue
        for e in it:
            if e.is_file(follow_symlinks=False) or e.is_symlink():
                _unlink(Path(e.path))
