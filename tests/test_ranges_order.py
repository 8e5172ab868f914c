"""Range inference does not depend on the order terms are written in.

Metamorphic: a seeded generator writes shifted statements (positions holding several indices,
scaled and offset, with the same indices also used bare elsewhere, sometimes as `i+0`, which
intersects extents instead of demanding equal ones); every permutation of the
terms inside every index position, and of the factors, must give the same ranges (or the same
error) from `ranges.infer`.  Each result is then computed by the slow reference interpreter
(tests/reference.py, which asserts every access is in bounds) and by target="python", which must
agree.  The named cases are the statements that were once order dependent, checked against
closed numpy formulas.
"""
import itertools
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference import evaluate  # noqa: E402

from tullio_py import RangeError, kernel, tullio  # noqa: E402
from tullio_py import ranges as ranges_mod  # noqa: E402
from tullio_py.parse import parse  # noqa: E402

CASES = 300          # random statements; each is inferred under up to MAX_VARIANTS orders
MAX_VARIANTS = 48


def _python(expr, **arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tullio(expr, target="python", **arrays)


# ----------------------------------------------------------------------------- named cases
def _conv_z(x, h, z):
    n = min(len(z), len(x) - len(h) + 1)
    return np.array([sum(x[i + j] * h[j] for j in range(len(h))) * z[i] for i in range(n)])


@pytest.mark.parametrize("expr", [
    "y[i] := x[i+j] * h[j] * z[i]", "y[i] := x[j+i] * h[j] * z[i]",
    "y[i] := z[i] * h[j] * x[j+i]", "y[i] := h[j] * x[j+i] * z[i]"])
@pytest.mark.parametrize("nz", [8, 9, 10])
def test_valid_convolution_any_order(expr, nz):
    """The left-hand index yields: every element is the full three-term sum."""
    r = np.random.default_rng(nz)
    x, h, z = r.standard_normal(10), r.standard_normal(3), r.standard_normal(nz)
    assert kernel(expr).ranges(x=x, h=h, z=z) == {"i": range(min(nz, 8)), "j": range(3)}
    np.testing.assert_allclose(_python(expr, x=x, h=h, z=z), _conv_z(x, h, z), rtol=1e-12)


@pytest.mark.parametrize("expr", ["y[i] := X[j+3i,i] * h[j]", "y[i] := X[3i+j,i] * h[j]",
                                  "y[i] := h[j] * X[j+3*i+0,i]"])
def test_strided_position_any_order(expr):
    r = np.random.default_rng(1)
    X, h = r.standard_normal((12, 5)), r.standard_normal(3)
    want = np.array([sum(X[3 * i + j, i] * h[j] for j in range(3)) for i in range(4)])
    assert kernel(expr).ranges(X=X, h=h) == {"i": range(4), "j": range(3)}
    np.testing.assert_allclose(_python(expr, X=X, h=h), want, rtol=1e-12)


@pytest.mark.parametrize("expr", ["y[i,j] := x[i+j] * a[i] * b[j]",
                                  "y[i,j] := b[j] * x[j+i] * a[i]"])
def test_same_tier_is_an_error_not_a_guess(expr):
    """Two left-hand indices with their own ranges: no rule picks one, so ask for ranges=."""
    x, a, b = np.ones(4), np.ones(3), np.ones(3)
    with pytest.raises(RangeError, match="ranges="):
        kernel(expr).ranges(x=x, a=a, b=b)
    # fine when nothing has to be narrowed, and with ranges= for one of them
    assert kernel(expr).ranges(x=np.ones(5), a=a, b=b) == {"i": range(3), "j": range(3)}
    x = np.arange(1.0, 5.0)
    got = _python(expr, x=x, a=a, b=b, ranges={"j": 2})       # j fixed: i yields, to 0:3
    np.testing.assert_array_equal(got, [[x[i + j] for j in range(2)] for i in range(3)])


def test_given_index_never_yields():
    """ranges= fixes i; the reduction index k yields instead of i."""
    x, w = np.arange(8.0), np.arange(1.0, 5.0)
    k = kernel("y[i] := x[k+i] * w[k]", ranges={"i": 6})
    assert k.ranges(x=x, w=w) == {"i": range(6), "k": range(3)}
    np.testing.assert_allclose(k(x=x, w=w), [sum(x[i + j] * w[j] for j in range(3))
                                             for i in range(6)])


# ----------------------------------------------------------------------------- i+0
def test_plus_zero_is_a_shifted_use():
    """`A[i+0]` asks for the intersection; bare `A[i]` demands equal extents."""
    A, B = np.arange(5.0), np.arange(10.0, 14.0)
    eq = parse("y[i] := A[i+0] * B[i]")
    assert not eq.accesses()[0].indices[0].is_bare
    assert str(eq) == "y[i] := A[i+0] * B[i]" and parse(str(eq)) == eq
    assert parse("y[i] := A[i+0] * B[i]") != parse("y[i] := A[i] * B[i]")
    assert kernel("y[i] := A[i+0] * B[i]").ranges(A=A, B=B) == {"i": range(4)}
    for expr in ["y[i] := A[i+0] * B[i]", "y[i] := A[0+i] * B[i]", "y[i] := A[i-0] * B[i]",
                 "y[i] := B[i] * A[i+0]"]:
        np.testing.assert_array_equal(_python(expr, A=A, B=B), A[:4] * B)
    np.testing.assert_array_equal(tullio("y[i] := A[i+0] * B[i]", A=A, B=B), A[:4] * B)
    with pytest.raises(RangeError, match="same extent"):
        kernel("y[i] := A[i] * B[i]").ranges(A=A, B=B)


# ----------------------------------------------------------------------------- metamorphic
LEFT, RED = ("i", "k"), ("j", "l")


def _slot_text(terms, const):
    """terms: [(coef, name)], const: int or None (None: no constant written)."""
    pieces = [(f"{c}*{n}" if c != 1 else n) for c, n in terms]
    if const is not None:
        pieces.append(str(const))
    return pieces


def _join(pieces):
    return "+".join(pieces)


def _statement(r):
    """A random statement as (lhs, [(array, [pieces per position])], shapes)."""
    left = list(LEFT[:r.integers(1, 3)])
    red = list(RED[:r.integers(1, 3)])
    idx = left + red
    base = {n: int(r.integers(1, 6)) for n in idx}
    positions = []          # (pieces, size)
    for _ in range(r.integers(1, 3)):      # shifted positions holding 2 or 3 indices
        names = list(r.choice(idx, size=int(r.integers(2, min(3, len(idx)) + 1)), replace=False))
        terms = [(int(r.integers(1, 4)), n) for n in names]
        const = int(r.integers(0, 3)) if r.random() < 0.7 else None
        reach = sum(c * (base[n] - 1) for c, n in terms) + (const or 0) + 1
        positions.append((_slot_text(terms, const), max(1, reach - int(r.integers(0, 4)))))
    shifted = {p for pieces, _ in positions for p in pieces}
    for n in idx:           # bare uses elsewhere (always for an index not in a shifted position)
        if r.random() < 0.75 or not any(n in p for p in shifted):
            pieces = [n, "0"] if r.random() < 0.2 else [n]      # i+0: a shifted use
            positions.append((pieces, base[n] + (int(r.integers(0, 2)) if r.random() < 0.3
                                                 else 0)))
    order = r.permutation(len(positions))
    arrays, k = [], 0
    while k < len(order):
        d = int(r.integers(1, 3))
        arrays.append([positions[t] for t in order[k:k + d]])
        k += d
    return left, arrays


def _variants(left, arrays, rng):
    """Every order of the terms in every position, times two orders of the factors (sampled
    down to MAX_VARIANTS, always keeping the written one)."""
    per_slot = [list(itertools.permutations(p)) for arr in arrays for p, _ in arr]
    combos = list(itertools.product(*per_slot))
    if len(combos) > MAX_VARIANTS:
        keep = rng.choice(len(combos) - 1, size=MAX_VARIANTS - 1, replace=False) + 1
        combos = [combos[0]] + [combos[t] for t in sorted(keep)]
    out = []
    for combo in combos:
        it = iter(combo)
        factors = [f"A{a}[{','.join(_join(next(it)) for _ in arr)}]"
                   for a, arr in enumerate(arrays)]
        for fs in (factors, factors[::-1]):
            out.append(f"y[{','.join(left)}] := " + " * ".join(fs))
    return out


def _arrays(arrays, r):
    return {f"A{a}": r.integers(-3, 4, size=tuple(s for _, s in arr)).astype(np.float64)
            for a, arr in enumerate(arrays)}


def _infer(expr, shapes):
    try:
        return ranges_mod.infer(parse(expr), shapes)
    except RangeError:
        return ("RangeError",)


def test_random_statements_order_independent():
    """CASES random statements, each under up to 2*MAX_VARIANTS orders: same ranges or same
    error; results equal to the reference interpreter, in bounds, for two of the orders."""
    solved = errors = 0
    for seed in range(CASES):
        r = np.random.default_rng(seed)
        left, arrays = _statement(r)
        data = _arrays(arrays, r)
        shapes = {n: a.shape for n, a in data.items()}
        exprs = _variants(left, arrays, r)
        results = [_infer(e, shapes) for e in exprs]
        assert all(x == results[0] for x in results), (seed, exprs[0], results[0],
                                                       [(e, x) for e, x in zip(exprs, results)
                                                        if x != results[0]][:2])
        rng = results[0]
        if isinstance(rng, tuple):
            errors += 1
            continue
        solved += 1
        for expr in (exprs[0], exprs[-1]):
            eq = parse(expr)
            try:
                shape = ranges_mod.output_shape(eq, rng)
            except RangeError:
                continue        # a ':=' output whose range would not start at 0
            # the reference writes into zeros of that shape (a reduction over an empty range
            # leaves its zero) and asserts that every access is in bounds
            want = evaluate(parse(expr.replace(":=", "=")), data, rng, out=np.zeros(shape))
            got = _python(expr, **data)
            np.testing.assert_array_equal(got, want, err_msg=f"{seed}: {expr} {rng}")
    assert solved > CASES // 2, (solved, errors)
