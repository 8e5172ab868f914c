"""CUDA arrays in, CUDA arrays out (target "cuda").

Torch CUDA tensors, CuPy arrays and numba device arrays are viewed through
`__cuda_array_interface__` (no copies); the result is allocated by the inputs' own library, so
torch in gives torch out.  numpy inputs with `target="cuda"` are copied to the device and the
result copied back (an in-place output is updated in place).  GPU and host arrays in one call
are an error rather than a silent copy.

The checks a CPU call makes (names, ranks, dtypes, ranges, gathers' bounds) run unchanged on
zero-stride host placeholders of the device arrays' shapes and dtypes, so errors read the same
on every target.  numba is imported only when a call runs here (`import tullio_py` stays fast).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .. import bind as binding
from .. import codegen, dtypes, jit, memo, overlap, rewrite, schedule
from ..codegen import cuda as codegen_cuda
from ..errors import ArgumentError
from ..signature import CompileKey


# ----------------------------------------------------------------------------- where arrays live
def on_device(v) -> bool:
    """Whether v is an array in GPU memory (never copies, never imports a library)."""
    if isinstance(v, (np.ndarray, np.generic, int, float, complex, list, tuple)):
        return False
    mod = type(v).__module__
    if mod.startswith("torch"):
        return getattr(v, "is_cuda", False) is True
    if mod.startswith("numba"):        # numba's device arrays, also the simulator's
        return hasattr(v, "copy_to_host")
    try:
        return hasattr(v, "__cuda_array_interface__")
    except Exception:                  # some libraries raise other errors from the property
        return False


def wants_cuda(kernel, arrays: dict) -> bool:
    """target="cuda", or target="auto" with some input on a GPU."""
    if kernel.target == "cuda":
        return True
    return kernel.target == "auto" and any(
        v.__class__ is not np.ndarray and on_device(v) for v in arrays.values())


def library(v) -> str:
    mod = type(v).__module__.split(".")[0]
    return mod if mod in ("torch", "cupy") else "numba"


def as_numba(v):
    """A numba device array viewing v's memory."""
    from numba import cuda
    if type(v).__module__.startswith("numba"):
        return v
    if type(v).__module__.startswith("torch"):
        v = v.detach()
    return cuda.as_cuda_array(v)


def host_scalar(v):
    """The value of a one-element array in GPU memory, as a numpy scalar of its dtype."""
    return np.asarray(as_numba(v).copy_to_host()).reshape(())[()]


def one_d(a):
    """0-d arrays are passed as one element, as on the CPU."""
    return a.reshape(1) if len(a.shape) == 0 else a


# ----------------------------------------------------------------------------- preparation
@dataclass(frozen=True)
class Prepared:
    fns: dict
    source: codegen_cuda.CudaSource
    plan: schedule.Plan
    equation: object
    snapshot: bool


def prepare(kernel, checked: dict, rng: dict, dtype: np.dtype, out_shape):
    """(Prepared, ranges of the rewritten equation, extra bound parameters): the shifted-LHS
    rewrite and in-place snapshot exactly as on the CPU, then the CUDA source, cached."""
    low = rewrite.lower(kernel.equation, rng, out_shape)
    work_eq, call_ranges, extra = low.equation, low.ranges, low.bound_params
    snapshot = low.snapshot
    # device arrays are seen through zero-stride placeholders: no layout in the key
    key = CompileKey.of(str(work_eq), dtype, "cuda", False, (), checked, layouts=False)
    prepared = kernel.compiled.get(key)
    if prepared is None:
        plan = schedule.plan(work_eq, call_ranges, dtype.name, threads=False,
                             pad_value=kernel.pad, fastmath=kernel.fastmath)
        plan = dtypes.with_dtypes(plan, checked)
        source = codegen_cuda.render(plan)
        if kernel.verbose >= 2:
            print(source.text)
        prepared = Prepared(load(source), source, plan, work_eq, snapshot)
        kernel.compiled[key] = prepared
    return prepared, call_ranges, extra


def gather_extrema(eq, arrays: dict) -> dict:
    """{index array: (min, max)} of the gathers' index arrays (host or device arrays; a device
    array is copied to the host for this)."""
    extrema = {}
    for g in eq.gathers():
        a = arrays.get(g.array)
        if a is not None and g.array not in extrema and int(np.prod(a.shape)):
            J = a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)
            extrema[g.array] = (int(J.min()), int(J.max()))
    return extrema


def check(kernel, shapes_dtypes: dict, params: dict, extrema: dict):
    """The CPU call's checks (bind.py) on placeholders: (checked arrays, ranges, out dtype,
    out shape, fill)."""
    b = binding.bind(kernel.equation, kernel.options,
                     {**{n: binding.ArrayInfo(s, d) for n, (s, d) in shapes_dtypes.items()},
                      **params}, extrema)
    return b.arrays, b.ranges, b.dtype, b.shape, b.fill


def arguments(prepared: Prepared, eq, values: dict, call_ranges: dict, extra: dict) -> list:
    """Positional arguments of the generated kernels; `values` maps array names (and
    "_old_<out>", "_red") to what is passed."""
    return codegen.arguments(prepared.source.args, values, call_ranges, extra)


# ----------------------------------------------------------------------------- the call
def call(kernel, arrays: dict):
    from numba import cuda
    eq = kernel.equation
    params = {}
    for n in eq.params:
        if n in arrays:
            v = arrays[n]
            params[n] = host_scalar(v).item() if on_device(v) else v
    names = [n for n in arrays if n not in params]
    on_gpu = [n for n in names if on_device(arrays[n])]
    on_host = [n for n in names if n not in on_gpu and not isinstance(arrays[n], (int, float, complex))]
    if on_gpu and on_host:
        raise ArgumentError(
            f"arrays in GPU memory ({', '.join(on_gpu)}) and in host memory "
            f"({', '.join(on_host)}) in one call", eq.text, None,
            "move them all to the GPU, or pass only host arrays with target='cuda' (copied to "
            "the device and back)")
    host_mode = not on_gpu
    dev, host = {}, {}
    for n in names:
        if host_mode:
            h = np.asarray(arrays[n])
            host[n] = h
            dev[n] = cuda.to_device(h if h.flags.c_contiguous else np.ascontiguousarray(h))
        else:
            dev[n] = as_numba(arrays[n])
    lib = "numba"
    if on_gpu:
        libs = {library(arrays[n]) for n in on_gpu}
        lib = "torch" if "torch" in libs else "cupy" if "cupy" in libs else "numba"
    extrema = gather_extrema(eq, host if host_mode else dev)
    checked, rng, dtype, out_shape, fill = check(
        kernel, {n: (d.shape, d.dtype) for n, d in dev.items()}, params, extrema)
    ref = arrays[on_gpu[0]] if on_gpu else None
    if eq.assign == ":=":
        out, user_out = alloc(lib, out_shape, dtype, kernel.pad if fill else None, ref)
    else:
        out, user_out = dev[eq.output], arrays[eq.output]
    prepared, call_ranges, extra = prepare(kernel, checked, rng, dtype, out_shape)
    values = {n: one_d(d) for n, d in dev.items()}
    values.update(params)
    values[eq.output] = one_d(out)
    if prepared.snapshot:
        values["_old_" + eq.output] = one_d(device_copy(out))
    if eq.assign != ":=" and not host_mode:     # an input in the output's memory: its snapshot
        for n in eq.arrays:
            if n != eq.output and n in dev and overlap.device_overlaps(dev[n], out):
                values[n] = one_d(device_copy(dev[n]))
    launch(kernel, prepared, values, call_ranges, extra, stream_for(lib, ref))
    kernel.last = prepared
    if host_mode:
        result = out.copy_to_host().reshape(out_shape)
        if eq.assign == ":=":
            return result
        host_out = arrays[eq.output]
        host_out[...] = result
        return host_out
    if eq.assign != ":=":
        return user_out
    return user_out.reshape(out_shape) if lib != "numba" else (
        user_out if len(out_shape) else user_out.reshape(()) if _can_0d(user_out) else user_out)


def launch(kernel, prepared: Prepared, values: dict, call_ranges: dict, extra: dict, stream):
    """Launch the generated kernels of one statement (`values`: numba views and scalars)."""
    from numba import cuda
    src = prepared.source
    cfg = codegen_cuda.launch_config(src, [len(call_ranges[v]) for v in src.threaded],
                                     kernel.threads)
    if src.kind == "scalar":
        size = 1 if src.atomic else (int(np.prod(cfg[0])) if cfg else 0)
        values["_red"] = cuda.device_array(size, np.dtype(src.scratch))
    args = arguments(prepared, prepared.equation, values, call_ranges, extra)
    for name in src.kernels:
        fn = prepared.fns[name]
        if name == "_tullio_finish" or (name == "_tullio_init" and src.kind == "scalar"):
            fn[1, 1, stream](*args)
        elif cfg is not None:
            grid, block, shmem = cfg
            fn[grid, block, stream, shmem](*args)


def _can_0d(a) -> bool:
    try:
        a.reshape(())
        return True
    except Exception:
        return False


def alloc(lib: str, shape, dtype: np.dtype, fill, ref):
    """(numba view, the library's own array) of a new output; 0-d outputs get one element."""
    from numba import cuda
    phys = tuple(shape) or (1,)
    if lib == "torch":
        torch = sys.modules["torch"]
        tdt = torch.from_numpy(np.empty(0, dtype)).dtype
        t = torch.empty(phys, dtype=tdt, device=ref.device) if fill is None else \
            torch.full(phys, fill, dtype=tdt, device=ref.device)
        return cuda.as_cuda_array(t), t
    if lib == "cupy":
        cp = sys.modules["cupy"]
        a = cp.empty(phys, dtype) if fill is None else cp.full(phys, fill, dtype)
        return cuda.as_cuda_array(a), a
    if fill is None:
        d = cuda.device_array(phys, dtype)
    else:
        d = cuda.to_device(np.full(phys, fill, dtype))
    return d, d


def device_copy(a):
    """A device copy of a device array (the snapshot an in-place statement reads)."""
    from numba import cuda
    try:
        c = cuda.device_array(a.shape, a.dtype)
        c.copy_to_device(a)
        return c
    except Exception:          # layouts copy_to_device refuses: through the host
        return cuda.to_device(np.ascontiguousarray(a.copy_to_host()))


def stream_for(lib: str, ref):
    """Launch on the stream the inputs' library is using, so work stays ordered with it."""
    from numba import cuda
    if lib == "torch":
        torch = sys.modules["torch"]
        return cuda.external_stream(torch.cuda.current_stream(ref.device).cuda_stream)
    if lib == "cupy":
        return cuda.external_stream(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return 0


# ----------------------------------------------------------------------------- PTX, no GPU needed
def ptx(kernel, arrays: dict, cc=(9, 0)) -> tuple[codegen_cuda.CudaSource, dict]:
    """(source, {kernel name: PTX text}) of what a call with these host arrays would launch,
    compiled for compute capability `cc` by NVVM without a GPU (device arrays of the same
    dtypes, ranks and layouts get the same code)."""
    from numba import cuda, typeof
    eq = kernel.equation
    params = {n: arrays[n] for n in eq.params if n in arrays}
    host = {n: np.asarray(v) for n, v in arrays.items() if n not in params}
    extrema = gather_extrema(eq, host)
    checked, rng, dtype, out_shape, _ = check(
        kernel, {n: (a.shape, a.dtype) for n, a in host.items()}, params, extrema)
    prepared, call_ranges, extra = prepare(kernel, checked, rng, dtype, out_shape)
    src = prepared.source
    out = np.empty(out_shape, dtype) if eq.assign == ":=" else host[eq.output]
    values = {n: one_d(a) for n, a in host.items()}
    values.update({n: checked[n] for n in params})
    values[eq.output] = one_d(out)
    values["_old_" + eq.output] = values[eq.output]
    if src.kind == "scalar":
        values["_red"] = np.empty(1, np.dtype(src.scratch))
    sig = tuple(typeof(a) for a in arguments(prepared, prepared.equation, values, call_ranges,
                                             extra))
    out = {}
    for name in src.kernels:
        key = (src.text, name, sig, tuple(cc), src.fastmath)
        if key not in _PTX:
            _PTX[key] = cuda.compile_ptx(prepared.fns[name].py_func, sig, cc=cc,
                                         fastmath=src.fastmath)[0]
        out[name] = _PTX[key]
    return src, out


_PTX = memo.Memo("cuda.ptx", 256)


_LOADED = memo.Memo("cuda.loaded", 256)


def load(source) -> dict:
    """{kernel name: numba-cuda dispatcher} for a codegen.cuda.CudaSource, cached in memory.
    Not written to the disk cache: numba-cuda compiles each dispatcher lazily per signature."""
    key = (source.text, source.fastmath)
    fns = _LOADED.get(key)
    if fns is None:
        from numba import cuda
        namespace: dict = {"__name__": "tullio_py_generated_cuda"}
        exec(compile(jit.cuda_module_text(source), "<tullio_py cuda kernel>", "exec"), namespace)
        fns = {n: cuda.jit(fastmath=source.fastmath)(namespace[n]) for n in source.kernels}
        _LOADED[key] = fns
    return fns
