"""vjp_written: which gradient statements write each element of their array at most once, and
the boxes of elements they never write, against brute-force enumeration of the index tuples.
(The gradients such plans compute: tests/test_blocking.py's relaid local convolutions and
tests/test_vjp_plan.py's written gradients, into NaN-filled arrays.)"""
import itertools

import numpy as np
import pytest

from tullio_py import vjp_written
from tullio_py.ir import Affine
from tullio_py.parse import parse


def _slots(text):
    return parse(text).lhs.indices


def _written_by_enumeration(lhs, rng, shape):
    hit = np.zeros(shape, bool)
    names = sorted({n for x in lhs for n in x.names})
    for values in itertools.product(*[rng[n] for n in names]):
        env = dict(zip(names, values))
        hit[tuple(sum(c * env[n] for n, c in x.terms) + x.const for x in lhs)] = True
    return hit


@pytest.mark.parametrize("lhs,rng,shape", [
    ("y[s+i, t+j, i, j, c] += 0", {"s": range(5), "t": range(4), "i": range(3), "j": range(2),
                                       "c": range(3)}, (7, 5, 3, 2, 3)),
    ("y[s+i, i] += 0", {"s": range(2, 6), "i": range(3)}, (8, 3)),
    ("y[c, s+i, i] += 0", {"s": range(0, 9, 2), "i": range(2), "c": range(1, 3)}, (4, 10, 2)),
    ("y[i, j] += 0", {"i": range(3), "j": range(4)}, (5, 4)),
    ("y[i, j] += 0", {"i": range(5), "j": range(4)}, (5, 4)),
], ids=["local2d", "offset", "strided", "narrower", "whole"])
def test_unwritten_boxes_are_the_unreached_elements(lhs, rng, shape):
    slots = _slots(lhs)
    boxes = vjp_written.unwritten(slots, rng, shape)
    zeroed = np.zeros(shape, bool)
    for box in boxes:
        assert len(box) == len(shape)
        zeroed[tuple(slice(lo, hi) for lo, hi in box)] = True
    assert (zeroed == ~_written_by_enumeration(slots, rng, shape)).all()


def test_unwritten_gives_up_past_the_box_limit():
    """Every other element of 200: 100 boxes, more than MAX_BOXES: zero-filled instead."""
    assert vjp_written.unwritten(_slots("y[i] += 0"), {"i": range(0, 200, 2)}, (200,)) is None


@pytest.mark.parametrize("expr,written", [
    ("dW[s+i, t+j, i, j, c1, c2] += dout[s,t,c2] * x[s+i,t+j,c1]", True),
    ("dx[s+i, c] += dout[s,c] * w[i]", False),          # two tuples per element: a sum
    ("dx[2*s, c] += dout[s,c]", False),                 # not a sum of indices
    ("dx[s+1, c] += dout[s,c]", False),                 # a constant offset
    ("dx[i, j] += dout[i,j] * (i <= j)", False),        # a mask
    ("dx[i] += dout[i,j]", False),                      # a reduction (fused: partial sums)
], ids=["one-to-one", "sum", "stride", "offset", "mask", "reduction"])
def test_overwrites(expr, written):
    eq = parse(expr)
    rng = {n: range(4) for n in eq.indices}
    shape = tuple(7 if isinstance(x, Affine) and not x.is_bare else 4 for x in eq.lhs.indices)
    got = vjp_written.overwrites(eq, rng, shape)
    assert (got is not None) == written
    if written:
        assert got == vjp_written.unwritten(eq.lhs.indices, rng, shape)
    if expr.startswith("dx[i] += dout[i,j]"):
        assert vjp_written.overwrites(eq, rng, shape, reductions=True) == ()


def test_gather_form_reads_plainly_inside_masks():
    """The rewrite's gather of a shifted statement, pad() dropped from its reads, the masks'
    bounds the eliminated index's range, named past the plan's own parameters."""
    eq = parse("dW[s+i, i, c] += dout[s,c] * x[s+i,c]")
    rng = {"s": range(5), "i": range(3), "c": range(2)}
    got, grng, consts = vjp_written.gather_form(eq, rng, (7, 3, 2), {"_lo_s": 1.0})
    assert str(got) == "dW[p, i, c] += dout[p-i, c] * x[p, c] * (_lo_s1 <= p - i < _hi_s)"
    assert grng["p"] == range(7) and "s" not in grng
    assert consts == (("_lo_s1", 0), ("_hi_s", 5))
    assert vjp_written.gather_form(parse("dx[2*i] += dout[i]"), {}, (9,), {}) is None
