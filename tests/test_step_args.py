"""step_args.py: the argument list a row group's or fused nest's function gets, worked out once
per signature, is the list the long way builds (a dict of every candidate, later entries
replacing earlier ones), argument by argument, for chains' forwards and gradients and a
Kernel's fused vjp; then the values those calls compute against the statements run one by
one (fuse=False)."""
import numpy as np
import pytest

from tullio_py import kernel, step_args, vjp_run
from tullio_py.codegen import rows as rows_mod
from tullio_py.vjp_plan import arrays_of

LAYER_NORM = """mu[i] := x[i,j] * inv_n
                var[i] := (x[i,j] - mu[i])**2 * inv_n
                y[i,j] := (x[i,j] - mu[i]) / sqrt(var[i] + eps) * g[j] + bb[j]"""
SOFTMAX = """(max) m[i] := x[i,j]
             e[i,j] := exp(x[i,j] - m[i])
             z[i] := e[i,j]
             y[i,j] := e[i,j] / z[i]"""


def the_long_way(f, statements, members, ns, params, bufs):
    """The arguments as built before step_args: consts, each member's reads and output,
    the buffers, params over all (vjp_run.Host.launch's dict)."""
    named = dict(f.consts) if hasattr(f, "consts") else {**dict(f.bound), **dict(f.bounds)}
    for k, name in zip(members, f.outputs):
        s = statements[k]
        named.update(arrays_of(s, ns, params, run=True))
        if s.output in getattr(f, "local", ()):
            continue
        out = ns[s.output]
        named[name] = out.reshape(1) if out.ndim == 0 else out
    named.update(bufs)
    return [params[a] if a in params else named[a] for a in f.source.args]


def same(a, b):
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype
                and a.strides == b.strides
                and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
    return type(a) is type(b) and (a == b or (a != a and b != b))


@pytest.fixture
def checked(monkeypatch):
    """Every vjp_run launch of a fused or rows step compares step_args' list with the long
    way's before it runs; returns the count of steps compared."""
    seen = []
    launch = vjp_run.Host.launch

    def wrapped(self, plan, step, ns):
        f = step.fused or step.rows
        if f is not None:
            src = step_args.plan(f, plan.statements, step.members, self.params)
            bufs = {}
            if step.rows is not None:
                bufs = {rows_mod.local_arg(n): np.zeros(1) for n in f.local}
                bufs.update((rows_mod.partial_arg(n), np.zeros(1)) for n in f.partial)
            want = the_long_way(f, plan.statements, step.members, ns, self.params, bufs)
            got = step_args.fill(src, ns, self.params, bufs)
            assert len(got) == len(want)
            for a, g, w in zip(f.source.args, got, want):
                assert same(g, w), a
            seen.append(step.kind)
        return launch(self, plan, step, ns)
    monkeypatch.setattr(vjp_run.Host, "launch", wrapped)
    return seen


def arrays(rng, n=37, m=13, dtype=np.float64):
    x = rng.standard_normal((n, 2 * m)).astype(dtype)[:, ::2]         # strided rows
    return x, rng.standard_normal(m).astype(dtype), rng.standard_normal(m).astype(dtype)


@pytest.mark.parametrize("text,scalars", [(LAYER_NORM, True), (SOFTMAX, False)])
def test_chain_gradients_fill_the_long_way_list(checked, text, scalars):
    rng = np.random.default_rng(3)
    x, g, bb = arrays(rng)
    ins = {"x": x, "inv_n": np.array(1 / 13), "eps": 1e-5, "g": g, "bb": bb} if scalars \
        else {"x": x}
    fused, alone = kernel(text), kernel(text, fuse=False)
    cot = rng.standard_normal(x.shape)
    got = fused.vjp(cot, **ins)
    assert checked and "rows" in checked
    want = alone.vjp(cot, **ins)
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-12, atol=1e-12)


def test_a_kernels_fused_vjp_fills_the_long_way_list(checked):
    rng = np.random.default_rng(4)
    k = kernel("y[i,j] := exp(x[i,j]) * w[j] + x[i,j] * w[j]")
    x, w = rng.standard_normal((9, 5)), rng.standard_normal(5)
    cot = rng.standard_normal((9, 5))
    got = k.vjp(cot, x=x, w=w)
    assert checked, k.gradient_plan
    want = {"x": cot * (np.exp(x) * w + w), "w": (cot * (np.exp(x) + x)).sum(0)}
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-12)


@pytest.mark.parametrize("local", [False, True])
def test_chain_forward_fills_the_long_way_list(local):
    rng = np.random.default_rng(5)
    x, g, bb = arrays(rng, dtype=np.float32)
    ch = kernel(LAYER_NORM)
    ins = {"x": x, "inv_n": 1 / 13, "eps": 1e-5, "g": g, "bb": bb}
    temps: list = []
    ns = ch.forward(dict(ins), temps, local)
    steps, fills, sources = ch.plan(dict(ins), local)
    rows = [(st, src) for st, src in zip(steps, sources) if st.rows is not None]
    assert rows and (not local or any(st.rows.local for st, _ in rows))
    statements = [type("S", (), {"equation": p.equation, "output": p.equation.output,
                                 "relayout": (), "consts": ()})() for p in ch.spec.parts]
    for st, src in rows:
        bufs = {rows_mod.local_arg(n): np.zeros(1) for n in st.rows.local}
        want = the_long_way(st.rows, statements, st.members, ns, {}, bufs)
        got = step_args.fill(src, ns, {}, bufs)
        for a, gv, wv in zip(st.rows.source.args, got, want):
            assert same(gv, wv), a
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + bb
    np.testing.assert_allclose(ns[ch.result], want, rtol=2e-5, atol=2e-5)


def test_a_relaid_member_is_refused():
    """(vjp_plan.choose and vjp_rows.row_groups run such a statement on its own kernel.)"""
    class F:
        consts, outputs = (("_rows", 4),), ("out",)
        source = type("Src", (), {"args": ("_rows", "a", "out")})()

    class S:
        equation = type("E", (), {"arrays": ("a",), "params": ()})()
        output, relayout, consts, text = "y", (("a", (1, 0)),), (), "y[i] := a[i]"
    with pytest.raises(ValueError, match="relaid"):
        step_args.plan(F, [S], (0,))
    S.relayout = ()
    assert step_args.plan(F, [S], (0,)) == ((step_args.CONST, 4), (step_args.NS, "a"),
                                            (step_args.OUT, "y"))
    ns = {"a": np.array(2.5), "y": np.zeros(())}
    got = step_args.fill(step_args.plan(F, [S], (0,)), ns, {}, {})
    assert got[0] == 4 and type(got[1]) is np.float64 and got[1] == 2.5
    assert got[2].shape == (1,) and np.shares_memory(got[2], ns["y"])
