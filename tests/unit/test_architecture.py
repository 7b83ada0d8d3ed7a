"""The layout rules of docs/architecture.md, checked on the source: no import cycles, each
layer imports only the layers below it, no module grows past ~450 lines unnoticed.

Imports are read with `ast` from every module of `utils`, function-level ones included (a
lazy import is still a dependency), ``if TYPE_CHECKING:`` blocks excluded (types only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "utils"

#: Allowed upward imports, each with its reason. Nothing else may point up.
EXCEPTIONS = {
    ("utils.timeline", "utils.analysis.metrics"): "Timeline.metrics() is a convenience that "
                                                  "defers to analysis at call time",
}

#: What each layer may import from utils (besides itself). Read top-down: the base first.
ALLOWED = {
    "utils.system": set(),
    "utils.validation": set(),
    "utils.timeline": set(),
    "utils.analysis": {"utils.timeline", "utils.validation"},
    # planning and workloads read DeepSpeed's classes (topology, LayerSpec) without its
    # import-time notice in the notebook's output (dslog: one logging filter, no processes)
    "utils.planning": {"utils.analysis", "utils.timeline", "utils.validation", "utils.system.dslog"},
    # A variable-length job's data is cut into micro-batches by a plan (pure planning code).
    "utils.workloads": {"utils.validation", "utils.planning.microbatching", "utils.system.dslog"},
    "utils.profiling": {"utils.workloads", "utils.planning", "utils.analysis", "utils.system",
                        "utils.validation"},
    "utils.jobs": {"utils.workloads", "utils.profiling", "utils.planning", "utils.analysis",
                   "utils.timeline", "utils.system", "utils.validation"},
    # The rank program: from the jobs layer only the spec, its DeepSpeed config and the
    # run-directory contract (its files and their records), never launching or ui; from planning
    # the schedules it lowers and the re-balancing policy a running job decides with (pure functions).
    "utils.runtime": {"utils.jobs.spec", "utils.jobs.config", "utils.jobs.rundir", "utils.jobs.records",
                      "utils.workloads",
                      "utils.planning.schedules", "utils.planning.catalogue", "utils.planning.rebalance", "utils.planning.microbatching",
                      "utils.timeline", "utils.system",
                      "utils.validation"},
    "utils.ui": {"utils.jobs", "utils.workloads", "utils.planning", "utils.analysis", "utils.timeline",
                 "utils.system", "utils.validation"},
    # Grading must not import torch or DeepSpeed: processes only.
    "utils.grading": {"utils.system", "utils.timeline"},
}

MAX_LINES = 480
#: Modules allowed past MAX_LINES, with the reason.
LONG_MODULES: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path) -> set[str]:
    """The `utils` modules `path` imports (resolved to modules, not names inside them)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "utils")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] != "utils":
                    continue
                for alias in child.names:  # `from utils.x import y`: y may be a module itself
                    candidate = f"{target}.{alias.name}"
                    found.add(candidate if candidate in MODULES else target)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m != name}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def layer_of(module: str) -> str:
    return next(layer for layer in sorted(ALLOWED, key=len, reverse=True)
                if module == layer or module.startswith(layer + "."))


def _within(module: str, prefixes: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_package_facade_is_allowed_nowhere():
    # `utils/__init__.py` imports lazily by name; no module of the package goes through it.
    users = sorted(m for m, deps in GRAPH.items() if "utils" in deps and m != "utils")
    assert not users, f"modules importing the facade `utils` instead of the module: {users}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "utils"))
def test_each_module_imports_only_layers_below_it(module):
    layer = layer_of(module)
    allowed = ALLOWED[layer] | {layer}
    bad = sorted(dep for dep in GRAPH[module] - {"utils"}
                 if not _within(dep, allowed) and (module, dep) not in EXCEPTIONS)
    assert not bad, f"{module} ({layer}) imports {bad}; allowed: {sorted(allowed)}"


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                cycles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            connect(v)
    return cycles


def test_no_import_cycles():
    graph = {m: {d for d in deps if d in GRAPH and (m, d) not in EXCEPTIONS} for m, deps in GRAPH.items()}
    assert not find_cycles(graph), f"import cycles: {find_cycles(graph)}"


def test_the_checker_sees_cycles_and_lazy_imports():
    # The checks above are only as good as the import reader and the cycle finder.
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert "utils.jobs.plan" in GRAPH["utils.jobs.launch"]
    assert "utils.analysis.metrics" in GRAPH["utils.timeline"]  # inside Timeline.metrics()
    assert "utils.grading.sandbox" in GRAPH["utils.grading.execute"]  # `from .sandbox import`
    # The old layout's cycle spec -> profiling -> runs -> spec would be found:
    old = {"utils.spec": {"utils.profiling"}, "utils.profiling": {"utils.runs"}, "utils.runs": {"utils.spec"}}
    assert find_cycles(old) == [["utils.profiling", "utils.runs", "utils.spec"]]


def test_no_module_is_too_long():
    long = {m: n for m, p in MODULES.items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES and m not in LONG_MODULES}
    assert not long, f"modules over {MAX_LINES} lines (split them, or say why in LONG_MODULES): {long}"
