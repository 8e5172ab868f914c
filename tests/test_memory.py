"""memory.py: the arrays tullio_py allocates start a cache line, and a large buffer is handed
out again only once no array (a view, a torch tensor) refers to it.  Checked on the arrays
themselves, on Python threads at once, across fork, and on what kernels, chains and vjps
return."""
import os
import signal
import threading

import numpy as np
import pytest

from tullio_py import kernel, memory

BIG = (300, 300)                    # float64: 720 kB, recycled (memory.RECYCLE)


def address(a) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("shape", [(), (0,), (3,), (5000,), (64, 64, 3), (0, 7000), BIG])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128, np.bool_, np.int16])
def test_empty_is_numpys_array_on_a_cache_line(shape, dtype):
    for make in (memory.empty, memory.zeros, lambda s, d: memory.full(s, 1, d)):
        a = make(shape, dtype)
        assert a.shape == shape and a.dtype == dtype
        assert a.flags.c_contiguous and a.flags.writeable and memory.whole(a)
        if a.nbytes >= memory.SMALL:
            assert address(a) % memory.ALIGN == 0
        else:                                   # small arrays: numpy's own
            assert a.base is None and a.flags.owndata
    assert not memory.zeros(shape, dtype).any()
    assert memory.full(shape, 1, dtype).all()
    assert memory.empty(5000, np.float32).shape == (5000,)


def test_whole_is_only_a_whole_array():
    a = memory.empty(BIG, np.float64)
    assert memory.whole(a) and memory.whole(np.empty(BIG))
    assert not memory.whole(a[1:]) and not memory.whole(a.T) and not memory.whole(a[:, :10])
    assert not memory.whole(np.empty(BIG)[1:]) and not memory.whole([1.0])
    raw = np.empty(a.nbytes + memory.ALIGN, np.uint8)       # not one of memory's buffers
    off = -address(raw) % memory.ALIGN
    assert not memory.whole(raw[off:off + a.nbytes].view(np.float64).reshape(BIG))


def test_a_buffer_comes_back_only_when_nothing_refers_to_it():
    memory.forget()
    a = memory.empty(BIG, np.float64)
    at = address(a)
    b = memory.empty(BIG, np.float64)           # a is held: other memory
    assert address(b) != at
    del a
    c = memory.empty(BIG, np.float64)           # a's buffer again
    assert address(c) == at
    view = c[3:, ::2]                           # a view holds it
    del c
    assert address(memory.empty(BIG, np.float64)) != at
    del view
    assert address(memory.empty(BIG, np.float64)) == at
    assert address(memory.empty(BIG, np.float32)) != at       # another size: its own buffer


def test_a_torch_tensor_holds_its_buffer():
    torch = pytest.importorskip("torch")
    memory.forget()
    a = memory.empty(BIG, np.float64)
    a.fill(7.0)
    at = address(a)
    t = torch.from_numpy(a)
    del a
    for _ in range(3):
        memory.empty(BIG, np.float64).fill(-1.0)
    assert float(t.min()) == float(t.max()) == 7.0
    del t
    assert address(memory.empty(BIG, np.float64)) == at


def test_values_held_by_callers_are_never_overwritten_on_threads():
    memory.forget()
    errors = []

    def work(k):
        try:
            for _ in range(200):
                a = memory.empty(BIG, np.float64)
                a.fill(k)
                b = memory.empty(BIG, np.float64)
                b.fill(-k)
                if not (a == k).all() or not (b == -k).all():
                    errors.append(k)
        except Exception as e:         # (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_kept_bytes_are_bounded(monkeypatch):
    memory.forget()
    monkeypatch.setattr(memory, "KEEP", 3 * (300 * 300 * 8 + memory.ALIGN))
    held = [memory.empty(BIG, np.float64) for _ in range(6)]
    assert memory._held[0] <= memory.KEEP and len(memory._kept) == 3
    assert all(memory.whole(a) for a in held)       # forgotten buffers stay with their arrays
    memory.forget()
    assert memory._held[0] == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_memory_is_locked_can_allocate():
    with memory._lock:                  # another thread inside at the fork
        pid = os.fork()
        if pid == 0:                    # the child: a deadlock ends by the alarm (code 14)
            signal.alarm(5)
            a = memory.empty(BIG, np.float64)
            os._exit(0 if address(a) % memory.ALIGN == 0 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


SOFTMAX = kernel("""(max) m[i] := x[i,j]
                    e[i,j] := exp(x[i,j] - m[i])
                    z[i] := e[i,j]
                    y[i,j] := e[i,j] / z[i]""", nograd=("m",))
SCALE = kernel("y[i,j] := x[i,j] * 2")


def test_results_and_gradients_start_a_cache_line():
    x = np.random.default_rng(0).standard_normal(BIG)
    y = SCALE(x=x)
    assert address(y) % memory.ALIGN == 0
    np.testing.assert_array_equal(y, 2 * x)
    s = SOFTMAX(x=x)
    assert address(s) % memory.ALIGN == 0
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(1, keepdims=True), rtol=1e-14)
    dy = np.random.default_rng(1).standard_normal(BIG)
    g = SOFTMAX.vjp(dy, x=x)["x"]
    assert address(g) % memory.ALIGN == 0
    np.testing.assert_allclose(g, s * (dy - (dy * s).sum(1, keepdims=True)), rtol=1e-10,
                               atol=1e-14)
