"""explain.limits: the machine's limits are the best measured, so a measurement taken under
load (which comes out low) never lowers them."""
from tullio_py import explain


def test_limits_keep_the_best_measurement(monkeypatch, tmp_path):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    explain._LIMITS.clear()
    measured = iter([(100.0, 5.0), (60.0, 9.0), (300.0, 1.0)])
    monkeypatch.setattr(explain, "_measure", lambda n: next(measured))
    assert explain.limits() == (100.0, 5.0)          # first use measures and stores
    assert explain.limits() == (100.0, 5.0)          # then memory
    explain._LIMITS.clear()
    assert explain.limits() == (100.0, 5.0)          # then disk, without measuring
    assert explain.limits(refresh=True) == (100.0, 9.0)   # a loaded peak does not lower it
    explain._LIMITS.clear()
    assert explain.limits() == (100.0, 9.0)
    assert explain.limits(refresh=True) == (300.0, 9.0)
    explain._LIMITS.clear()


def test_limits_are_kept_per_thread_count(monkeypatch, tmp_path):
    """One core's limit and two cores' are measured and stored apart; explain measures a call
    against the threads it runs on (one for serial loops)."""
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    explain._LIMITS.clear()
    asked = []
    monkeypatch.setattr(explain, "_measure", lambda n: asked.append(n) or (100.0 * n, 5.0 * n))
    assert explain.limits(threads=1) == (100.0, 5.0)
    assert explain.limits(threads=2) == (200.0, 10.0)
    assert explain.limits(threads=1) == (100.0, 5.0) and asked == [1, 2]
    import numpy as np
    from tullio_py import kernel
    A = np.random.default_rng(0).random((40, 40)).astype(np.float32)
    e = kernel("y[i,j] := A[i,j] * 2", threads=1).explain(A=A)
    assert e.limit_threads == 1 and e.peak_flops == 100.0 and "on 1 thread:" in str(e)
    explain._LIMITS.clear()


def test_the_measured_limits_are_positive_on_each_thread_count(monkeypatch):
    """The measurement itself (not replaced): a 1024 sgemm and a 64 MB copy, on one thread
    and on two; also where numpy's BLAS thread count cannot be set (another BLAS)."""
    from tullio_py import blas_threads
    for n in (1, 2):
        peak, bw = explain._measure(n)
        assert peak > 1e8 and bw > 1e8
    monkeypatch.setattr(blas_threads, "available", lambda: False)
    monkeypatch.setattr(blas_threads, "_set_local", None)
    peak, bw = explain._measure(2)
    assert peak > 1e8 and bw > 1e8


SOFTMAX = """(max) m[i] := x[i,j]
             e[i,j] := exp(x[i,j] - m[i])
             z[i] := e[i,j]
             y[i,j] := e[i,j] / z[i]"""


def test_a_chain_explains_its_row_group_and_counts_its_work():
    """The softmax as a chain: one pass over blocks of rows with m, e, z in per-thread
    buffers; its FLOPs are its statements' (each counted by its own Kernel's explain on the
    arrays it reads), its bytes x read and y written; the time is a call's."""
    import numpy as np
    from tullio_py import kernel
    rng = np.random.default_rng(1)
    x = rng.standard_normal((301, 67)).astype(np.float32)
    sm = kernel(SOFTMAX, nograd=("m",))
    e = sm.explain(x=x)
    assert e.path == "chain"
    assert e.detail.startswith("statements 1-4 (m, e, z, y): one ")
    assert "rows of i; m, e, z in per-thread buffers" in e.detail
    ns = sm.run(x=x)
    own = [kernel(t).explain(**{n: ns[n] for n in p.reads})
           for t, p in zip(sm.statements, sm.spec.parts)]
    assert e.flops == sum(o.flops for o in own)
    # counted by hand per (i, j): m's comparison, e's subtraction and exp, z's addition, y's
    # division
    assert e.flops == (1 + 2 + 1 + 1) * 301 * 67
    assert e.bytes == 2 * x.nbytes
    assert e.seconds > 0 and 0 < e.fraction and e.limit_threads >= 1


def test_a_chain_explains_statements_on_their_own_paths():
    """A contraction BLAS takes runs on its own Kernel's path (and its temporary reaches
    memory: written and read once); with fuse=False every statement is on its own."""
    import numpy as np
    from tullio_py import kernel
    rng = np.random.default_rng(2)
    A, B = rng.random((200, 150)).astype(np.float32), rng.random((150, 180)).astype(np.float32)
    c = kernel("t[i,k] := A[i,j] * B[j,k]; y[i,k] := t[i,k] * 2")
    e = c.explain(A=A, B=B)
    assert "statement 1 (t): pure contraction over whole arrays: einsum" in e.detail
    assert "statement 2 (y): generated loops" in e.detail
    t = np.zeros((200, 180), np.float32)
    assert e.bytes == A.nbytes + B.nbytes + t.nbytes + 2 * t.nbytes
    x = rng.random((64, 33)).astype(np.float32)
    e = kernel("t[i] := x[i,j]; y[i,j] := x[i,j] / t[i]", fuse=False).explain(x=x)
    assert e.detail.startswith("statement 1 (t): generated loops") and "statement 2 (y)" in e.detail


def test_chain_explain_checks_its_arguments():
    import numpy as np
    import pytest
    from tullio_py import ArgumentError, kernel
    sm = kernel(SOFTMAX, nograd=("m",))
    with pytest.raises(ArgumentError, match="missing"):
        sm.explain()
    with pytest.raises(ArgumentError, match="defined by statement 2"):
        sm.explain(x=np.ones((3, 4)), e=np.ones((3, 4)))


def test_verbose_2_prints_the_path_once_per_call_signature(capsys):
    """verbose=2: the first call of each signature says which path it takes (loops with their
    order, or BLAS), in explain's words; a repeated signature says nothing more."""
    import numpy as np
    from tullio_py import kernel
    rng = np.random.default_rng(3)
    k = kernel("C[i,k] := A[i,j] * B[j,k]", verbose=2, blas=False)
    capsys.readouterr()
    A, B = rng.random((40, 30)).astype(np.float32), rng.random((30, 20)).astype(np.float32)
    for _ in range(3):
        k(A=A, B=B)
    said = [line for line in capsys.readouterr().out.splitlines() if "threads:" in line]
    assert len(said) == 1 and "loops: generated loops, order" in said[0]
    k(A=rng.random((8, 30)), B=rng.random((30, 20)))        # a new signature (float64)
    said = [line for line in capsys.readouterr().out.splitlines() if "threads:" in line]
    assert len(said) == 1
    b = kernel("C[i,k] := A[i,j] * B[j,k]", verbose=2)
    A, B = rng.random((300, 300)).astype(np.float32), rng.random((300, 300)).astype(np.float32)
    capsys.readouterr()
    b(A=A, B=B)
    b(A=A, B=B)
    said = [line for line in capsys.readouterr().out.splitlines() if "threads:" in line]
    assert len(said) == 1 and "blas: pure contraction" in said[0]
