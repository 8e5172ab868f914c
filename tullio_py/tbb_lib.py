"""Finding and loading the TBB library numba's "tbb" threading layer needs (jit.py chooses the
layer).  The `tbb` wheel installs libtbb.so.12 into the environment's lib/, which the dynamic
loader does not search: it is loaded here by its path (RTLD_GLOBAL), after which numba's lookup
by name and its tbbpool extension's dependency find the loaded library."""
from __future__ import annotations

import os
import sys

_NAMES = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}


def load() -> bool:
    """Whether libtbb (2021.6 or later) loaded: by its path in the environment's lib/ or among
    the files of the installed `tbb` distribution (first: an older system copy found by name
    would shadow it), else by name."""
    import ctypes
    name = _NAMES.get(sys.platform)
    if name is None:
        return False
    lib = None
    for path in [*paths(name), name]:
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError:
            continue
    if lib is None:
        return False
    try:
        version = lib.TBB_runtime_interface_version
        version.restype = ctypes.c_int
        return version() >= 12060
    except (AttributeError, OSError):
        return False


def paths(name: str) -> list:
    """Existing files called `name` in the environment's lib/ folders, else among the files
    of the installed `tbb` distribution."""
    import site
    dirs = [os.path.join(p, "lib") for p in dict.fromkeys(
        [sys.prefix, sys.exec_prefix, sys.base_prefix, site.getuserbase()])]
    found = [p for p in dict.fromkeys(os.path.normpath(os.path.join(d, name)) for d in dirs)
             if os.path.exists(p)]
    if found:                   # the environment's own: its distribution's record not read
        return found
    try:
        from importlib import metadata
        for f in metadata.distribution("tbb").files or ():
            if f.name == name:
                dirs.append(os.path.dirname(str(f.locate())))
    except Exception:                    # no tbb distribution, or an unreadable record
        pass
    found = dict.fromkeys(os.path.normpath(os.path.join(d, name)) for d in dirs)
    return [p for p in found if os.path.exists(p)]
