"""cpu_load.py: a parallel call runs on at most the CPUs that the machine's other runnable
threads leave free, read from /proc/loadavg's runnable count at most every INTERVAL seconds;
the thread count changes no result."""
import numpy as np
import pytest

from tullio_py import cpu_load, jit, kernel, schedule, threads


@pytest.mark.parametrize("cpus,running,own,free", [(2, 1, 0, 2), (2, 2, 0, 1), (2, 9, 0, 1),
                                                   (8, 3, 0, 6), (8, 0, 0, 8), (1, 1, 0, 1),
                                                   (2, 2, 1, 2), (2, 3, 1, 1), (4, 4, 3, 4)])
def test_free_cpus(cpus, running, own, free):
    assert cpu_load.free_cpus(cpus, running, own) == free


@pytest.mark.parametrize("text,want", [("0.52 0.58 0.59 3/467 1234\n", 3),
                                       ("12.6 11.4 7.67 12/179 7982", 12),
                                       ("0.1 0.2 0.3", None), ("a b c x/y 1", None), ("", None)])
def test_parse_running(text, want):
    assert cpu_load.parse_running(text) == want


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_limit_reads_at_most_every_interval(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("1.0 1.0 1.0 1/100 5\n")
    clock = Clock()
    load = cpu_load.Load(str(f), interval=0.01, clock=clock, enabled=True, cpus=2)
    assert load.limit(2) == 2 and load.limit(1) == 1
    f.write_text("3.0 3.0 3.0 4/100 5\n")
    clock.t += 0.005
    assert load.limit(2) == 2                   # the reading is still fresh
    clock.t += 0.01
    assert load.limit(2) == 1 and load.limit(5) == 1
    f.write_text("3.0 3.0 3.0 2/100 5\n")
    clock.t += 0.02
    assert load.limit(2) == 1                   # one other runnable thread takes one CPU
    off = cpu_load.Load(str(f), clock=clock, enabled=False, cpus=2)
    f.write_text("3.0 3.0 3.0 9/100 5\n")
    assert off.limit(2) == 2


def two_cpus(tmp_path, running: int):
    """(the count's file, a clock, a Load of 2 CPUs reading it) with `running` threads."""
    f = tmp_path / "loadavg"
    f.write_text(f"1.0 1.0 1.0 {running}/100 5\n")
    clock = Clock()
    return f, clock, cpu_load.Load(str(f), interval=0.001, clock=clock, enabled=True, cpus=2)


def test_own_pool_not_counted_just_after_a_call(tmp_path):
    """The pool's workers stay runnable for a few ms after a parallel call: a reading within
    OWN_SPIN of the end of a 2-thread call counts one runnable thread fewer; a later one, or
    one after a 1-thread call, counts them all."""
    f, clock, load = two_cpus(tmp_path, running=2)
    load.ran(2)
    clock.t += cpu_load.OWN_SPIN / 2
    assert load.limit(2) == 2
    clock.t += cpu_load.OWN_SPIN
    assert load.limit(2) == 1
    load.ran(1)
    clock.t += cpu_load.OWN_SPIN / 2
    assert load.limit(2) == 1
    f.write_text("1.0 1.0 1.0 3/100 5\n")
    load.ran(2)
    clock.t += cpu_load.OWN_SPIN / 2
    assert load.limit(2) == 1               # another thread besides the worker


def test_a_one_thread_call_keeps_the_spin_of_the_call_before(tmp_path):
    """The workers of a 2-thread call spin from its end; a 1-thread call after it wakes none,
    so a reading within OWN_SPIN of the 2-thread call still does not count them, and one
    after that window counts them."""
    _, clock, load = two_cpus(tmp_path, running=2)
    load.ran(2)
    clock.t += cpu_load.OWN_SPIN / 4
    load.ran(1)
    clock.t += cpu_load.OWN_SPIN / 4
    assert load.limit(2) == 2
    load.ran(1)
    clock.t += cpu_load.OWN_SPIN
    assert load.limit(2) == 1


def test_unreadable_count_turns_it_off(tmp_path):
    load = cpu_load.Load(str(tmp_path / "missing"), clock=Clock(), enabled=True, cpus=2)
    assert load.limit(2) == 2 and not load.enabled
    (tmp_path / "odd").write_text("no count here\n")
    load = cpu_load.Load(str(tmp_path / "odd"), clock=Clock(), enabled=True, cpus=2)
    assert load.limit(2) == 2 and not load.enabled


def test_environment_switch(monkeypatch):
    monkeypatch.setenv("TULLIO_LOAD_AWARE", "0")
    assert not cpu_load.Load().enabled
    monkeypatch.setenv("TULLIO_LOAD_AWARE", "1")
    assert cpu_load.Load(clock=Clock()).enabled


def test_kernel_threads_follow_the_load(tmp_path, monkeypatch):
    """A 2-thread kernel asks numba for 1 thread while another thread is runnable on 2 CPUs,
    for 2 when none is, and computes the same bits either way (against numpy too)."""
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)
    if jit.max_threads() < 2:
        pytest.skip("numba has one thread here")
    f = tmp_path / "loadavg"
    clock = Clock()
    load = cpu_load.Load(str(f), interval=0.01, clock=clock, enabled=True, cpus=2)
    monkeypatch.setattr(cpu_load, "machine", load)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((30, 20)), rng.standard_normal((20, 25))
    k = kernel("C[i,k] := A[i,j] * B[j,k]", blas=False, threads=2)
    seen, real = [], threads.set_threads
    monkeypatch.setattr(threads, "set_threads", lambda n: (seen.append(n), real(n))[1])
    outs = {}
    for running, want in ((3, 1), (1, 2), (2, 1)):
        f.write_text(f"1.0 1.0 1.0 {running}/100 5\n")
        clock.t += 1
        seen.clear()
        k._calls.entries.clear()        # the full call path, not a stored entry
        outs[running] = np.asarray(k(A=A, B=B))
        assert k._last.source.parallel
        assert [n for n in seen if n is not None] == [want], (running, seen)
    np.testing.assert_allclose(outs[1], A @ B, rtol=1e-12)
    assert np.array_equal(outs[1], outs[3]) and np.array_equal(outs[1], outs[2])


def test_torchs_own_workers_are_not_counted(tmp_path, monkeypatch):
    """Under the torch frontend torch's intra-op workers (torch.get_num_threads() - 1) spin
    between its ops: with one runnable thread besides the caller on 2 CPUs a 2-thread kernel
    called with torch tensors (2 torch threads) asks numba for 2 threads, called with numpy
    arrays for 1; with two others, 1 either way.  Load.limit's `pool` alone: the same."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(schedule, "PARALLEL_WORK_THRESHOLD", 0)
    f = tmp_path / "loadavg"
    clock = Clock()
    load = cpu_load.Load(str(f), interval=0.01, clock=clock, enabled=True, cpus=2)
    f.write_text("1.0 1.0 1.0 2/100 5\n")
    assert load.limit(2, 1) == 2 and load.limit(2) == 1
    f.write_text("1.0 1.0 1.0 3/100 5\n")
    clock.t += 1
    assert load.limit(2, 1) == 1
    if jit.max_threads() < 2:
        pytest.skip("numba has one thread here")
    monkeypatch.setattr(cpu_load, "machine", load)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((30, 20)), rng.standard_normal((20, 25))
    k = kernel("C[i,k] := A[i,j] * B[j,k]", blas=False, threads=2)
    seen, real, before = [], threads.set_threads, torch.get_num_threads()
    monkeypatch.setattr(threads, "set_threads", lambda n: (seen.append(n), real(n))[1])
    torch.set_num_threads(2)
    try:
        for running, tensors, want in ((2, True, 2), (2, False, 1), (3, True, 1)):
            f.write_text(f"1.0 1.0 1.0 {running}/100 5\n")
            clock.t += 1
            seen.clear()
            k._calls.entries.clear()        # the full call path, not a stored entry
            args = {"A": torch.from_numpy(A), "B": torch.from_numpy(B)} if tensors else \
                {"A": A, "B": B}
            C = k(**args)
            np.testing.assert_allclose(np.asarray(C), A @ B, rtol=1e-12)
            assert [n for n in seen if n is not None] == [want], (running, tensors, seen)
    finally:
        torch.set_num_threads(before)
