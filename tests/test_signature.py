"""signature.py: the call signatures and compile keys every cache is keyed by; memo.py's
registry emptied by clear_cache(), with the disk cache.

Expected signatures are written out by hand from numpy's definitions (dtype.str, byte strides
of C and Fortran order), not computed by the code under test.
"""
import ast
import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

import tullio_py
from tullio_py import cache, kernel, memo
from tullio_py.signature import (ArrayCode, ArraySig, CallSignature, CompileKey, array_codes,
                                 array_sigs, digest, stable)

PKG = Path(tullio_py.__file__).parent
MATMUL = "C_sig[i,k] := A[i,j] * B[j,k]"
RNG = np.random.default_rng(7)


def _abc(dtype=np.float64, order="C"):
    return {"A": np.asarray(RNG.random((3, 4)), dtype, order=order),
            "B": np.asarray(RNG.random((4, 5)), dtype, order=order)}


# ----------------------------------------------------------------------------- the records
def test_array_sig_of_values_is_dtype_shape_strides():
    a = np.arange(12.0).reshape(3, 4)
    assert ArraySig.of("A", a) == ArraySig("A", "<f8", (3, 4), (32, 8))
    assert ArraySig.of("A", a.T) == ArraySig("A", "<f8", (4, 3), (8, 32))
    assert ArraySig.of("s", 2.5) == ArraySig("s", "float", None, None)
    assert array_sigs({"A": a, "n": 3}) == (("A", "<f8", (3, 4), (32, 8)), ("n", "int", None, None))
    assert ArrayCode.of("A", a) == ("A", "<f8", 2, "C")
    assert ArrayCode.of("A", a.T) == ("A", "<f8", 2, "F")
    assert ArrayCode.of("A", a[:, ::2]) == ("A", "<f8", 2, ())         # no contiguous dimension
    assert ArrayCode.of("A", np.ones((2, 3, 4))[:, :, :2]) == ("A", "<f8", 3, (0, 1, 2))
    assert ArrayCode.of("A", a, layouts=False) == ("A", "<f8", 2, None)


def test_equal_for_arrays_differing_only_in_values():
    one, two = _abc(), _abc()
    assert not np.array_equal(one["A"], two["A"])
    rng = {"i": range(3), "j": range(4), "k": range(5)}
    s1 = CallSignature.of(one, rng, np.dtype("f8"), (3, 5))
    s2 = CallSignature.of(two, rng, np.dtype("f8"), (3, 5))
    assert s1 == s2 and hash(s1) == hash(s2) and {s1: 1}[s2] == 1
    assert s1 == ((("A", "<f8", (3, 4), (32, 8)), ("B", "<f8", (4, 5), (40, 8))),
                  (("i", 0, 3, 1), ("j", 0, 4, 1), ("k", 0, 5, 1)), "<f8", (3, 5), ())
    assert s1.array_sigs[1] == ArraySig("B", "<f8", (4, 5), (40, 8))
    assert CallSignature.of(one).with_ranges(rng) == s1._replace(dtype="", out_shape=())
    assert s1.with_ranges({"i": range(0, 0)}) != s1.with_ranges({"i": range(3, 3)})
    assert array_codes(one) == array_codes(two)
    k1 = CompileKey.of("C[i,k] := A[i,j] * B[j,k]", "f8", "cpu", False, ("plan",), one)
    k2 = CompileKey.of("C[i,k] := A[i,j] * B[j,k]", np.float64, "cpu", False, ("plan",), two)
    assert k1 == k2 and hash(k1) == hash(k2) and str(k1) == str(k2) and k1.digest() == k2.digest()


@pytest.mark.parametrize("change", ["dtype", "shape", "strides", "layout", "view"])
def test_call_signature_differs(change):
    base = _abc()
    other = dict(base)
    if change == "dtype":
        other["A"] = base["A"].astype(np.float32)
    elif change == "shape":
        other["A"] = np.ones((3, 6))
    elif change == "strides":            # same shape and dtype, every other row of a larger one
        other["A"] = np.ones((6, 4))[::2]
    elif change == "layout":
        other["A"] = np.asfortranarray(base["A"])
    else:                                # a non-contiguous view vs its contiguous copy
        big = np.ones((3, 8))
        base["A"], other["A"] = big[:, ::2], big[:, ::2].copy()
    s1, s2 = CallSignature.of(base), CallSignature.of(other)
    assert s1 != s2 and digest(s1) != digest(s2)
    same_code = change == "shape"        # the code does not depend on sizes
    assert (array_codes(base) == array_codes(other)) == same_code
    if change == "view":
        assert ArrayCode.of("A", base["A"]).layout == () and ArrayCode.of("A", other["A"]).layout == "C"


def test_compile_key_differs_in_every_field():
    arrays = _abc()
    base = dict(text="C[i,k] := A[i,j] * B[j,k]", dtype="f8", target="cpu", parallel=False,
                plan=("loops",), arrays=arrays)
    k0 = CompileKey.of(**base)
    for field, value in [("text", "C[i,k] := A[i,j] * B[k,j]"), ("dtype", "f4"),
                         ("target", "python"), ("target", "cuda"), ("parallel", True),
                         ("plan", ("other loops",)), ("arrays", _abc(order="F")),
                         ("arrays", {**arrays, "B": arrays["B"].astype(np.float32)})]:
        k = CompileKey.of(**{**base, field: value})
        assert k != k0 and str(k) != str(k0) and k.digest() != k0.digest(), field
        assert (k.arguments == k0.arguments) == (field == "text"), field


def test_signatures_are_hashable_and_frozen():
    k = CompileKey.of("x", "f8", "cpu", False, (), {"A": np.ones(2)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.target = "python"
    s = CallSignature.of({"A": np.ones(2)})
    with pytest.raises(AttributeError):
        s.dtype = "<f4"
    with pytest.raises(AttributeError):
        ArraySig("A", "<f8").shape = (2,)
    assert len({k, CompileKey.of("x", "f8", "cpu", False, (), {"A": np.zeros(2)}), s}) == 2


# ----------------------------------------------------------------------------- stable text
def test_stable_text_depends_on_values_only():
    assert stable({"b": 1, "a": {3, 1, 2}}) == stable({"a": {2, 3, 1}, "b": 1})
    assert stable(("a", 1, 2.5, None, True)) == "('a', 1, 2.5, None, True)"
    assert stable((1,)) != stable(1) and stable([1]) != stable((1,))
    assert stable(np.float32(1.5)) == "<f4:1.5" != stable(1.5)
    assert stable(np.dtype("int32")) == "dtype:<i4"
    assert stable(ArraySig("A", "<f8", (2,), (8,))) == "('A', '<f8', (2,), (8,))"
    assert stable(CompileKey.of("x", "f8", "cpu", False, (), {"s": 1.0})) == \
        "CompileKey(text='x', dtype='<f8', target='cpu', parallel=False, plan=(), " \
        "arrays=(('s', 'float', None, None),))"
    key = ("machine limits", 1)
    assert digest(key) == hashlib.sha256(b"('machine limits', 1)").hexdigest()
    for bad in (object(), lambda: 0, np.ones(2)):
        with pytest.raises(TypeError):
            stable(("ok", bad))


def test_disk_keys_come_from_stable_text(tmp_path, monkeypatch):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    key = CompileKey.of("x", "f8", "cpu", False, (), _abc())
    assert cache.store_pickle(("derived", key), [1, 2])
    same = CompileKey.of("x", "f8", "cpu", False, (), _abc())     # equal, built apart
    assert cache.load_pickle(("derived", same)) == [1, 2]
    assert cache.load_pickle(("derived", CompileKey.of("x", "f4", "cpu", False, (), _abc()))) is None
    (path,) = (tmp_path / "pickles").glob("*.pkl")
    assert path.stem == digest((cache.code_fingerprint(), ("derived", key)))[:40]


# ----------------------------------------------------------------------------- in a Kernel
def test_kernel_keys_are_signatures(tmp_path, monkeypatch):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    memo.clear_all()            # compiled here, so each specialisation writes its module here
    k = kernel(MATMUL, threads=False, blas=False)
    one, two = _abc(), _abc()
    np.testing.assert_allclose(k(**one), one["A"] @ one["B"])
    np.testing.assert_allclose(k(**two), two["A"] @ two["B"])
    keys = list(k.compiled)
    assert len(keys) == 1 and isinstance(keys[0], CompileKey) and keys[0].target == "cpu"
    assert all(isinstance(s, CallSignature) for s in k._plans)
    view = {"A": np.ones((3, 8))[:, ::2], "B": two["B"]}
    np.testing.assert_allclose(k(**view), view["A"] @ view["B"])     # no contiguous dim: new code
    f_order = {n: np.asfortranarray(a) for n, a in one.items()}
    np.testing.assert_allclose(k(**f_order), one["A"] @ one["B"])
    keys = list(k.compiled)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert {dict((a.name, a.layout) for a in key.arrays)["A"] for key in keys} == {"C", (), "F"}
    # each specialisation's module names its arguments in its header, from the stable text
    heads = [line for p in (tmp_path / "kernels").glob("_tullio_*.py")
             for line in p.read_text().splitlines() if line.startswith("# arguments: ")]
    assert sorted(heads) == sorted(f"# arguments: {key.arguments}" for key in keys)
    assert not any("0x" in h for h in heads)
    # a big call chooses parallel loops: another key, the same statement
    big = {"A": np.ones((64, 64)), "B": np.ones((64, 64))}
    rng = {"i": range(64), "j": range(64), "k": range(64)}
    _, key_big, _ = k.plan_for(big, rng, np.dtype("f8"), (64, 64))
    _, key_small, _ = k.plan_for(one, {"i": range(3), "j": range(4), "k": range(5)},
                                 np.dtype("f8"), (3, 5))
    assert key_big.parallel and not key_small.parallel and key_big != key_small
    py = kernel(MATMUL, threads=False, blas=False, target="python")
    _, key_py, _ = py.plan_for(one, {"i": range(3), "j": range(4), "k": range(5)},
                               np.dtype("f8"), (3, 5))
    assert key_py.target == "python" and key_py != key_small
    assert dataclasses.replace(key_py, target="cpu") == key_small


# ----------------------------------------------------------------------------- clear_cache
def test_clear_cache_empties_every_registered_memo_and_the_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TULLIO_CACHE_DIR", str(tmp_path))
    k = kernel(MATMUL, threads=False, blas=False)
    arrays = _abc()
    k(**arrays)
    g = k.vjp(np.ones((3, 5)), **arrays)
    np.testing.assert_allclose(g["A"], np.ones((3, 5)) @ arrays["B"].T)
    assert cache.store_pickle(("test", 1), "x")
    held = [m for m in memo.registered() if _size(m)]
    assert {"kernel.kernels", "kernel.compiled", "kernel.plans", "gradient.states",
            "jit.loaded"} <= {getattr(m, "name", None) for m in held}
    assert cache.size() > 0 and list((tmp_path / "kernels").glob("*.py"))
    tullio_py.clear_cache()
    assert [m for m in memo.registered() if _size(m)] == []
    assert cache.size() == 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "CACHEDIR.TAG"]
    np.testing.assert_allclose(k(**arrays), arrays["A"] @ arrays["B"])   # works again
    assert list((tmp_path / "kernels").glob("*.py"))                    # and re-cached


def _size(m):
    return len(m) if isinstance(m, memo.Memo) else m.cache_info().currsize


# Module-level mutable containers that are not memos, and why they may stay.
NOT_CACHES = {
    ("memo", "_FUNCTIONS"): "the registry of lru-cached functions itself",
    ("cache", "_made"): "directories checked in this process; cache.clear() empties it",
    ("nn", "_CLASSES"): "the torch module classes, defined on first use (their identity must "
                        "not change: isinstance)",
    ("jit", "_VM"): "the compiled vecmath functions, a fixed set defined on first use (its "
                    "first entry also marks numba's pow2 overload as registered, once)",
    ("jit", "_VECMATH_HASH"): "the hash of vecmath.py and intrinsics.py, a constant of the process",
    ("jit", "_VECTOR_BYTES"): "the machine's vector register width, a constant of the process",
    ("intrinsics", "_MADE"): "the wide_vectors and shifted_rows intrinsics, made on first use",
    ("memory", "_kept"): "recycled buffers, at most memory.KEEP bytes; clear_cache() forgets them",
}


def test_no_module_level_cache_outside_memo():
    """A module-level dict, list or set that starts empty is a cache in disguise (unbounded,
    not emptied by clear_cache()): it must be a memo.Memo, or be named above."""
    found = set()
    for path in sorted(PKG.rglob("*.py")):
        mod = ".".join(path.relative_to(PKG).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
            value = getattr(node, "value", None)
            empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
                getattr(value, "keys", None) or getattr(value, "elts", None))) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "list", "set") and not value.args
                and not value.keywords)
            if empty:
                found |= {(mod, t.id) for t in targets if isinstance(t, ast.Name)}
    assert found == set(NOT_CACHES), found ^ set(NOT_CACHES)
