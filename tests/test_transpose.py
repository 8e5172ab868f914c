"""transpose.py: the tiled transposing copy equals numpy's copy (and add) on every layout it
takes, and leaves alone the pairs it does not."""
import numpy as np
import pytest

from tullio_py import transpose

# (shape of the source, axes of the view copied): conv2d's dy channel-last (the worked
# example), back to channel-first, odd sizes that leave remainders of both tiles, a 6-d array
# whose other axes merge in pairs, a reversed 3-d array, the last axis moved first
LAYOUTS = [((16, 64, 32, 32), (0, 2, 3, 1)), ((5, 34, 33, 19), (0, 3, 1, 2)),
           ((7, 37, 141), (0, 2, 1)), ((3, 3, 17, 4, 9, 21), (2, 3, 5, 0, 1, 4)),
           ((40, 50, 20), (2, 1, 0)), ((9, 23, 12, 31), (3, 0, 1, 2))]


def _views_copy(dst, src):
    d4, s4 = transpose.views(dst, src)
    np.copyto(d4, s4)


@pytest.mark.parametrize("shape,axes", LAYOUTS)
def test_views_pair_the_same_elements(shape, axes):
    """Copying the 4-d views with numpy fills dst exactly as copying the arrays would: the
    reduction keeps every element's place (no compiled code involved)."""
    x = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
    v = np.transpose(x, axes)
    d = np.full(v.shape, -1)
    got = transpose.views(d, v)
    assert got is not None
    d4, s4 = got
    assert d4.ndim == 4 and abs(d4.strides[3]) == min(map(abs, d.strides))
    assert abs(s4.strides[2]) == min(abs(s) for s, n in zip(v.strides, v.shape) if n > 1)
    _views_copy(d, v)
    assert np.array_equal(d, v)


def test_views_refusals():
    x = np.zeros((6, 7, 8, 9, 10, 11))
    # src finest along dst's finest axis: numpy's copy reads it in order
    assert transpose.views(np.empty((8, 9)), x[0, 0, :, :, 0, 0]) is None
    # five other axes that do not merge
    v = np.transpose(x, (5, 0, 2, 4, 1, 3))[::1, :, ::2]
    assert transpose.views(np.empty(v.shape), v) is None
    # src's finest axis (3 long) shorter than a tile
    assert transpose.views(np.empty((3, 50, 40)), np.zeros((40, 50, 3)).transpose(2, 1, 0)) \
        is None
    # one axis, or shapes that differ
    assert transpose.views(np.empty(9), x[0, 0, 0, :, 0, 0]) is None
    assert transpose.views(np.empty((9, 8)), x[0, 0, :, :, 0, 0]) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.int32, np.bool_])
@pytest.mark.parametrize("shape,axes", LAYOUTS[:4])
def test_copy_equals_numpy(shape, axes, dtype, monkeypatch):
    monkeypatch.setattr(transpose, "FAR_BYTES", 0)      # every layout, near steps too
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    v = np.transpose(x, axes)
    for threads in (1, 2):
        d = np.zeros(v.shape, dtype)
        assert transpose.copy(d, v, threads=threads)
        assert np.array_equal(d, v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_and_strided_operands_equal_numpy(dtype, monkeypatch):
    """dst += src; a destination inside a wider array (a padded copy's interior), a source
    with a negative stride and a step."""
    monkeypatch.setattr(transpose, "FAR_BYTES", 0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 40, 3, 50)).astype(dtype)
    v = np.transpose(x[:, ::-1, :, ::2], (0, 2, 3, 1))        # (6, 3, 25, 40)
    wide = rng.standard_normal((6, 5, 27, 40)).astype(dtype)
    before = wide.copy()
    inside = wide[:, 1:4, 1:26]
    assert transpose.copy(inside, v, add=True, threads=2)
    expect = before.copy()
    expect[:, 1:4, 1:26] += v
    assert np.array_equal(wide, expect)         # the border untouched, the interior added
    assert transpose.copy(inside, v, threads=1)
    expect[:, 1:4, 1:26] = v
    assert np.array_equal(wide, expect)


def test_far_steps_take_the_tiles():
    """conv2d's dy moved channel-last (src steps of 4096 bytes along dst's finest axis), into
    the interior of a padded copy, on the caller's thread budget: the tiles take it."""
    x = np.random.default_rng(3).standard_normal((4, 64, 32, 32)).astype(np.float32)
    v = np.transpose(x, (0, 2, 3, 1))
    wide = np.zeros((4, 36, 36, 64), np.float32)
    assert abs(transpose.views(wide[:, 2:34, 2:34], v)[1].strides[3]) >= transpose.FAR_BYTES
    assert transpose.copy(wide[:, 2:34, 2:34], v)
    assert np.array_equal(wide[:, 2:34, 2:34], v) and not wide[:, :2].any()


def test_copy_refusals_leave_dst_alone():
    x = np.ones((16, 64, 32, 32), np.float32)
    v = np.transpose(x, (0, 2, 3, 1))
    for d, src in [(np.zeros(v.shape, np.float64), v),                 # dtypes differ
                   (np.zeros(v.shape, np.float16), v.astype(np.float16)),
                   (np.zeros((4, 8, 8), np.float32), np.ones((4, 8, 8), np.float32)
                    .transpose(0, 2, 1)),                               # below MIN_BYTES
                   (np.zeros(v.shape, np.float32), np.ascontiguousarray(v)),   # in order
                   (np.zeros((32, 256, 64), np.float32),                  # steps of 1024 bytes
                    np.ones((32, 64, 256), np.float32).transpose(0, 2, 1))]:
        assert not transpose.copy(d, src)
        assert not d.any()


def test_relayout_copies_pass_their_thread_count(monkeypatch):
    """relayout's copies and scratch takes run the tiles on the threads they are given (a
    Kernel's own count, a vjp's), serial on one; the values equal numpy's."""
    from tullio_py import jit, relayout_copies
    from tullio_py.parse import parse

    calls = []
    real = jit.call
    monkeypatch.setattr(jit, "call", lambda fn, args, parallel, n: (
        calls.append((parallel, n)), real(fn, args, parallel, n)))
    dy = np.random.default_rng(4).standard_normal((8, 64, 32, 32)).astype(np.float32)   # 2 MB
    for threads, expect in ((1, (False, 1)), (2, (True, 2))):
        calls.clear()
        got = relayout_copies.copies({"dy": dy}, {"dy": (0, 2, 3, 1)}, threads=threads)["dy"]
        assert calls == [expect] and np.array_equal(got, dy.transpose(0, 2, 3, 1))
        calls.clear()
        out = np.ones_like(dy)
        eq = parse("dx[b,c,p,q] += dy[b,c,p,q]")
        scratch = np.ascontiguousarray(dy.transpose(3, 0, 1, 2))     # q outermost: far steps
        relayout_copies.take({"dx": relayout_copies.Output((3, 0, 1, 2))}, eq, out, scratch,
                             threads)
        assert calls == [expect] and np.array_equal(out, dy + 1)


def test_one_thread_copies_stay_off_the_frontends_pool(monkeypatch):
    """A moved copy the tiles do not take goes to the frontend's pool copy (torch's copy_)
    only when it may use more than one thread; on one it is numpy's copy on this thread."""
    from tullio_py import blas, relayout_copies

    pooled = []
    monkeypatch.setattr(blas, "pooled_gemm", lambda: True)
    monkeypatch.setattr(blas.gemms, "copy", lambda dst, src, add: (
        pooled.append(dst.shape), np.copyto(dst, src))[-1] is None, raising=False)
    v = np.random.default_rng(5).standard_normal((32, 64, 260)).transpose(0, 2, 1)  # near steps
    for threads, expect in ((1, []), (2, [v.shape])):
        pooled.clear()
        d = np.zeros(v.shape)
        relayout_copies._copy_moved(d, v, threads=threads)
        assert pooled == expect and np.array_equal(d, v)
