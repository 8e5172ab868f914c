"""numpy's own einsum test equations, translated to tullio notation and compared to np.einsum.

The table is the equations numpy/_core/tests/test_einsum.py checks (its dtype sweep
`check_einsum_sums` and its `optimize_compare` cases: Hadamard-like products, index
transformations, inner and outer products, collapses, edge cases, random cases), with numpy's
implicit-output rule (letters used once, sorted) made explicit and `...` spelled as letters.

Every dtype numpy's einsum and tullio_py both support is checked: bool, int8..int64,
uint8..uint64, float32, float64, complex64, complex128 (float16 is an ArgumentError by design,
checked once).  Cost: target="python" runs every equation for every dtype (generated code, no
compilation: cheap); a compiled (target="cpu") kernel costs seconds to build, so one equation in
three is compiled, for one dtype chosen by its position in the table (the dtypes taken in turn),
which compiles each dtype at least once over the table.  The choice is deterministic.

Rules that differ from np.einsum on purpose are asserted, not skipped: a reduction of bools
counts in int64 (kernel.result_dtype) where np.einsum returns their `any`.
"""
import warnings

import numpy as np
import pytest

from tullio_py import ArgumentError, kernel

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float32, np.float64, np.complex64, np.complex128]
SIZES = dict(zip("abcdefghijklmnopqrstuvwxyz", [2, 3, 4, 2, 3, 2, 3, 4, 3, 2] * 3))

# (equation, shapes of the operands or None: from SIZES; () is a scalar operand)
EQUATIONS = [
    # check_einsum_sums: the dtype sweep
    ("i->", [(7,)]),
    ("...i->...", [(2, 3, 5)]),
    ("i...->...", [(2, 5)]),
    ("i...->...", [(2, 3, 4)]),
    ("ii", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("iii", [(3, 3, 3)]),
    ("ij->ji", [(3, 5)]),
    ("...,...", [(2, 3), (2, 3)]),
    ("...i,...i", [(2, 3, 4), (2, 3, 4)]),
    ("i...,i...", [(4, 2, 3), (4, 2, 3)]),
    ("i,j", [(3,), (4,)]),
    ("ij,j", [(4, 5), (5,)]),
    ("ji,j", [(5, 4), (5,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij,jk,kl", [(3, 4), (4, 5), (5, 2)]),
    ("ijk,jil->kl", [(3, 4, 5), (4, 3, 2)]),
    ("i,i,i->i", [(6,), (6,), (6,)]),
    (",i->", [(), (5,)]),
    ("i,->", [(5,), ()]),
    ("i,->i", [(5,), ()]),
    (",i->i", [(), (5,)]),
    ("i,i", [(7,), (7,)]),
    ("z,mz,zm->", [(2,), (3, 2), (2, 3)]),
    ("ij,ij->j", [(3, 4), (3, 4)]),
    ("ji,i->", [(3, 4), (4,)]),
    ("i,ij->", [(3,), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
    # optimize_compare
    ("a,ab,abc->abc", None), ("a,b,ab->ab", None),
    ("ea,fb,gc,hd,abcd->efgh", None), ("ea,fb,abcd,gc,hd->efgh", None),
    ("abcd,ea,fb,gc,hd->efgh", None),
    ("abhe,hidj,jgba,hiab,gab", None), ("bdhe,acad,hiab,agac,hibd", None),
    ("ab,ab,c->", None), ("ab,ab,c->c", None), ("ab,ab,cd,cd->", None),
    ("ab,ab,cd,cd->ac", None), ("ab,ab,cd,cd->cd", None), ("ab,ab,cd,cd,ef,ef->", None),
    ("ab,cd,ef->abcdef", None), ("ab,cd,ef->acdf", None), ("ab,cd,de->abcde", None),
    ("ab,cd,de->be", None), ("ab,bcd,cd->abcd", None), ("ab,bcd,cd->abd", None),
    ("eb,cb,fb->cef", None), ("dd,fb,be,cdb->cef", None), ("bca,cdb,dbf,afc->", None),
    ("dcc,fce,ea,dbf->ab", None), ("fdf,cdd,ccd,afe->ae", None), ("abcd,ad", None),
    ("ed,fcd,ff,bcf->be", None), ("baa,dcf,af,cde->be", None), ("bd,db,eac->ace", None),
    ("fff,fae,bef,def->abd", None), ("efc,dbc,acf,fd->abe", None), ("ba,ac,da->bcd", None),
    ("ab,ab", None), ("ab,ba", None), ("abc,abc", None), ("abc,bac", None), ("abc,cba", None),
    ("aab,fa,df,ecc->bde", None), ("ecb,fef,bad,ed->ac", None), ("bcf,bbb,fbf,fc->", None),
    ("bb,ff,be->e", None), ("bcb,bb,fc,fff->", None), ("fbb,dfd,fc,fc->", None),
    ("afd,ba,cc,dc->bf", None), ("adb,bc,fa,cfc->d", None), ("bbd,bda,fc,db->acf", None),
    ("dba,ead,cad->bce", None), ("aef,fbc,dca->bde", None),
]


def translate(spec: str, shapes: list[tuple]) -> str:
    """An einsum equation as a tullio statement over operands op0, op1, ... (scalars bare)."""
    ins, out = (spec.split("->") + [None])[:2]
    ins = [s.strip() for s in ins.split(",")]
    free = [c for c in "zyxwvutsrqponmlkjihgfedcba" if c not in spec]
    n_ell = max((len(sh) - len(s.replace("...", "")) for s, sh in zip(ins, shapes)
                 if "..." in s), default=0)
    ell = "".join(free[:n_ell])
    ins = [s.replace("...", ell[n_ell - (len(sh) - len(s.replace("...", ""))):])
           for s, sh in zip(ins, shapes)]
    if out is None:     # numpy's implicit output: letters used once, sorted (after the ...)
        letters = "".join(ins)
        out = "..." * bool(n_ell) + "".join(sorted(c for c in set(letters) - set(ell)
                                                   if letters.count(c) == 1))
    out = out.strip().replace("...", ell)
    factors = [f"op{n}[{','.join(s)}]" if s else f"op{n}" for n, s in enumerate(ins)]
    lhs = f"out[{','.join(out)}]" if out else "out"
    return f"{lhs} := {' * '.join(factors)}"


def _shapes(spec, shapes):
    if shapes is not None:
        return shapes
    ins = spec.split("->")[0].split(",")
    return [tuple(SIZES[c] for c in s) for s in ins]


def _data(shape, dtype, rng):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "u":
        return rng.integers(0, 40, size=shape).astype(dtype)     # products overflow uint8
    if dtype.kind == "i":
        return rng.integers(-20, 21, size=shape).astype(dtype)   # and int8
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _compiled_dtype(n):
    """The one dtype equation n is compiled for (None: python target only)."""
    return DTYPES[(n // 3) % len(DTYPES)] if n % 3 == 0 else None


CASES = [(n, dt, target) for n in range(len(EQUATIONS)) for dt in DTYPES
         for target in ["python"] + (["cpu"] if _compiled_dtype(n) is dt else [])]


def _check(got, want, dtype, reduces):
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    if np.dtype(dtype).kind == "b" and reduces:
        # tullio_py's rule: a reduction of bools counts (int64); np.einsum gives their any
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got > 0, want)
        return
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    kind = np.dtype(dtype).kind
    if kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        single = np.dtype(dtype) in (np.float32, np.complex64)
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        np.testing.assert_allclose(got, want, rtol=1e-4 if single else 1e-11,
                                   atol=(1e-4 if single else 1e-11) * scale)


@pytest.mark.parametrize("n,dtype,target", CASES,
                         ids=[f"{EQUATIONS[n][0]}-{np.dtype(dt).name}-{t}" for n, dt, t in CASES])
def test_numpy_einsum_equation(n, dtype, target):
    spec, shapes = EQUATIONS[n]
    shapes = _shapes(spec, shapes)
    rng = np.random.default_rng(n)
    ops = [_data(sh, dtype, rng) for sh in shapes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # integer overflow wraps, in numpy as here
        want = np.einsum(spec, *ops)
        expr = translate(spec, shapes)
        k = kernel(expr, target=target)
        got = k(**{f"op{m}": op for m, op in enumerate(ops)})
    _check(got, np.asarray(want), dtype, bool(k.equation.reduction_indices))


# Mixed dtypes (numpy's promotion: np.result_type), integers over their whole range, so that
# wrap-around and int/float conversions are exercised; compiled and python for each pair.
MIXED = [(np.uint64, np.int64), (np.uint64, np.int8), (np.int8, np.uint8), (np.bool_, np.int8),
         (np.uint32, np.int32), (np.float32, np.int64), (np.int64, np.complex64),
         (np.bool_, np.float32), (np.uint8, np.int16), (np.int8, np.int8), (np.uint64, np.uint64)]


def _full_range(shape, dtype, rng):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 1e3).astype(dtype)
    return _data(shape, dtype, rng)


MIXED_CASES = [pytest.param(a, b, t, id=f"{np.dtype(a).name}-{np.dtype(b).name}-{t}")
               for a, b in MIXED for t in ("python", "cpu")]


@pytest.mark.parametrize("dta,dtb,target", MIXED_CASES)
def test_numpy_einsum_mixed_dtypes(dta, dtb, target):
    rng = np.random.default_rng(7)
    A, B = _full_range((3, 4), dta, rng), _full_range((4, 5), dtb, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = np.einsum("ij,jk->ijk", A, B)
        got = kernel(translate("ij,jk->ijk", [A.shape, B.shape]), target=target)(op0=A, op1=B)
    _check(got, want, np.result_type(A, B), False)


def test_translation():
    """The translator itself, on numpy's implicit and ellipsis forms."""
    assert translate("ij,jk", [(2, 3), (3, 4)]) == "out[i,k] := op0[i,j] * op1[j,k]"
    assert translate("ii", [(3, 3)]) == "out := op0[i,i]"
    assert translate("ba,ac,da->bcd", [(2, 2)] * 3) == "out[b,c,d] := op0[b,a] * op1[a,c] * op2[d,a]"
    assert translate("...i->...", [(2, 3, 4)]) == "out[z,y] := op0[z,y,i]"
    assert translate(",i->i", [(), (3,)]) == "out[i] := op0 * op1[i]"
    assert translate("i,j", [(2,), (3,)]) == "out[i,j] := op0[i] * op1[j]"


def test_float16_is_an_argument_error():
    a = np.ones(3, np.float16)
    with pytest.raises(ArgumentError):
        kernel("out := op0[i]", target="python")(op0=a)
