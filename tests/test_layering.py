"""The pipeline is one-way: each module imports only modules of earlier stages, heavy
dependencies stay in their rooms, and `import tullio_py` loads none of them."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "tullio_py"

# Stage of each module: a module may import (at any depth) only modules of a lower stage.
STAGE = {
    "errors": 0, "cache": 0, "memo": 0, "overlap": 0, "ir": 1, "options": 1, "dtypes": 2, "parse": 2, "ranges": 2, "rewrite": 2, "schedule": 3, "bind": 3.5,
    "grad_sympy": 3.5, "grad": 4, "tangent": 4.5, "blas": 4, "blas_shift": 4.5, "codegen.text": 4.5,
    "codegen.source": 4.6, "codegen.emit": 4.6, "codegen.bounds": 4.7, "codegen.expr": 4.7,
    "codegen.nest": 4.8, "codegen.cpu": 5, "codegen.cuda": 5.5, "codegen.fused": 5.5,
    "codegen.__init__": 6, "codegen": 6, "jit": 7, "callpath": 8, "tape": 8,
    "gradient_kernel": 9, "tangent_kernel": 9.5, "explain": 9.5, "frontends.cuda": 8, "frontends.cuda_vjp": 8.5, "kernel": 10, "frontends.vjp": 11,
    "frontends.dask_graph": 11.2, "frontends.dask": 11.5,
    "frontends.torch": 12, "frontends.torch_autograd": 12.5, "frontends.torch_inplace": 12.6, "frontends.torch_ops": 13, "nn": 14, "__init__": 15, "__main__": 16,
}
# Deliberate late (function-level) imports of a later stage, each with its reason.
LATE_IMPORTS_ALLOWED = {
    ("tape", "kernel"): "the Tape builds helper kernels (factor of *=, renamed old value) at backward",
    ("gradient_kernel", "kernel"): "gradient equations are compiled as Kernels",
    ("frontends.cuda", "kernel"): "shares the dtype rule and snapshot helpers of the CPU call path",
    ("kernel", "frontends.torch"): "torch tensors are handed to their frontend, imported only then",
    ("kernel", "frontends.cuda"): "CUDA arrays are handed to their frontend",
    ("kernel", "frontends.dask"): "dask arrays are handed to their frontend, imported only then",
    ("kernel", "gradient_kernel"): "Kernel.vjp delegates to the gradient side, built on first use",
    ("explain", "kernel"): "reads the result dtype rule of the call path",
    ("kernel", "tangent_kernel"): "Kernel.jvp delegates to the forward-mode side, built on first use",
    ("tangent_kernel", "kernel"): "gradient statements become Kernels (gradient_kernels), and the "
                                  "result dtype rule",
    ("jit", "__init__"): "reads __version__ for the cache key",
    ("cache", "__init__"): "reads __version__ for the cache key",
    ("frontends.vjp", "kernel"): "runs vjp through a kernel built for the needed inputs",
    ("frontends.vjp", "grad"): "reads which arrays a gradient needs",
    ("frontends.torch", "frontends.torch_ops"): "custom ops for torch.compile, built on first use",
    ("frontends.torch", "frontends.cuda"): "CUDA tensors go to the CUDA frontend",
    ("frontends.torch", "frontends.torch_inplace"): "differentiable in-place statements, built on "
                                                     "first use",
    ("frontends.torch", "frontends.torch_autograd"): "the autograd Function, built on first "
                                                      "differentiable call",
}
HEAVY = {"sympy": {"grad_sympy"}, "torch": {"frontends.torch", "frontends.torch_autograd", "frontends.torch_inplace",
                   "frontends.torch_ops",
                   "nn"},
         "numba": {"jit", "frontends.cuda", "frontends.cuda_vjp", "codegen.cuda"},
         "dask": {"frontends.dask", "frontends.dask_graph"},
         "distributed": {"frontends.dask", "frontends.dask_graph"}}


def modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        yield ".".join(rel.parts), path


def imports(name: str, path: Path):
    """(imported tullio_py module or top-level package, is_top_level) pairs."""
    tree = ast.parse(path.read_text())
    package = name.rsplit(".", 1)[0] if "." in name else ""
    top = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        level = id(node) in top
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0], level, True
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield (node.module or "").split(".")[0], level, True
                continue
            base = package.split(".") if package else []
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            targets = [mod] if node.module else [".".join([*base, a.name]) for a in node.names]
            for t in targets:
                if not t:
                    t = "__init__"
                if t not in STAGE and f"{t}" + ".__init__" not in STAGE:
                    for a in node.names:        # `from . import x` or `from .frontends import x`
                        cand = f"{t}.{a.name}" if t else a.name
                        if cand in STAGE:
                            yield cand, level, False
                    continue
                yield t, level, False


@pytest.mark.parametrize("name,path", list(modules()), ids=[n for n, _ in modules()])
def test_imports_go_one_way(name, path):
    if name == "frontends.__init__":
        return
    assert name in STAGE, f"new module {name}: give it a stage in tests/test_layering.py"
    for target, top_level, external in imports(name, path):
        if external:
            owners = HEAVY.get(target)
            assert owners is None or name in owners, f"{name} imports {target}"
            continue
        if target == name or target not in STAGE:
            continue
        if STAGE[target] >= STAGE[name]:
            assert not top_level and (name, target) in LATE_IMPORTS_ALLOWED, (
                f"{name} (stage {STAGE[name]}) imports {target} (stage {STAGE[target]})")


def test_heavy_dependencies_are_imported_at_function_level_only():
    for name, path in modules():
        for target, top_level, external in imports(name, path):
            if external and target in HEAVY and name not in ("frontends.torch", "frontends.torch_autograd",
                                                                  "frontends.torch_inplace",
                                                                  "frontends.torch_ops"):
                assert not top_level, f"{name} imports {target} at module level"


def test_import_is_light():
    code = ("import sys, tullio_py; heavy = [m for m in ('sympy', 'numba', 'torch', 'numba_cuda',"
            " 'scipy', 'dask', 'distributed') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=PKG.parent, check=True).stdout.strip()
    assert out == "", f"import tullio_py loaded {out}"
