"""Every private Python, torch and DeepSpeed API the workbook relies on
(`utils.system.private_apis`) still exists here; when one is gone the failure says which,
the version it was checked against, what breaks and who uses it. And the list is honest: each
entry's users name it, and the names the workbook reaches into others' objects for are all
listed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from utils.jobs.launchers import WARM_AGENT_MODULE
from utils.jobs.stacks import ENGINE_METHODS
from utils.system import private_apis
from utils.system.private_apis import EXEC_METHODS, PRIVATE_APIS, PrivateApi

ROOT = Path(__file__).resolve().parents[2]

#: Underscored names the scan below meets that are not others' private APIs: the workbook's
#: own (defined in utils), os._exit (public, documented) and IPython's display protocol.
NOT_PRIVATE_APIS = {
    "_exit": "os._exit: public and documented",
    "_repr_mimebundle_": "IPython's documented rich-display protocol",
    "_counts": "utils.runtime.tracing's tracer", "_pending": "utils.runtime.tracing's tracer",
    "_input_needs_grad": "utils.runtime.frozen.FrozenPrefix", "_output_needs_grad": "FrozenPrefix",
    "_last_stage": "FrozenPrefix", "_mark": "utils.runtime.layercost's meter", "_marks": "the same meter",
    "_plan": "utils.planning.schedules.Schedule", "_parse": "utils.grading.notebook_source.LabSource",
    "_seen": "utils.jobs.configlint._Recording", "_mark_whole": "utils.jobs.configlint._Recording",
    "_stop_on_interrupt": "utils.jobs.launch.RunningJob",
    "_cleared": "utils.grading.execute.BoundedClient", "_bounded": "BoundedClient",
    "_shrunk": "BoundedClient", "_announce": "BoundedClient", "_iopub_events": "utils.grading.execute.KernelSession",
}


@pytest.mark.parametrize("api", PRIVATE_APIS, ids=lambda api: api.name)
def test_each_private_api_is_still_there(api: PrivateApi):
    problem = api.problem()
    assert problem is None, problem


def test_a_gone_api_is_reported_with_its_version_its_damage_and_its_users():
    gone = [PrivateApi("multiprocessing.forkserver", "no_such_function", "Python 3.11", "the fork server fails",
                       ("utils.runtime.warm_agent",)),
            PrivateApi("torch.distributed.no_such_module", "x", "torch 2.13.0", "y", ("z",)),
            PrivateApi(f"{private_apis._ELASTIC}.api", "MultiprocessContext._no_such_field", "torch 2.13.0",
                       "y", ("z",), instance=True)]
    problems = [api.problem() for api in gone]
    assert problems[0] == ("multiprocessing.forkserver.no_such_function (checked against Python 3.11) is gone: "
                           "AttributeError: module 'multiprocessing.forkserver' has no attribute "
                           "'no_such_function'. Without it: the fork server fails (used by utils.runtime.warm_agent)")
    assert "ModuleNotFoundError" in problems[1]
    assert "no method of 'MultiprocessContext' uses the name '_no_such_field'" in problems[2]
    # The same lookups find what is there, including names only instances have.
    assert private_apis.resolve(PrivateApi(f"{private_apis._ELASTIC}.api", "MultiprocessContext._pc", "",
                                           "", (), instance=True)).__name__ == "MultiprocessContext"


def test_each_entry_is_named_by_the_modules_it_says_use_it():
    for api in PRIVATE_APIS:
        name = (api.attribute or api.module).split(".")[-1]
        assert api.used_by and api.checked and api.breaks
        for user in api.used_by:
            path = ROOT / (user.replace(".", "/") + ".py")
            assert path.exists(), f"{api.name}: no module {user}"
            assert name in path.read_text(encoding="utf-8"), f"{api.name}: {user} does not name {name!r}"


def test_the_lists_the_workbook_keeps_elsewhere_agree():
    assert set(EXEC_METHODS) == set(ENGINE_METHODS)  # the names hang reports look for
    assert private_apis.WARM_AGENT == WARM_AGENT_MODULE


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.endswith("__")


def _reached_into(tree: ast.AST, own: set[str] = frozenset()) -> set[str]:
    """Underscored names a module uses on objects other than its own ``self``/``cls``
    (``engine._INSTRUCTION_MAP``, ``super()._poll()``, ``getattr(x, "_name")``), and in a
    class with a base not among `own` classes, the underscored methods it defines (overrides of
    someone else's) and those it uses on ``self`` without defining them (inherited)."""
    own = {*own, *(node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef))}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and _private(node.args[1].value)):
            found.add(node.args[1].value)
        elif isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] not in own for b in node.bases):
            methods = {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            on_self = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and _private(n.attr)
                       and isinstance(n.value, ast.Name) and n.value.id == "self"]
            stored = {n.attr for n in on_self if isinstance(n.ctx, ast.Store)}
            found.update(name for name in methods if _private(name))
            found.update(n.attr for n in on_self if n.attr not in methods | stored)
    return found


def test_every_private_name_the_workbook_reaches_for_is_listed():
    # Names it knows only as text (stack frames, traceback patterns, a preload) are not code
    # the scan can see: those entries were found by grep and are checked above by their users.
    listed = {part for api in PRIVATE_APIS for part in (api.attribute or api.module).split(".")}
    own_classes = {node.name for path in (ROOT / "utils").rglob("*.py")
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)}
    unlisted = {}
    for path in [*(ROOT / "utils").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in _reached_into(tree, own_classes) - listed - NOT_PRIVATE_APIS.keys():
            unlisted.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not unlisted, f"private names used but not in utils/system/private_apis.py: {unlisted}"


def test_the_scan_sees_reads_overrides_and_lookups_by_name():
    tree = ast.parse("from x import Base\n"
                     "class Mine(Base):\n    def _hook(self):\n        self._own = 1\n"
                     "        return super()._hook() + self._own + self._inherited + self._mine()\n"
                     "    def _mine(self):\n        return 0\n"
                     "class Yours:\n    def f(self):\n        return self._x\n"
                     "def f(engine):\n    engine._MAP = getattr(engine, '_name', None)\n")
    assert _reached_into(tree) == {"_hook", "_mine", "_inherited", "_MAP", "_name"}
