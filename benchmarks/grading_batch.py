"""Time a class-sized grading batch: 20 submissions of lab 2 and of lab 3, 2 workers.

The target (issue 14): each batch under 5 minutes on a 2-core machine, no process left
behind. Lab 2 needs a real DeepSpeed job: its solution is graded first (recording the run),
then every submission reuses the recorded run, as ``grade --runs`` does for a class.

The 20 submissions mix what a class hands in (the prepared kinds of
``tests/grading/submissions.py``: correct, partly wrong, raising, looping, attacks...), so
the figure includes timeouts, a kernel restart and the judge's work, not only the easy case.

    python benchmarks/grading_batch.py [--labs lab02 lab03] [--workers 2]

``--against DIR`` measures the cost of a change: DIR is another checkout of the workbook (the
code before it, e.g. ``git worktree add /tmp/before <commit>``); the batches of both run in
turn, ``--rounds`` times each, and the seconds per submission are printed side by side with
their ratio (the machine's noise hits both alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

#: The checkout whose grader is measured: this one, or another given by `compare` (the code before a change).
CODE_ROOT = os.environ.get("GRADING_BENCH_ROOT") or str(Path(__file__).resolve().parents[1])
sys.path.insert(0, CODE_ROOT)

from tests.grading.submissions import ROOT, build  # noqa: E402
from utils.grading import Options, grade_batch  # noqa: E402
from utils.grading.notebook_source import LabSource, find_lab  # noqa: E402

KINDS = {
    "lab02": ["correct", "partly_wrong", "raising", "looping", "tests_edited", "tests_deleted", "liar", "empty",
              "metadata_lost", "patched_reference", "frame_reader", "history_leak", "runner_swap"],
    "lab03": ["correct", "partly_wrong", "raising", "looping", "tests_edited", "tests_deleted", "liar", "empty",
              "metadata_lost", "aliased", "answers_first", "code_saver", "other_algorithm", "helper_early",
              "answers_moved"],
}
SUBMISSIONS = 20
TIMEOUT = 10.0
"""Per-cell timeout for cells without their own, as the grading tests use (a loop costs this)."""


def class_of(lab: LabSource, short: str, folder: Path) -> None:
    """`SUBMISSIONS` notebooks: the kinds in turn, then correct ones (most of a class)."""
    folder.mkdir(parents=True)
    kinds = KINDS[short] + ["correct"] * max(0, SUBMISSIONS - len(KINDS[short]))
    for n, kind in enumerate(kinds[:SUBMISSIONS]):
        (folder / f"s{n:02d}_{kind}.ipynb").write_text(build(lab, kind), encoding="utf-8")


def compare(args) -> int:
    """This checkout against ``args.against``, in turn: seconds per submission, side by side."""
    here, there = Path(__file__).resolve().parents[1], Path(args.against).resolve()
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for _ in range(args.rounds):
        for label, root in (("before", there), ("after", here)):
            # this script each time, importing the grader (and the prepared submissions) of `root`
            done = subprocess.run([sys.executable, __file__, "--json", "--labs", *args.labs,
                                   "--workers", str(args.workers)],
                                  cwd=root, capture_output=True, text=True,
                                  env={**os.environ, "GRADING_BENCH_ROOT": str(root), "PYTHONPATH": str(root)})
            if done.returncode not in (0, 1) or not done.stdout.strip():
                print(done.stdout + done.stderr)
                return 2
            for short, per in json.loads(done.stdout.strip().splitlines()[-1]).items():
                figures[label].setdefault(short, []).append(per)
    for short in args.labs:
        before, after = statistics.median(figures["before"][short]), statistics.median(figures["after"][short])
        print(f"{short}: seconds per submission (batch time / submissions, median of {args.rounds} rounds): "
              f"before {before:.2f} s ({there.name}), after {after:.2f} s; after / before = {after / before:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="+", default=["lab02", "lab03"], choices=sorted(KINDS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--against", help="another checkout (the code before a change): compare with it")
    parser.add_argument("--rounds", type=int, default=2, help="with --against: batches of each, in turn")
    parser.add_argument("--json", action="store_true", help="print seconds per submission as JSON (last line)")
    args = parser.parse_args()
    if args.against:
        return compare(args)
    me = psutil.Process()
    per_submission: dict[str, float] = {}
    failed = False
    for short in args.labs:
        lab = LabSource.load(find_lab(ROOT, short))
        with tempfile.TemporaryDirectory(prefix=f"bench-{short}-") as tmp:
            tmp = Path(tmp)
            runs = None
            if short == "lab02":  # record the lab's real run once, as an instructor does
                (tmp / "solution").mkdir()
                (tmp / "solution" / "solution.ipynb").write_bytes(lab.path.read_bytes())
                started = time.monotonic()
                grade_batch(lab, tmp / "solution", tmp / "solution-out", workers=1, echo=lambda s: None,
                            options=Options(timeout=TIMEOUT, keep_runs=tmp / "runs"))
                runs = tmp / "runs"
                print(f"{short}: solution graded with its real job in {time.monotonic() - started:.1f} s")
            class_of(lab, short, tmp / "submissions")
            before = {p.pid for p in me.children(recursive=True)}
            started = time.monotonic()
            results = grade_batch(lab, tmp / "submissions", tmp / "out", workers=args.workers,
                                  echo=lambda s: None, options=Options(timeout=TIMEOUT, runs=runs))
            seconds = time.monotonic() - started
            time.sleep(1.0)
            left = [p for p in me.children(recursive=True) if p.pid not in before]
            per = sorted(r.seconds for r in results)
            print(f"{short}: {len(results)} submissions, {args.workers} workers: {seconds:.1f} s "
                  f"(target < 300 s: {seconds / 300:.2f} of it); per submission median {per[len(per) // 2]:.1f} s, "
                  f"max {per[-1]:.1f} s; processes left behind: {len(left)}")
            failed |= seconds >= 300 or bool(left)
            per_submission[short] = seconds / len(results)
    if args.json:
        print(json.dumps(per_submission))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
