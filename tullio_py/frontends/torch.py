"""torch tensors in, torch tensors out, differentiable through torch autograd.

`Kernel.__call__` hands a call with any torch tensor to torch_call.py, which picks the route;
this module converts and runs.  CPU tensors reach the
compiled loops as numpy views of their memory (`detach().numpy()`, no copy; any strides), after
resolving lazy conjugate/negative bits.  float16/bfloat16 have no numba loops: they are computed
in float32 and cast back.  The result dtype follows torch's promotion rules (dimensioned tensors
over 0-d tensors over Python scalars; integer inputs with a float operation give torch's default
dtype), which can differ from numpy's: the numpy result is cast when it does.

Autograd: when grad mode is on and a differentiable input requires grad, the call goes through
`torch_autograd.Apply` (a `torch.autograd.Function` with backward, forward-mode and vmap rules,
so torch.func's transforms compose with it); its backward runs the kernel's gradient kernels
(`Kernel.vjp`) for exactly the inputs in `ctx.needs_input_grad`, reading only the tensors the
gradient equations of the differentiable inputs read.

Under `torch.compile` the same computation is two custom ops (`tullio_py::forward`,
`tullio_py::vjp`, see torch_ops.py) with fake implementations and a registered autograd formula,
so a compiled model keeps one graph.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch.autograd import forward_ad as _forward_ad

from .. import blas, blas_threads, jit, memo
from ..errors import ArgumentError, GradientError
from ..ir import walk
from . import vjp as vjp_mod

HALF = (torch.float16, torch.bfloat16)
_CATEGORY = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}


# ----------------------------------------------------------------------------- conversion
def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory where possible (a copy only to resolve a lazy
    conj/neg bit or to widen half precision)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype in HALF:
        t = t.float()
    return t.numpy()


def placeholder(shape, dtype) -> np.ndarray:
    """An array of the given shape that owns no memory (every stride 0): for range inference
    where the values are never read."""
    return np.broadcast_to(np.zeros((), dtype), tuple(shape))


def _category(dt: torch.dtype) -> int:
    if dt == torch.bool:
        return 0
    if dt.is_complex:
        return 3
    return 2 if dt.is_floating_point else 1


class _Static:
    """What every call of one kernel asks of its statement, worked out once: the arrays read
    only as indices, the names whose values reach the result (in order), the parameters, the
    constants, the `nograd` names."""
    __slots__ = ("index_only", "reads", "params", "consts", "nograd", "fixed")

    def __init__(self, kernel):
        eq = kernel.equation
        self.index_only = frozenset({g.array for g in eq.gathers()}
                                    - {a.array for a in eq.accesses()})
        self.reads = [n for n in dict.fromkeys([a.array for a in eq.accesses()] + list(eq.params))
                      if n not in self.index_only]
        self.params = frozenset(eq.params)
        self.consts = [n.value for n in walk(eq.rhs) if n.__class__.__name__ == "Const"]
        self.nograd = frozenset(kernel.options.nograd)
        self.fixed = self.index_only | self.nograd          # never differentiable


_STATIC = memo.Memo("torch.static", 1024)      # Kernel (by identity) -> _Static


def _static(kernel) -> _Static:
    st = _STATIC.get(kernel)
    if st is None:
        st = _STATIC[kernel] = _Static(kernel)
    return st


def torch_result_dtype(kernel, values: dict, np_dtype: np.dtype) -> torch.dtype:
    """torch's promotion of the values the right-hand side reads (index arrays excluded), given
    the dtype numpy's rules chose (which tells whether the body makes integers float)."""
    st = _static(kernel)
    params = st.params
    dim, zero, scalars = None, None, []
    for n in st.reads:
        if n not in values:
            continue
        v = values[n]
        if isinstance(v, torch.Tensor):
            if v.ndim and n not in params:
                dim = v.dtype if dim is None else torch.promote_types(dim, v.dtype)
            else:
                zero = v.dtype if zero is None else torch.promote_types(zero, v.dtype)
        elif isinstance(v, np.ndarray):
            dt = _torch_dtype(v.dtype)
            if v.ndim and n not in params:
                dim = dt if dim is None else torch.promote_types(dim, dt)
            else:
                zero = dt if zero is None else torch.promote_types(zero, dt)
        else:
            scalars.append(v)
    scalars += st.consts
    out = dim
    if zero is not None and (out is None or _category(zero) > _category(out)):
        out = zero
    for s in scalars:
        cat = 0 if isinstance(s, (bool, np.bool_)) else 3 if isinstance(s, complex) else \
            2 if isinstance(s, (float, np.floating)) else 1
        if out is None or cat > _category(out):
            out = {0: torch.bool, 1: torch.int64, 2: torch.get_default_dtype(),
                   3: _complex_of(torch.get_default_dtype())}[cat] if out is None or cat != 3 \
                or not out.is_floating_point else _complex_of(out)
    if out is None:
        return _torch_dtype(np_dtype)
    kind = np_dtype.kind
    if kind in "biuf" and out.is_complex:      # complex values read only through abs/real/imag
        out = out.to_real()
    if kind in "fc" and _category(out) < 2:
        out = torch.get_default_dtype() if kind == "f" else _complex_of(torch.get_default_dtype())
    elif kind in "iu" and out == torch.bool:
        out = torch.int64
    return out


def _complex_of(dt: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(
        dt, torch.complex64)


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    return _TORCH[np.dtype(dt)]


def to_torch(a, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.asarray(a))
    return t if t.dtype == dtype else t.to(dtype)


# ----------------------------------------------------------------------------- the call
def torch_threads(f):
    """Run f with torch's intra-op thread count (torch.get_num_threads()) as the thread budget
    of the kernels it calls: torch and the kernels share one budget of threads.  Batched
    matrix products of contractions (blas.py, blas_shift.py) and blas_shift.py's copies run
    on torch's BLAS and thread pool meanwhile (torch_gemm, torch_copy), and what still goes
    to numpy's BLAS (einsum of three operands, views torch cannot take) runs on the calling
    thread alone: OpenBLAS's workers would spin beside torch's, and on one torch thread the
    budget is one thread.

    The rates of torch's gemm and numpy's are measured on this machine (gemm_rate.py).  On
    one thread no pool is shared, and where torch's gemm is the slower the products go to
    numpy's, on this thread (`torch_blas`: AMD Zen 5, torch's MKL sgemm 90 GFLOP/s against
    OpenBLAS's 175; a conv2d NHWC forward and backward 18.5 -> 13.2 ms).  On several, torch's
    pool takes them whatever its rate, and the cost model prices its gemm as measured
    (`torch_slowdown`): numpy's gemms on Python threads beside torch's spinning workers ran
    bench_layers' conv1d forward and backward 1.9 -> 2.3x torch's time on 2 threads."""
    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        if torch.compiler.is_compiling():       # traced, not run: the custom ops run it later
            return f(*args, **kwargs)
        n = torch.get_num_threads()
        if getattr(jit.budgets, "n", None) == n and getattr(blas.gemms, "f", None) is torch_gemm:
            return f(*args, **kwargs)               # inside a function that set both
        if not torch_blas(n) and blas_threads.available():
            with jit.thread_budget(1, 0):
                return blas_threads.single(functools.partial(f, *args, **kwargs))
        with jit.thread_budget(n, n - 1), blas.gemm_provider(torch_gemm, torch_copy,
                                                             torch_views, torch_slowdown(n)):
            if blas_threads.available():        # numpy's BLAS on this thread only
                return blas_threads.single(functools.partial(f, *args, **kwargs))
            return f(*args, **kwargs)
    return wrapped


_TORCH_BLAS = memo.Memo("torch.blas", 64)     # thread count -> (torch's, numpy's flop/s)


def gemm_rates(threads: int) -> tuple:
    """(torch's gemm flop/s on `threads` threads, numpy's on one): measured once per machine
    and thread count (gemm_rate.py, kept in the cache directory), on torch's setting now."""
    got = _TORCH_BLAS.get(threads)
    if got is None:
        from .. import gemm_rate
        got = _TORCH_BLAS[threads] = (
            gemm_rate.rate(f"torch {torch.__version__} on {threads} threads",
                           lambda a, b, out: torch_gemm(a, b, out, 1.0, 0), threads=threads),
            gemm_rate.rate("numpy", gemm_rate.numpy_gemm))
    return got


def torch_blas(threads: int) -> bool:
    """Whether the products of calls at `threads` torch threads go to torch's gemm
    (torch_gemm): on several threads always (one pool), on one where torch's gemm is measured
    at least as fast as numpy's."""
    if threads > 1:
        return True
    mine, numpy_rate = gemm_rates(1)
    return mine >= numpy_rate


def torch_slowdown(threads: int) -> float:
    """A product's time on torch's gemm over the cost model's, which counts numpy's gemm on
    each of the pool's `threads` threads (blas.gemm_provider's `slow`); at least 1/4."""
    if threads < 2:
        return 1.0
    mine, numpy_rate = gemm_rates(threads)
    return max(0.25, numpy_rate * threads / mine)


def torch_views(x: np.ndarray) -> bool:
    """Whether torch takes x as a tensor of its memory (torch.from_numpy): a native float or
    complex array, writeable, with non-negative strides that are whole elements."""
    return (x.dtype.kind in "fc" and x.dtype.isnative and x.flags.writeable
            and all(s >= 0 and s % x.itemsize == 0 for s in x.strides))


def torch_gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, alpha, beta,
               checked: bool = False) -> bool:
    """out = alpha * (a @ b) + beta * out (beta 0 or 1) on torch's BLAS and thread pool, for
    the calls of this frontend (blas.gemm_provider): numpy's matmul runs a batch of small
    products one after another on one thread, torch's batched gemm spreads them over its
    threads (and torch and the kernels then share one pool of BLAS threads).  False (numpy
    runs it) for arrays of other dtypes than out's, arrays torch cannot view or an output
    overlapping an input; `checked`: the caller has made sure of the last two (views of
    arrays it checked once with torch_views, into an output no read shares memory with)."""
    if a.dtype != out.dtype or b.dtype != out.dtype:
        return False
    if not checked and not (torch_views(a) and torch_views(b) and torch_views(out)
                            and not np.may_share_memory(out, a)
                            and not np.may_share_memory(out, b)):
        return False
    if out.strides[-1] != out.itemsize and out.strides[-2] == out.itemsize and out.shape[-1] > 1:
        # a column-major output: out^T = b^T a^T, so the gemm writes rows (torch's batched
        # gemm into a transposed output ran up to 100x slower)
        a, b, out = b.swapaxes(-1, -2), a.swapaxes(-1, -2), out.swapaxes(-1, -2)
    ta, tb, to = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
    if to.ndim == 2:
        torch.addmm(to, ta, tb, beta=beta, alpha=alpha, out=to)
        return True
    m, k, n = ta.shape[-2], ta.shape[-1], tb.shape[-1]
    try:
        o3 = to.view(-1, m, n)
    except RuntimeError:            # batch axes that do not merge without a copy
        o3 = None
    if o3 is not None and o3.is_contiguous():
        batch = to.shape[:-2]       # operands' batch axes of length 1 are broadcast
        torch.baddbmm(o3, ta.expand(*batch, m, k).reshape(-1, m, k),
                      tb.expand(*batch, k, n).reshape(-1, k, n), beta=beta, alpha=alpha, out=o3)
        return True
    # matrices that are not one block of memory (padded rows, a slice of the batch): torch's
    # batched gemm into them ran one gemm per matrix, a parallel region each (32 of them:
    # 0.4 ms idle, 500 ms at load 8), so the product goes to a new block and is added
    r = torch.matmul(ta, tb)
    if beta:
        to.add_(r, alpha=alpha)
    else:
        to.copy_(r if alpha == 1 else r.mul_(alpha))
    return True


def torch_copy(dst: np.ndarray, src: np.ndarray, add: bool = False,
               checked: bool = False) -> bool:
    """dst[...] = src (`add`: dst += src) on torch's thread pool (blas.gemm_provider): numpy
    copies an im2col view (overlapping axes, short inner runs) on one thread, element run by
    element run, and adds a product into a shifted window of the output (a convolution's
    input gradient) on one thread; torch spreads them over its threads.  False (numpy copies)
    for other shapes or dtypes, arrays torch cannot view or sharing memory; `checked`: as for
    torch_gemm."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        return False
    if not checked and not (torch_views(dst) and torch_views(src)
                            and not np.may_share_memory(dst, src)):
        return False
    if add:
        torch.from_numpy(dst).add_(torch.from_numpy(src))
    else:
        torch.from_numpy(dst).copy_(torch.from_numpy(src))
    return True


def is_wrapped(t: torch.Tensor) -> bool:
    """Whether t is a torch.func transform's wrapper (vmap's batched tensor, grad's or jvp's
    tracking tensor) or a forward-mode dual tensor: such a call goes through the autograd
    Function, whose rules handle it."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t) or \
        (getattr(_forward_ad, "_current_level", 0) >= 0
         and _forward_ad.unpack_dual(t).tangent is not None)


class Spec:
    """What one call passes: the kernel, which names are tensors (in a fixed order), which are
    Python scalars or numpy arrays, and which tensors can carry a gradient."""

    def __init__(self, kernel, tensors: tuple, others: tuple, diff: tuple):
        self.kernel, self.tensors, self.others, self.diff = kernel, tensors, others, diff

    @classmethod
    def of(cls, kernel, arrays: dict) -> "Spec":
        fixed = _static(kernel).fixed
        tensors, others, diff = [], [], []
        for n, v in arrays.items():
            if isinstance(v, torch.Tensor):
                tensors.append(n)
                if n not in fixed and (v.is_floating_point() or v.is_complex()):
                    diff.append(n)
            else:
                others.append(n)
        return cls(kernel, tuple(tensors), tuple(others), tuple(diff))

    def scalar_values(self, arrays: dict) -> dict:
        return {n: arrays[n] for n in self.others}


@torch_threads
def run_forward(spec: Spec, tensors, others: dict) -> torch.Tensor:
    """Forward without autograd: numpy views in, the numpy result wrapped (no copy unless
    torch's result dtype differs from numpy's)."""
    values = dict(zip(spec.tensors, tensors))
    params = _static(spec.kernel).params
    np_arrays = {n: param_value(t) if n in params else to_numpy(t) for n, t in values.items()}
    np_arrays.update(others)
    out = spec.kernel(**np_arrays)
    return to_torch(out, torch_result_dtype(spec.kernel, {**values, **others},
                                            np.asarray(out).dtype))


def param_value(t: torch.Tensor):
    """A tensor passed as a scalar parameter: its value (the kernels take parameters as
    runtime scalars)."""
    if t.numel() != 1:
        raise ArgumentError(f"a scalar parameter must be a single number, got a tensor of shape "
                            f"{tuple(t.shape)}")
    return t.detach().reshape(()).numpy()


@torch_threads
def run_backward(spec: Spec, others: dict, saved: dict, shapes: dict, gout: torch.Tensor, out,
                 needs, views: bool = False) -> list:
    """Gradients (torch tensors, or None) for spec.tensors, computed by the kernel's vjp for
    the names in `needs`; arrays not saved are zero-stride placeholders.  `views`: a gradient
    constant along some dimensions may be an expanded tensor (Gradient.vjp_views)."""
    kernel = spec.kernel
    np_arrays = {}
    for n in spec.tensors:
        if n in saved:
            np_arrays[n] = param_value(saved[n]) if n in kernel.equation.params \
                else to_numpy(saved[n])
        else:
            shape, dt = shapes[n]
            np_arrays[n] = placeholder(shape, np_compute_dtype(dt))
    np_arrays.update(others)
    grads = vjp_mod.vjp(kernel, to_numpy(gout), np_arrays, needs,
                        None if out is None else to_numpy(out), views)
    result = []
    for n in spec.tensors:
        if n in needs and grads.get(n) is not None:
            dt = shapes[n][1]
            g = grads[n]
            result.append(to_torch(g, dt) if np.ndim(g) or n not in kernel.equation.params
                          else torch.tensor(g, dtype=dt).reshape(shapes[n][0]))
        else:
            result.append(None)
    return result


_NUMPY = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float32,
          torch.bfloat16: np.float32, torch.float32: np.float32, torch.float64: np.float64,
          torch.complex64: np.complex64, torch.complex128: np.complex128}
_TORCH = {np.dtype(v): k for k, v in _NUMPY.items() if k not in HALF}   # numpy dtype -> torch dtype


def np_compute_dtype(dt: torch.dtype) -> np.dtype:
    """The numpy dtype a tensor of dtype dt is computed in (no tensor is made: this also runs
    under torch.compile's fake tensors)."""
    return np.dtype(_NUMPY[dt])


def no_second_order(spec: Spec, grads: list, deps: list) -> list:
    deps = [d for d in deps if d.requires_grad]
    made = [g for g in grads if g is not None]
    if not deps or not made:
        return grads
    wrapped = iter(_NoSecondOrder.apply(spec, len(made), *made, *deps))
    return [None if g is None else next(wrapped) for g in grads]


class _NoSecondOrder(torch.autograd.Function):
    """Identity on first-order gradients, tied to what they depend on, whose backward raises:
    a second derivative through a tullio_py kernel is an error, never a silently missing term."""

    @staticmethod
    def forward(ctx, spec, n, *tensors):
        ctx.text = spec.kernel.text
        return tuple(t.view_as(t) for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise GradientError("double backward (a gradient of a gradient) through a tullio_py "
                            "kernel is not supported", ctx.text, None,
                            "differentiate once, or write the first derivative as its own "
                            "tullio_py expression")


# ----------------------------------------------------------------------------- in place
