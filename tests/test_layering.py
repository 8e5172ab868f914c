"""The pipeline is one-way: each module imports only modules of earlier stages, heavy
dependencies stay in their rooms, and `import tullio_py` loads none of them."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "tullio_py"

# Stage of each module: a module imports (at module level or inside a function) only modules
# of a lower stage, so there is no import cycle.  kernel.py hands arrays to the frontends and
# the gradient side (lazily: lower stages); they build the kernels they derive through
# factory.py, where kernel.py registers itself, or through the Kernel object they are given.
STAGE = {
    "version": -1, "factory": -1, "memory": -1, "signature": -0.5, "errors": 0, "cache": 0, "cpu_load": 0, "scratch": 0, "tbb_lib": 0, "openmp_lib": 0, "vecmath": 0, "memo": 0, "overlap": 0,
    "ir": 1, "options": 1, "dtypes": 2, "parse": 2, "ranges": 2, "rewrite": 2, "guards": 2.9, "split": 2.95, "jam": 2.97, "schedule": 3, "summation": 2,
    "bind": 3.5, "grad_sympy": 3.5, "grad": 4, "grad_print": 4.2, "tangent": 4.5, "blas": 4, "blas_shift_cost": 4.2, "blas_threads": 4.2, "gemm_rate": 4.22, "blas_shift_gather": 4.25, "blas_shift_run": 4.3, "blas_shift_pad": 4.4, "blas_shift": 4.5,
    "codegen.text": 4.5, "codegen.source": 4.6, "codegen.emit": 4.6, "codegen.bounds": 4.7,
    "codegen.expr": 4.7, "codegen.nest": 4.8, "codegen.blocked": 4.9, "codegen.cpu": 5, "codegen.cuda": 5.5,
    "codegen.fused": 5.5, "codegen.rows": 5.5, "codegen.__init__": 6, "codegen": 6, "intrinsics": 6.5, "threads": 6.8, "jit": 7, "transpose": 7.5, "callpath": 8,
    "tape": 8, "frontends.cuda": 8, "vjp_written": 8.05, "relayout_copies": 8.06, "relayout": 8.07, "vjp_plan": 8.1, "vjp_inline": 8.12, "vjp_rows": 8.15, "step_args": 8.17, "vjp_run": 8.2, "frontends.numpy": 8.2,
    "frontends.cuda_vjp": 8.5, "frontends.cuda_call": 8.7, "gradient_kernel": 9,
    "tangent_kernel": 9.2, "frontends.vjp": 9.3, "explain": 9.5, "frontends.dask_graph": 9.6,
    "frontends.dask": 9.7, "frontends.torch": 9.8, "frontends.torch_higher": 9.82, "frontends.torch_autograd": 9.85,
    "frontends.torch_inplace": 9.86, "frontends.torch_ops": 9.9, "frontends.torch_call": 9.95,
    "frontends.registry": 9.99, "chain_text": 2.5, "chain_grad": 9.1, "chain": 9.995,
    "frontends.torch_chain": 9.97, "kernel": 10, "nn": 14,
    "__init__": 15, "__main__": 16,
}
HEAVY = {"sympy": {"grad_sympy"}, "torch": {"frontends.torch", "frontends.torch_autograd",
                                            "frontends.torch_higher", "frontends.torch_inplace",
                   "frontends.torch_ops", "frontends.torch_call", "frontends.torch_chain",
                   "nn"},
         "numba": {"jit", "threads", "intrinsics", "frontends.cuda", "frontends.cuda_vjp", "codegen.cuda"},
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
    """Every import of a tullio_py module, at module level or in a function, goes down."""
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
        assert STAGE[target] < STAGE[name], (
            f"{name} (stage {STAGE[name]}) imports {target} (stage {STAGE[target]})"
            f"{'' if top_level else ' inside a function'}")


def test_every_stage_names_a_module():
    """The checks here walk modules(): it finds the package's files, and STAGE names no module
    that is gone (only "codegen", the package as `from . import codegen` names it)."""
    names = {name for name, _ in modules()}
    assert {"kernel", "parse", "jit", "frontends.numpy", "codegen.__init__"} <= names
    assert set(STAGE) - names == {"codegen"}, set(STAGE) - names


def test_frontends_never_import_kernel():
    """A frontend gets the Kernel object and uses its public methods: no module under
    tullio_py/frontends imports tullio_py.kernel, at module level or in a function, and
    kernel.py imports the frontends only inside functions (registry.py picks them lazily)."""
    frontends = [(name, path) for name, path in modules() if name.startswith("frontends.")]
    assert "frontends.numpy" in dict(frontends)
    for name, path in frontends:
        found = [t for t, _, ext in imports(name, path) if not ext and t == "kernel"]
        assert found == [], f"{name} imports tullio_py.kernel"
        assert "tullio_py.kernel" not in path.read_text(), name     # (importlib by name)
    assert not [t for t, top, ext in imports("kernel", PKG / "kernel.py")
                if not ext and top and t.startswith("frontends")]


def test_no_import_cycles():
    """Tarjan's strongly connected components over all imports (function-level included):
    none has more than one module."""
    graph = {name: {t for t, _, ext in imports(name, path) if not ext and t in STAGE
                    and t != name}
             for name, path in modules()}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles among tullio_py modules: {cycles}"


def test_heavy_dependencies_are_imported_at_function_level_only():
    for name, path in modules():
        for target, top_level, external in imports(name, path):
            if external and target in HEAVY and name not in ("frontends.torch", "frontends.torch_call", "frontends.torch_autograd",
                                                                  "frontends.torch_inplace", "frontends.torch_higher",
                                                                  "frontends.torch_ops", "frontends.torch_chain"):
                assert not top_level, f"{name} imports {target} at module level"


def test_import_is_light():
    code = ("import sys, tullio_py; heavy = [m for m in ('sympy', 'numba', 'torch', 'numba_cuda',"
            " 'scipy', 'dask', 'distributed') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=PKG.parent, check=True).stdout.strip()
    assert out == "", f"import tullio_py loaded {out}"


MAX_LINES = 450


def test_modules_are_short():
    long = {name: n for name, path in modules()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines (split them): {long}"


def _private(n: str) -> bool:
    return n.startswith("_") and not n.startswith("__")


def _module_names(name: str, tree) -> dict:
    """Local name -> tullio_py module, for `from . import x [as y]` and `from .. import x`."""
    package = name.rsplit(".", 1)[0] if "." in name else ""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".") if package else []
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for a in node.names:
                if (f"{mod}.{a.name}" if mod else a.name) in STAGE:
                    out[a.asname or a.name] = f"{mod}.{a.name}" if mod else a.name
    return out


def _class_privates(tree) -> set:
    """`_names` a module's classes define: private methods and `self._x = ...` attributes."""
    out = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for n in ast.walk(cls):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(n.name):
                out.add(n.name)
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                  and isinstance(n.value, ast.Name) and n.value.id == "self" and _private(n.attr)):
                out.add(n.attr)
    return out


def test_no_private_names_across_modules():
    """No `from .x import _y`, no `x._y` on an imported tullio_py module, and no `obj._y` read
    where `_y` is a private method or attribute of a class of ANOTHER module (and not of a
    class of this one).  Not covered: a private name that two modules' classes both define
    (the read is taken as the module's own), getattr with a string, and names read inside
    generated code (callpath.py's text)."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules()}
    owners = {}
    for name, tree in trees.items():
        for attr in _class_privates(tree):
            owners.setdefault(attr, set()).add(name)
    found = []
    for name, tree in trees.items():
        mods = _module_names(name, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names
                          if _private(a.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value.id if isinstance(node.value, ast.Name) else None
                if base in mods:
                    found.append(f"{name}:{node.lineno} reads {base}.{node.attr}")
                elif base not in ("self", "cls") and node.attr in owners \
                        and name not in owners[node.attr]:
                    found.append(f"{name}:{node.lineno} reads .{node.attr} of "
                                 f"{', '.join(sorted(owners[node.attr]))}")
    assert found == [], "private names used across modules:\n" + "\n".join(found)
