"""The lab grader: generate student copies, grade submissions, build the student release.

A small grader on nbformat + nbclient that keeps nbgrader's conventions
(``### BEGIN SOLUTION`` / ``### END SOLUTION``, ``### BEGIN HIDDEN TESTS`` /
``### END HIDDEN TESTS``, points and ids in cell metadata) and fixes what made nbgrader and
otter unusable here: deleted or edited test cells change nothing (the checks come from the
source), hidden test code and tracebacks never reach feedback, every check has its own
points, a crash or timeout costs only the checks that depend on it, and no Docker is needed.

Modules: `notebook_source` (source conventions, student copies), `execute` (cell-by-cell
kernel execution with timeouts and restarts), `sandbox` (per-process limits),
`containment` (the whole process tree of a submission: subreaper, total memory budget, output
limits), `isolation` (bubblewrap: what a submission's kernel may see and write), `judge` and
`judge_process` (checks run outside the kernel, against a trusted reference), `codec` (the
plain data between them), `student_side` (what runs in the kernel during a check),
`check_api` (helpers checks import), `grade` (one submission), `batch` (a folder, in
parallel), `feedback` (messages, Markdown, grades.csv), `release`. Command line:
``python -m utils.grading --help``; workflow: docs/instructors.md.
"""

import importlib

#: Public names and the module that defines each. Imported on first use, so that a grading
#: kernel importing `utils.grading.student_side` does not pay for nbclient and the rest.
_EXPORTS = {
    "grade_batch": "batch", "validate": "batch",
    "Options": "grade", "SubmissionResult": "grade", "grade_notebook": "grade", "plan": "grade",
    "read_submission": "grade",
    "Check": "notebook_source", "LabSource": "notebook_source", "SourceError": "notebook_source",
    "Task": "notebook_source", "dumps": "notebook_source", "find_lab": "notebook_source",
    "generate": "notebook_source",
    "ReleaseError": "release", "build_release": "release",
    "Limits": "sandbox", "Budget": "containment",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
