"""Helpers an instructor's check may import: they work wherever the check runs.

A check runs in the judge (grading, the student's functions in another process) or in an
ordinary kernel (the solution notebook run top to bottom, nbval). `forbidding` means the
same in both: while the block runs, the named library functions raise AssertionError when
the student's code calls them, however it got hold of them (an alias imported earlier, the
module attribute), because the function's *code* is swapped, not a name.

This is a rule for honest students, not a wall: code in the student's kernel can save a
function's code object beforehand. Tokens such as ``__code__`` in a submission are flagged
for review (`grade.REVIEW_SIGNS`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
from collections.abc import Iterator

SEED_ENV = "GRADING_SEED"
"""How a judge learns the seed the grader picked for the submission (see `hidden_seed`)."""

_ACTIVE: list[tuple[tuple[str, ...], str]] = []
"""The `forbidding` blocks open now, innermost last (the judge's proxies send them along)."""


def active_forbidden() -> tuple[list[str], str]:
    """The functions forbidden now and the message of the innermost block."""
    targets = [t for block, _ in _ACTIVE for t in block]
    return targets, (_ACTIVE[-1][1] if _ACTIVE else "")


def hidden_seed(base: int) -> int:
    """The seed a hidden check draws its random inputs from: ``random.Random(hidden_seed(7))``.

    Outside grading (the solution run top to bottom, nbval) it is `base`. In a judge it is
    `base` mixed with the seed the grader picked for this submission (``$GRADING_SEED``,
    recorded in the result as `SubmissionResult.seed`): each grading draws fresh inputs, so a
    table of answers prepared from an earlier grading's inputs does not fit, and a regrade
    with the recorded seed (``grade --seed``) draws the same ones again."""
    seed = os.environ.get(SEED_ENV, "")
    if not seed:
        return base
    digest = hashlib.sha256(f"{base}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _refuse(*args, **kwargs):
    # Becomes the code of a forbidden function, so it runs with *that* function's globals and
    # no closure: it names nothing but builtins and finds the message through this module.
    raise AssertionError(__import__("utils.grading.check_api", fromlist=["_"]).active_forbidden()[1])


class _ReadOnly(type):
    """A class whose attributes cannot be assigned or deleted: `CodeSwap` here, the grader's
    entry point in the student's kernel (`student_side`)."""

    def __setattr__(cls, name, value):
        raise AttributeError("the grader's classes in the kernel are read-only")

    def __delattr__(cls, name):
        raise AttributeError("the grader's classes in the kernel are read-only")


class CodeSwap(metaclass=_ReadOnly):
    """The ban itself: while open, the named functions run `_refuse`'s code instead of their
    own. Every helper it uses is bound when this module is imported (default arguments) and
    its class refuses attribute assignment, so that code in a student's kernel that later
    replaces ``importlib``, ``getattr`` or this module's names does not lift it there."""

    def __init__(self, targets, message: str, *, _import=importlib.import_module, _getattr=getattr,
                 _hasattr=hasattr, _refusal=_refuse.__code__, _active=_ACTIVE, _str=str, _tuple=tuple):
        functions = []
        for target in targets:
            module, _, name = _str(target).rpartition(".")
            function = _getattr(_import(module), name, None)
            if function is None or not _hasattr(function, "__code__"):
                raise ValueError(f"{target} is not a Python function: name a function as package.module.function")
            functions.append(function)
        self.functions, self.block = functions, (_tuple(targets), _str(message))
        self.refusal, self.active = _refusal, _active

    def __enter__(self) -> None:
        self.saved = [(f, f.__code__) for f in self.functions]
        self.active.append(self.block)
        for f in self.functions:
            f.__code__ = self.refusal

    def __exit__(self, *_exc) -> None:
        self.active.pop()
        for f, code in self.saved:
            f.__code__ = code


@contextlib.contextmanager
def forbidding(*targets: str, message: str) -> Iterator[None]:
    """Forbid the functions named ``package.module.function`` inside the block.

    In this process their code is swapped for one raising ``AssertionError(message)``
    (`CodeSwap`); calls the judge forwards to the student's kernel carry the list, and the
    kernel swaps them the same way for the duration of each call.
    """
    with CodeSwap(targets, message):
        yield
