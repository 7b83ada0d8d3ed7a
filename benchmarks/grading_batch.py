"""Time a class-sized grading batch: 20 submissions of lab 2 and of lab 3, 2 workers.

The target (issue 14): each batch under 5 minutes on a 2-core machine, no process left
behind. Lab 2 needs a real DeepSpeed job: its solution is graded first (recording the run),
then every submission reuses the recorded run, as ``grade --runs`` does for a class.

The 20 submissions mix what a class hands in (the prepared kinds of
``tests/grading/submissions.py``: correct, partly wrong, raising, looping, attacks...), so
the figure includes timeouts, a kernel restart and the judge's work, not only the easy case.

    python benchmarks/grading_batch.py [--labs lab02 lab03] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="+", default=["lab02", "lab03"], choices=sorted(KINDS))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    me = psutil.Process()
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
