"""numba intrinsics and overloads the generated CPU kernels use (imported by jit.py, and by
kernels, only once numba is wanted).

`register()` makes vecmath's bit-level helpers (pow2, ldexp_shifted, exponent, mantissa),
fused multiply-add and IEEE maximum/minimum compile to LLVM operations, and the vecmath
functions callable from each other.  `wide_vectors()` marks the compiled function it is
called in to use the widest vector registers of the machine (512-bit with AVX-512, which
LLVM otherwise avoids on many x86 CPUs): the register-blocked row form (codegen/blocked.py)
calls it.
`shifted_rows(buf, lo, stop)` is `buf` seen from row `lo` on: a block's rows of an array
that lives only in one block of a row group (codegen/rows.py's block-local arrays).
`call_threads()` is the number of threads numba runs this call's parallel loops on.
"""
from __future__ import annotations

from . import vecmath

_MADE: dict = {}        # the intrinsics made on first use (module __getattr__), by name


def ldexp_shifted(scalef: bool):
    """The intrinsic for vecmath.ldexp_shifted(y, t): n = bits(t) - bits(SHIFT), then
    llvm.ldexp(y, n) where `scalef` (one vscalef instruction with AVX-512; elsewhere LLVM would
    call libm's ldexp per element), else y * 2**(n >> 1) * 2**(n - (n >> 1)), each factor
    `(n + bias) << mantissa bits`."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    def codegen(context, builder, sig, args):
        b, (y, t) = builder, args
        width, mant, bias = (32, 23, 127) if sig.args[0].bitwidth == 32 else (64, 52, 1023)
        ity = ir.IntType(width)
        shift = ir.Constant(y.type, 1.5 * 2.0 ** mant).bitcast(ity)
        n = b.sub(b.bitcast(t, ity), shift)
        if scalef:
            fty = ir.FunctionType(y.type, [y.type, ity])
            return b.call(cgutils.get_or_insert_function(
                b.module, fty, f"llvm.ldexp.f{width}.i{width}"), [y, n])
        half = b.ashr(n, ir.Constant(ity, 1))
        for k in (half, b.sub(n, half)):
            factor = b.shl(b.add(k, ir.Constant(ity, bias)), ir.Constant(ity, mant))
            y = b.fmul(y, b.bitcast(factor, y.type))
        return y

    @intrinsic
    def ldexp_shifted(typingctx, y, t):
        return (y(y, t), codegen) if isinstance(y, types.Float) and y == t else None
    return ldexp_shifted


def register(scalef: bool = False):
    """vecmath's pow2, exponent and mantissa in compiled code, as integer operations on the
    float's bits (IEEE layout: sign, exponent biased by `bias`, `mantissa` fraction bits),
    maximum and minimum as llvm.maximum/minimum, and the vecmath functions as callable from
    each other.  Called once, before the first vecmath function compiles; `scalef`: the
    target has AVX-512 (ldexp_shifted as vscalef)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload

    def layout(t):
        width, mant, bias = (32, 23, 127) if t.bitwidth == 32 else (64, 52, 1023)
        return ir.IntType(width), mant, bias

    def bits_intrinsic(build):
        @intrinsic
        def op(typingctx, x):
            if not isinstance(x, types.Float):
                return None

            def codegen(context, builder, sig, args):
                ity, mant, bias = layout(x)
                const = lambda v: ir.Constant(ity, v)               # noqa: E731
                return build(builder, args[0], ity, const, mant, bias,
                             context.get_value_type(x))
            return x(x), codegen
        return op

    def pow2_bits(b, x, ity, c, mant, bias, fty):       # (int(x) + bias) << mant
        return b.bitcast(b.shl(b.add(b.fptosi(x, ity), c(bias)), c(mant)), fty)

    def exponent_bits(b, x, ity, c, mant, bias, fty):   # ((bits >> mant) & max) - bias
        e = b.and_(b.lshr(b.bitcast(x, ity), c(mant)), c(2 * bias + 1))
        return b.sitofp(b.sub(e, c(bias)), fty)

    def mantissa_bits(b, x, ity, c, mant, bias, fty):   # fraction bits | exponent of 1
        f = b.and_(b.bitcast(x, ity), c((1 << mant) - 1))
        return b.bitcast(b.or_(f, c(bias << mant)), fty)

    def register(fn, build):
        op = bits_intrinsic(build)

        @overload(fn)
        def typed(x):
            if isinstance(x, types.Float):
                return lambda x: op(x)

    register(vecmath.pow2, pow2_bits)
    register(vecmath.exponent, exponent_bits)
    register(vecmath.mantissa, mantissa_bits)

    def extremum(which):                        # vecmath.maximum / minimum: llvm.<which>
        @intrinsic
        def op(typingctx, a, b):
            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(args[0].type, [args[0].type] * 2)
                return builder.call(cgutils.get_or_insert_function(
                    builder.module, fty, f"llvm.{which}.f{a.bitwidth}"), args)
            return (a(a, b), codegen) if isinstance(a, types.Float) and a == b else None
        overload(getattr(vecmath, which))(lambda a, b: lambda a, b: op(a, b))

    for which in ("maximum", "minimum"):
        extremum(which)

    @intrinsic
    def fused(typingctx, a, b, c):              # vecmath.fma: llvm.fma, rounded once
        def codegen(context, builder, sig, args):
            fty = ir.FunctionType(args[0].type, [args[0].type] * 3)
            return builder.call(cgutils.get_or_insert_function(
                builder.module, fty, f"llvm.fma.f{a.bitwidth}"), args)
        return (a(a, b, c), codegen) if isinstance(a, types.Float) and a == b == c else None
    overload(vecmath.fma)(lambda a, b, c: lambda a, b, c: fused(a, b, c))

    op = ldexp_shifted(scalef)
    overload(vecmath.ldexp_shifted)(lambda y, t: lambda y, t: op(y, t))

    def callable_inside(fn):                    # vecmath functions call each other (tanh: exp)
        @overload(fn, jit_options={"error_model": "numpy", "fastmath": False})
        def typed(x):
            if isinstance(x, types.Float):
                return fn

    for name in vecmath.UNARY:
        callable_inside(vecmath.FUNCTIONS[name])


def prefer_wide(function) -> bool:
    """Mark an llvmlite function to prefer 512-bit vectors; False where this llvmlite's
    attribute set no longer takes attributes as text.  The mark only widens vectors, so
    without it the kernel still compiles, at the default width."""
    try:
        set.add(function.attributes, '"prefer-vector-width"="512"')
    except (TypeError, AttributeError, ValueError):
        return False
    return True


def __getattr__(name: str):
    """`wide_vectors`, `shifted_rows` and `call_threads`, made on first use (they need
    numba)."""
    maker = {"wide_vectors": _wide_vectors, "shifted_rows": _shifted_rows,
             "call_threads": _call_threads}.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MADE:
        _MADE[name] = maker()
    return _MADE[name]


def _wide_vectors():
    """`wide_vectors()`: a no-op intrinsic; the compiled function that calls it prefers 512-bit
    vectors (LLVM's "prefer-vector-width" function attribute, which llvmlite's attribute set
    does not list, so it is added to the set as text)."""
    from numba.core import types
    from numba.extending import intrinsic

    def codegen(context, builder, sig, args):
        prefer_wide(builder.function)
        return context.get_dummy_value()

    @intrinsic
    def wide_vectors(typingctx):
        return types.none(), codegen
    return wide_vectors


def _shifted_rows():
    """The intrinsic `shifted_rows(buf, lo, stop)`: an array of buf's type whose rows lo ..
    lo + len(buf) - 1 are buf's rows 0 .. len(buf) - 1 and whose first dimension is `stop`
    (its data pointer lo rows before buf's: only rows lo .. lo + len(buf) - 1 may be used).
    A kernel written for whole arrays, run over rows lo .. stop - 1 of it, then works in a
    buffer of len(buf) >= stop - lo rows (codegen/rows.py: block-local arrays)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.imputils import impl_ret_borrowed
    from numba.extending import intrinsic
    from numba.np.arrayobj import make_array, populate_array

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        buf = make_array(aryty)(context, builder, args[0])
        out = make_array(aryty)(context, builder)
        shape = cgutils.unpack_tuple(builder, buf.shape)
        strides = cgutils.unpack_tuple(builder, buf.strides)
        lo = context.cast(builder, args[1], sig.args[1], types.intp)
        stop = context.cast(builder, args[2], sig.args[2], types.intp)
        byte = ir.IntType(8).as_pointer()
        data = builder.gep(builder.bitcast(buf.data, byte), [builder.neg(builder.mul(
            lo, strides[0]))])
        populate_array(out, data=builder.bitcast(data, buf.data.type), shape=[stop, *shape[1:]],
                       strides=strides, itemsize=buf.itemsize, meminfo=buf.meminfo,
                       parent=buf.parent)
        return impl_ret_borrowed(context, builder, sig.return_type, out._getvalue())

    @intrinsic
    def shifted_rows(typingctx, buf, lo, stop):
        if not (isinstance(buf, types.Array) and buf.ndim >= 1
                and isinstance(lo, types.Integer) and isinstance(stop, types.Integer)):
            return None
        return buf(buf, lo, stop), codegen
    return shifted_rows


def _call_threads():
    """`call_threads()`: numba's thread count for this call (numba.get_num_threads(), which
    set_num_threads sets per calling thread), read through the threading layer's
    `get_num_threads` symbol by name, as numba's own parallel loops read it.  (numba's
    get_num_threads reads it through a ctypes pointer, a dynamic global that keeps the
    function that calls it out of the disk cache; numba's parfors read the symbol through a
    private intrinsic of the same code, not part of its API, hence this one.)"""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic
    from numba.np.ufunc.parallel import _launch_threads

    def codegen(context, builder, sig, args):
        # (declared as numba's parallel loops declare it: an intp result)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.IntType(types.intp.bitwidth), []), "get_num_threads")
        return builder.call(fn, [])

    @intrinsic
    def call_threads(typingctx):
        _launch_threads()           # (the symbol exists once the threading layer is loaded)
        return types.intp(), codegen
    return call_threads
