"""gemm_rate.py: a gemm's rate measured on SHAPES (the arithmetic on a fake clock), stored as the
best measured so far in memory and in the cache directory, measured again while no quiet
measurement is stored; and the torch frontend's choice of
BLAS at one thread following the measured rates, with the same numbers either way."""
import numpy as np
import pytest

from tullio_py import gemm_rate, kernel


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache directory and no rate in memory."""
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm_rate, "_RATES", type(gemm_rate._RATES)("test rates", 8))
    return tmp_path


def test_measure_divides_the_flops_by_the_fastest_calls(monkeypatch):
    """Every call takes one tick of the fake clock: the rate is the flops of SHAPES over one
    tick per shape, and the gemm was called on float32 operands of those shapes."""
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(gemm_rate.time, "perf_counter", lambda: float(next(ticks)))
    seen = []

    def gemm(a, b, out):
        seen.append((a.shape, b.shape, a.dtype))
        np.matmul(a, b, out=out)
    got = gemm_rate.measure(gemm)
    flops = sum(2.0 * m * k * n for m, k, n in gemm_rate.SHAPES)
    assert got == flops / len(gemm_rate.SHAPES)
    assert {s[:2] for s in seen} == {((m, k), (k, n)) for m, k, n in gemm_rate.SHAPES}
    assert {s[2] for s in seen} == {np.dtype(np.float32)}
    assert len(seen) == len(gemm_rate.SHAPES) * (gemm_rate.REPEAT + 1)


def test_rate_is_stored_and_only_raised(fresh, monkeypatch):
    """The first rate is measured and stored; a new process (memory cleared) reads it back
    without measuring; `refresh` measures again and keeps the larger."""
    got = iter([5.0, 3.0, 7.0, 2.0])
    calls = []
    monkeypatch.setattr(gemm_rate, "quiet", lambda threads=1: True)
    monkeypatch.setattr(gemm_rate, "measure", lambda g: calls.append(g) or next(got))
    assert gemm_rate.rate("fake", None) == 5.0
    gemm_rate._RATES.clear()
    assert gemm_rate.rate("fake", None) == 5.0 and len(calls) == 1
    assert gemm_rate.rate("fake", None, refresh=True) == 5.0       # 3.0 measured, 5.0 kept
    assert gemm_rate.rate("fake", None, refresh=True) == 7.0
    gemm_rate._RATES.clear()
    assert gemm_rate.rate("fake", None) == 7.0 and len(calls) == 3
    assert gemm_rate.rate("other", None) == 2.0 and len(calls) == 4     # its own measurement


def test_a_rate_measured_under_load_is_measured_again(fresh, monkeypatch):
    """A measurement taken while other threads were runnable is used, stored as provisional,
    and measured again by each new process (memory cleared), the larger kept, until one
    measurement found the machine quiet; from then on it is read back."""
    got = iter([5.0, 150.0, 120.0, 170.0])
    # readings of quiet(): before and after the first measurement, before the second (busy:
    # no reading after it), before and after the third
    calm = iter([True, False, False, True, True])
    calls = []
    monkeypatch.setattr(gemm_rate, "quiet", lambda threads=1: next(calm))
    monkeypatch.setattr(gemm_rate, "measure", lambda g: calls.append(g) or next(got))
    assert gemm_rate.rate("t", None, threads=2) == 5.0         # busy after: provisional
    gemm_rate._RATES.clear()
    assert gemm_rate.rate("t", None, threads=2) == 150.0       # busy before: provisional
    gemm_rate._RATES.clear()
    assert gemm_rate.rate("t", None, threads=2) == 150.0       # 120 measured, quiet
    assert len(calls) == 3
    gemm_rate._RATES.clear()
    assert gemm_rate.rate("t", None, threads=2) == 150.0 and len(calls) == 3


@pytest.mark.parametrize("threads,running,want", [
    (1, 1, True), (1, 2, True), (1, 3, False), (2, 2, True), (2, 3, False), (2, 1, True)])
def test_quiet_counts_the_other_runnable_threads(threads, running, want, monkeypatch):
    """On 2 CPUs: the caller and its pool's threads - 1 workers are not others; a measurement
    on `threads` threads is quiet when the others leave it that many CPUs."""
    from tullio_py import cpu_load
    monkeypatch.setattr(cpu_load.machine, "cpus", 2)
    assert gemm_rate.quiet(threads, f"0.50 0.40 0.30 {running}/300 4242") is want
    assert gemm_rate.quiet(threads, "unreadable") is True


def test_torch_blas_and_slowdown_follow_the_rates(monkeypatch):
    """One thread: torch's gemm where at least as fast as numpy's; several: always torch's,
    priced as measured (numpy's rate times the threads over torch's, at least 1/4)."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from tullio_py.frontends import torch as frontend
    rates = {1: (60.0, 100.0), 2: (150.0, 100.0), 3: (2000.0, 100.0)}
    monkeypatch.setattr(frontend, "_TORCH_BLAS", rates)
    assert not frontend.torch_blas(1) and frontend.torch_blas(2) and frontend.torch_blas(3)
    assert frontend.torch_slowdown(1) == 1.0
    assert frontend.torch_slowdown(2) == pytest.approx(200.0 / 150.0)
    assert frontend.torch_slowdown(3) == 0.25
    rates[1] = (100.0, 100.0)
    assert frontend.torch_blas(1)


@pytest.mark.parametrize("torch_faster", [True, False])
def test_torch_at_one_thread_takes_the_measured_faster_blas(torch_faster, monkeypatch):
    """At one torch thread a conv1d's forward and gradients go to torch's gemm where torch's
    is measured faster and to numpy's where it is not (torch_gemm then never called); the
    numbers agree with numpy's einsum either way."""
    torch = pytest.importorskip("torch")
    from tullio_py.frontends import torch as frontend
    rates = (2.0, 1.0) if torch_faster else (1.0, 2.0)
    monkeypatch.setattr(frontend, "_TORCH_BLAS", {1: rates, 2: rates})
    gemm, used = frontend.torch_gemm, []
    monkeypatch.setattr(frontend, "torch_gemm", lambda *a, **k: used.append(1) or gemm(*a, **k))
    R = np.random.default_rng(3)
    x, w = R.standard_normal((16, 24, 150)), R.standard_normal((32, 24, 5))
    dy = R.standard_normal((16, 32, 146))
    xw = np.lib.stride_tricks.sliding_window_view(x, 5, axis=2)
    k = kernel("y[b,o,i] := x[b,c,i+j] * w[o,c,j]")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
        y = k(x=xt, w=wt)
        y.backward(torch.from_numpy(dy))
    finally:
        torch.set_num_threads(before)
    assert bool(used) == torch_faster
    assert frontend.torch_blas(1) == torch_faster and frontend.torch_blas(2)
    np.testing.assert_allclose(y.detach().numpy(), np.einsum("bcij,ocj->boi", xw, w),
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(wt.grad.numpy(), np.einsum("boi,bcij->ocj", dy, xw),
                               rtol=1e-10, atol=1e-10)
    want_dx = np.zeros_like(x)
    for j in range(5):
        want_dx[:, :, j:j + 146] += np.einsum("boi,oc->bci", dy, w[:, :, j])
    np.testing.assert_allclose(xt.grad.numpy(), want_dx, rtol=1e-10, atol=1e-10)
