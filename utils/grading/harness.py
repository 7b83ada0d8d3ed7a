"""Runs one instructor check inside the grading kernel.

Each re-inserted test cell of a graded notebook is two lines::

    from utils.grading.harness import run_check as _grading_run_check
    _grading_run_check('<the check source>', globals(), 'check:<id>')

The check sees the student's names (their functions, the lab's data), but with Python's
own builtins: a student notebook that assigned ``sum = 0`` or ``type = "linear"`` at top
level must not break ``type(x) is float`` in a check. Helpers a check defines (functions,
classes, imported modules and ``_``-prefixed names) are kept for later checks in a namespace
of their own, never written into the student's namespace; plain variables of a check
(``got``, ``p``) are not kept, so they cannot shadow the student's names in later checks.

This is fairness, not security: code that runs in the same kernel can always tamper with
the kernel (see docs/instructors.md).
"""

from __future__ import annotations

import builtins
import types
from typing import Any

_CHECK_NAMES: dict[str, Any] = {}
"""Helpers earlier checks defined (imports, functions, ``_`` names), visible to later checks."""


def run_check(source: str, namespace: dict[str, Any], filename: str = "<check>") -> None:
    """Execute `source` over a copy of `namespace` whose builtins are the real ones.

    Exceptions propagate unchanged: the grader reads their type and message.
    """
    real = vars(builtins)
    scope = {name: value for name, value in namespace.items()
             if not (name in real and value is not real[name])}
    scope.update(_CHECK_NAMES)
    scope["__builtins__"] = builtins
    before = dict(scope)
    try:
        exec(compile(source, filename, "exec"), scope)
    finally:
        for name, value in scope.items():
            if name.startswith("__"):
                continue
            if name not in before or before[name] is not value:
                if name.startswith("_") or callable(value) or isinstance(value, types.ModuleType):
                    _CHECK_NAMES[name] = value
