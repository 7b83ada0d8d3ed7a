"""Project hygiene: pins agree between pyproject.toml and environment.yml; notebooks are
committed without outputs; `import utils` starts nothing heavy."""

import json
import re
import subprocess
import ast
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, which pyproject.toml declares: tomli is the same parser
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _pins(lines):
    pins = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*([=<>!~]=?.*)$", line.strip().strip('"').strip("-").strip())
        if m:
            pins[m.group(1).lower()] = m.group(2).strip()
    return pins


def test_environment_yml_has_the_same_pins_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _pins(project["dependencies"] + project["optional-dependencies"]["test"])
    yml_lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_section = [line for line in yml_lines if line.startswith("      - ")]
    assert _pins(pip_section) == declared


#: Standard-library modules newer than the oldest Python pyproject.toml admits (3.10).
NEWER_STDLIB = {"tomllib": "3.11", "wsgiref.types": "3.12"}


def test_code_runs_on_the_oldest_declared_python():
    # Before, this very file imported tomllib unguarded although Python 3.10 is declared.
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"].startswith(">=3.10")
    offenders = []
    for path in [*ROOT.glob("utils/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
                   if any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                          for h in t.handlers)
                   for n in ast.walk(t)}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name in NEWER_STDLIB and id(node) not in guarded:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name} "
                                     f"(Python {NEWER_STDLIB[name]}+) without a fallback")
    assert not offenders, offenders


def test_committed_notebooks_have_no_outputs():
    tracked = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    dirty = []
    for path in tracked:
        nb = json.loads((ROOT / path).read_text(encoding="utf-8"))
        if any(c.get("outputs") or c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code"):
            dirty.append(path)
    assert dirty == [], f"strip outputs before committing: {dirty}"


def test_importing_utils_does_not_import_deepspeed_plotly_or_widgets():
    code = ("import sys, utils; print([m for m in ('deepspeed', 'plotly', 'ipywidgets') if m in sys.modules]);"
            "utils.plot_timeline; print('plotly' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]  # loaded on first use


def test_readme_gives_the_two_commands_and_ci_calls_one():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make lab" in readme and "make test" in readme
    fenced = "\n".join(re.findall(r"^```[^\n]*\n(.*?)^```", readme, flags=re.M | re.S))
    assert re.search(r"^\s*make lab\b", fenced, flags=re.M), "README: no code block runs `make lab`"
    assert re.search(r"^\s*make test\b", fenced, flags=re.M), "README: no code block runs `make test`"
    ci = (ROOT / ".ci" / "run").read_text()
    # A command line, not a comment, runs it (^ never matches inside a `# ...` line).
    assert re.search(r"^\s*make test\b", ci, flags=re.M), ".ci/run has no line that runs `make test`"
