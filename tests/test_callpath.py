"""The fast call path (tullio_py/callpath.py): a repeated call replays the first one, and
anything that changes what the call must do (shapes, dtypes, layout, index-array values,
parameters, names) gives the right answer, never a stale one.  Checked against numpy."""
import numpy as np
import pytest

from tullio_py import ArgumentError, RangeError, jit, kernel

rng = np.random.default_rng(7)


def test_repeat_takes_the_fast_path_and_compiles_nothing():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    A, B = rng.random((4, 3)), rng.random((3, 5))
    np.testing.assert_allclose(k(A=A, B=B), A @ B)
    assert len(k._calls.entries) == 1
    before = jit.stats.snapshot()
    for _ in range(3):
        A, B = rng.random((4, 3)), rng.random((3, 5))     # new values, same key
        C = k(A=A, B=B)
        np.testing.assert_allclose(C, A @ B)
    assert C is not k(A=A, B=B)                           # a new output each time
    assert jit.stats.snapshot() == before and len(k._calls.entries) == 1


def test_new_shape_dtype_layout_are_not_replayed():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    for A, B in [(rng.random((4, 3)), rng.random((3, 5))),
                 (rng.random((2, 6)), rng.random((6, 3))),
                 (rng.random((4, 3)).astype(np.float32), rng.random((3, 5)).astype(np.float32)),
                 (np.asfortranarray(rng.random((4, 3))), rng.random((3, 5))),
                 (rng.random((8, 6))[::2, ::2], rng.random((3, 5)))]:
        for _ in range(2):
            C = k(A=A, B=B)
            assert C.shape == (A.shape[0], B.shape[1]) and C.dtype == np.result_type(A, B)
            np.testing.assert_allclose(C, A @ B, rtol=1e-6)


def test_parameters_are_read_on_every_call():
    k = kernel("y[i] := a * x[i] + b", threads=False)
    x = rng.random(5)
    for a, b in [(2.0, 1.0), (3.0, -1.0), (np.float64(0.5), 2.0), (np.array(4.0), 0.0)]:
        np.testing.assert_allclose(k(x=x, a=a, b=b), a * x + b)


def test_in_place_and_snapshot_repeat():
    k = kernel("y[i] += x[i] * 2.0", threads=False)
    x, y = rng.random(6), np.zeros(6)
    for n in range(1, 4):
        assert k(y=y, x=x) is y
        np.testing.assert_allclose(y, 2 * n * x)
    ro = np.zeros(6)
    ro.flags.writeable = False
    with pytest.raises(ArgumentError):
        k(y=ro, x=x)
    rev = kernel("z[i] = z[5 - i] + 1.0", threads=False)   # reads the old values
    for _ in range(2):
        z = np.arange(6.0)
        rev(z=z)
        np.testing.assert_allclose(z, np.arange(6.0)[::-1] + 1)


def test_index_array_values_are_checked_every_call():
    k = kernel("y[i] := A[J[i]]", threads=False)
    A = rng.random(5)
    J = np.array([0, 4, 2])
    np.testing.assert_allclose(k(A=A, J=J), A[J])
    J2 = np.array([1, 1, 3])
    np.testing.assert_allclose(k(A=A, J=J2), A[J2])
    with pytest.raises(RangeError):
        k(A=A, J=np.array([0, 5, 2]))                    # same shapes, out of bounds now


def test_wrong_arguments_still_raise_after_a_fast_call():
    k = kernel("s[i] := A[i,j]", threads=False)
    A = rng.random((3, 4))
    k(A=A)
    k(A=A)
    with pytest.raises(ArgumentError):
        k(B=A)
    with pytest.raises(ArgumentError):
        k(A=A, B=A)
    with pytest.raises(ArgumentError):
        k(A=rng.random(3))
    np.testing.assert_allclose(k(A=[[1.0, 2.0]]), [3.0])   # lists go the full way


def test_threads_option_on_the_fast_path():
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=2)
    A, B = rng.random((64, 64)), rng.random((64, 64))
    for _ in range(2):
        np.testing.assert_allclose(k(A=A, B=B), A @ B)


def test_replay_checks_every_fact_of_the_newest_call():
    """The newest remembered call is replayed inline after checks cheaper than its key: a
    dtype equal to it but another object, strides that differ only where the shape does not
    fix them, a layout that differs, and an older key each get the right answer."""
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    meta = np.dtype("f8", metadata={"unit": "m"})          # == float64, another object
    A, B = rng.random((4, 3)), rng.random((3, 5))
    big = rng.random((6, 8))
    for A1, B1 in [(A, B), (A.astype(meta), B), (A, B.astype(meta)),
                   (A[:1], B), (big[2:3, :3], B), (big[:, None, :3][2:6, 0], B),
                   (np.asfortranarray(A), B), (big[::2, :6:2][:4], B),
                   (rng.random((2, 3)), B), (A, B)]:
        for _ in range(3):
            np.testing.assert_allclose(k(A=A1, B=B1), A1 @ B1)


def test_python_int_parameter_typed_by_its_value():
    """numba types a Python int by its value (uint64 past int64): an int outside the range of
    the remembered call's type is not replayed through that compilation."""
    k = kernel("y[i] := x[i] * n", threads=False)
    x = rng.random(4)
    for n in [2**63 + 5, 2**63 + 5, -3, -3, 3, np.array(-2)]:
        for _ in range(2):
            np.testing.assert_allclose(k(x=x, n=n), x * float(n))


def test_clear_cache_empties_the_replayed_call(tmp_path, monkeypatch):
    from tullio_py import clear_cache
    # clear_cache() empties the disk cache too: a private one, not the directory the other
    # test process is loading kernels from
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    A, B = rng.random((4, 3)), rng.random((3, 5))
    k(A=A, B=B)
    k(A=A, B=B)
    assert len(k._calls.entries) >= 1
    clear_cache()
    assert len(k._calls.entries) == 0
    np.testing.assert_allclose(k(A=A, B=B), A @ B)         # the full path remembers again
    assert len(k._calls.entries) == 1


def test_a_remembered_kernel_is_called_through_its_own_keyword_method():
    """After a remembered call a Kernel's class is its own subclass whose __call__ takes the
    statement's names as keyword parameters (renamed in the code object: names that are the
    generated text's own parameter names map to the right arrays)."""
    import inspect

    from tullio_py.kernel import Kernel
    k = kernel("y[i] := v1[i] - 2 * v0[i]", threads=False)
    x, z = rng.random(5), rng.random(5)
    np.testing.assert_allclose(k(v1=x, v0=z), x - 2 * z)
    assert type(k) is not Kernel and isinstance(k, Kernel)
    assert list(inspect.signature(k).parameters)[:2] == ["v1", "v0"]
    for _ in range(2):
        np.testing.assert_allclose(k(v0=z, v1=x), x - 2 * z)          # either keyword order
        np.testing.assert_allclose(k(v1=z, v0=x), z - 2 * x)
    other = kernel("y[i] := v0[i] - 2 * v1[i]", threads=False)      # the same names, swapped
    for _ in range(2):
        np.testing.assert_allclose(other(v1=x, v0=z), z - 2 * x)
    assert type(other) is not type(k)
    np.testing.assert_allclose(k(v1=x, v0=z), x - 2 * z)


def test_any_identifier_names_an_array_of_every_kernel_method():
    """`self` (and the methods' own parameter names: cotangent, tangents) are valid array
    names: the first call, the remembered one, ranges, explain, vjp and jvp take them."""
    k = kernel("y[i] := self[i] * cotangent[i] + tangents[i]", threads=False)
    a, b, c = rng.random(5), rng.random(5), rng.random(5)
    arrays = dict(self=a, cotangent=b, tangents=c)
    for _ in range(3):                     # the full path, then the remembered call
        np.testing.assert_allclose(k(**arrays), a * b + c)
    assert k.ranges(**arrays) == {"i": range(5)}
    assert "loop" in str(k.explain(**arrays)).lower()
    w = rng.random(5)
    g = k.vjp(w, **arrays)
    np.testing.assert_allclose(g["self"], w * b)
    np.testing.assert_allclose(g["cotangent"], w * a)
    np.testing.assert_allclose(g["tangents"], w)
    np.testing.assert_allclose(k.jvp({"self": w}, **arrays), w * b)


def test_the_keyword_method_hands_anything_else_to_the_full_path():
    """A missing or unknown name, an option-like name, a non-array (list, numpy subclass,
    wrong dtype), a positional argument and an active Tape each get what the full path does."""
    from tullio_py import Tape
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    A, B = rng.random((4, 3)), rng.random((3, 5))
    for _ in range(2):
        np.testing.assert_allclose(k(A=A, B=B), A @ B)
    with pytest.raises(ArgumentError):
        k(A=A)
    with pytest.raises(ArgumentError):
        k(A=A, B=B, D=B)
    with pytest.raises(ArgumentError):
        k(A=A, B=B, threads=1)
    with pytest.raises(TypeError):
        k(A, B)
    np.testing.assert_allclose(k(A=A.tolist(), B=B), A @ B)
    sub = A.view(type("Sub", (np.ndarray,), {}))
    np.testing.assert_allclose(k(A=sub, B=B), A @ B)
    np.testing.assert_allclose(k(A=A.astype(np.float32), B=B), A @ B, rtol=1e-6)
    with Tape() as tape:
        np.testing.assert_allclose(k(A=A, B=B), A @ B)
    assert len(tape.records) == 1
    np.testing.assert_allclose(k(B=B, A=A), A @ B)


def test_the_keyword_method_gives_up_where_the_replay_does():
    """The replay's own give-ups through the keyword method: an input aliasing an in-place
    output (the full path snapshots it), a missing scalar parameter, and a 0-d parameter."""
    k = kernel("y[i] = x[i] + x[5 - i]", threads=False)
    for _ in range(2):
        x, y = rng.random(6), np.zeros(6)
        assert k(y=y, x=x) is y
        np.testing.assert_allclose(y, x + x[::-1])
    for _ in range(2):
        x = rng.random(6)
        want = x + x[::-1]
        assert k(y=x, x=x) is x
        np.testing.assert_allclose(x, want)
    p = kernel("y[i] := a * x[i]", threads=False)
    x = rng.random(4)
    for a in [2.0, 2.0, np.array(3.0), np.array(3.0), 4.0]:
        np.testing.assert_allclose(p(x=x, a=a), a * x)
    with pytest.raises(ArgumentError):
        p(x=x)


def test_a_statement_without_arrays_is_replayed():
    k = kernel("A[i,j] := i + 10 * j", threads=False, ranges={"i": range(3), "j": range(2)})
    want = np.arange(3)[:, None] + 10 * np.arange(2)[None, :]
    for _ in range(3):
        np.testing.assert_array_equal(k(), want)
    with pytest.raises(ArgumentError):
        k(B=want)


def test_a_subclass_of_kernel_keeps_its_own_call():
    from tullio_py.kernel import Kernel

    class Counted(Kernel):
        calls = 0

        def __call__(self, **arrays):
            Counted.calls += 1
            return super().__call__(**arrays)

    class Plain(Kernel):
        pass

    A, B = rng.random((2, 3)), rng.random((3, 2))
    c = Counted("C[i,k] := A[i,j] * B[j,k]", threads=False)
    p = Plain("C[i,k] := A[i,j] * B[j,k]", threads=False)
    for _ in range(3):
        np.testing.assert_allclose(c(A=A, B=B), A @ B)
        np.testing.assert_allclose(p(A=A, B=B), A @ B)
    assert Counted.calls == 3 and type(c) is Counted
    assert isinstance(p, Plain) and type(p) is not Plain and Plain.__call__ is Kernel.__call__


def test_replay_flags_read_only_and_unaligned_either_way_round():
    """The inline replay of a C-contiguous, aligned, writeable call tests numpy's one flag for
    all three; a read-only or unaligned array of the same shape and dtype, remembered first or
    after, gets its own right answer."""
    def unaligned(a):
        buf = np.empty(a.nbytes + 1, np.uint8)
        u = np.frombuffer(buf[1:].data, a.dtype).reshape(a.shape)
        u[...] = a
        return u

    def readonly(a):
        a = a.copy()
        a.flags.writeable = False
        return a

    A, B = rng.random((4, 3)), rng.random((3, 5))
    for order in ([A, readonly(A), unaligned(A), A], [readonly(A), unaligned(A), A, readonly(A)]):
        k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
        for A1 in order:
            for _ in range(3):
                np.testing.assert_allclose(k(A=A1, B=B), A @ B)


def test_only_serial_kernels_that_allocate_nothing_skip_numbas_runtime():
    """jit._options: serial loops that create no array are compiled without numba's runtime
    (a cheaper entry point: no record per array argument), and give numpy's answer through
    the full path and the replay; a function that allocates keeps the runtime (without it
    numba cannot compile it), and so does a parallel kernel."""
    from tullio_py.codegen import Source
    k = kernel("C[i,k] := A[i,j] * B[j,k]", threads=False)
    A, B = rng.random((4, 3)), rng.random((3, 5))
    for _ in range(3):
        np.testing.assert_allclose(k(A=A, B=B), A @ B)
    assert not k.last.source.allocates and k.last.fn.targetoptions["_nrt"] is False
    scalar = "def f(y_):\n    y_[0] = _np.float64(_np.exp(y_[1])) + _np.maximum(y_[2], _np.inf)\n"
    alloc = "def f(y_):\n    t = _np.empty(2, _np.float64)\n    t[:] = 2.0\n    y_[0] = t.sum()\n"
    assert not Source(scalar, "f", ("y_",), False, False).allocates
    assert "_nrt" not in jit._options(Source(scalar, "f", ("y_",), True, False))
    src = Source(alloc, "f", ("y_",), False, False)
    assert src.allocates and "_nrt" not in jit._options(src)
    y = np.zeros(3)
    jit.load(src, "cpu")(y)
    assert y[0] == 4.0
