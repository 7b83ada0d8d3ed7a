"""Command line of the lab grader: ``python -m utils.grading COMMAND``.

    generate [LAB ...] [--check]     labs/ from solutions/ (--check: fail if labs/ is stale)
    validate LAB [--out DIR] [--runs-out DIR]
                                      the solution must score full marks, the student copy 0
    grade LAB SUBMISSIONS --out DIR [--workers N] [--timeout S] [--runs DIR] [--resume]
                                      grades.csv, feedback/, instructor/ (updated after
                                      every submission; --resume: keep finished ones)
    release --out DIR                 what students get: no solutions, no hidden tests

See docs/instructors.md for the workflow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .batch import grade_batch, validate
from .feedback import fmt
from .grade import PROJECT_ROOT, Options
from .isolation import MODES, IsolationError
from .notebook_source import LabSource, SourceError, find_lab, generate
from .release import ReleaseError, build_release
from .containment import Budget
from .sandbox import Limits


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(memory_gb=args.memory_gb, cpu_seconds=args.cpu_seconds, file_gb=args.file_gb,
                  isolation=args.isolation)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per cell for cells without their own limit (default: the lab's, else 120)")
    p.add_argument("--memory-gb", type=float, default=Limits.memory_gb,
                   help="address space per kernel process and each process it starts, GiB; 0: no limit")
    p.add_argument("--cpu-seconds", type=int, default=Limits.cpu_seconds,
                   help="CPU seconds per process; 0: no limit")
    p.add_argument("--file-gb", type=float, default=Limits.file_gb, help="largest file a process may write, GiB")
    p.add_argument("--isolation", choices=MODES, default=Limits.isolation,
                   help="bwrap (default): every kernel in a bubblewrap sandbox, and no grading where "
                        "bwrap does not work; none: no isolation, for trusted notebooks only")
    p.add_argument("--memory-budget-gb", type=float, default=Budget.memory_gb,
                   help="memory of ALL processes of one submission together, GiB (kernel, jobs, children)")
    p.add_argument("--disk-budget-mib", type=int, default=Budget.disk_mib,
                   help="MiB one submission may write into its working folder; over it its processes are "
                        "killed and the files removed (0: no bound)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT, help="the workbook folder")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="write labs/ from solutions/")
    p.add_argument("labs", nargs="*", help="only these labs (labNN or labNN_slug)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if labs/ differs")

    p = sub.add_parser("validate", help="grade the solution (full marks) and the student copy (zero)")
    p.add_argument("lab")
    p.add_argument("--out", type=Path, default=None, help="default: grading-output/validate-LAB")
    p.add_argument("--runs-out", type=Path, default=None,
                   help="keep the runs the solution recorded here (reuse with grade --runs)")
    _add_run_options(p)

    p = sub.add_parser("grade", help="grade a folder of submissions")
    p.add_argument("lab")
    p.add_argument("submissions", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, default=2, help="submissions graded at once (processes)")
    p.add_argument("--runs", type=Path, default=None,
                   help="recorded runs copied into every submission's runs/ (from validate --runs-out)")
    p.add_argument("--submission-timeout", type=float, default=3600,
                   help="wall-clock seconds one submission may take in all")
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in --out whose submission, lab, grader and options are "
                        "unchanged (after an interrupted run); without it every submission is graded again")
    p.add_argument("--seed", type=int, default=None,
                   help="the seed of the hidden checks' inputs for every submission (a regrade: the seed in a "
                        "result's .result.json); default: a fresh one per submission, recorded in its result")
    _add_run_options(p)

    p = sub.add_parser("release", help="build the student release")
    p.add_argument("--out", type=Path, required=True)

    args = parser.parse_args(argv)
    root = args.root
    try:
        if args.command == "generate":
            if args.check:
                problems = generate(root, check=True, labs=args.labs or None)
                for line in problems:
                    print(line, file=sys.stderr)
                print("labs/ is up to date" if not problems else f"{len(problems)} problem(s)")
                return 1 if problems else 0
            for path in generate(root, labs=args.labs or None):
                print(f"wrote {path}")
            return 0
        if args.command == "validate":
            lab = LabSource.load(find_lab(root, args.lab))
            out = args.out or root / "grading-output" / f"validate-{lab.name}"
            solution, empty = validate(lab, out, runs_out=args.runs_out,
                                       options=Options(timeout=args.timeout, limits=_limits(args)),
                                       budget=Budget(memory_gb=args.memory_budget_gb, disk_mib=args.disk_budget_mib))
            maximum = lab.max_points
            ok = solution.total == maximum and empty.total == 0 and not solution.error
            print(f"solution: {fmt(solution.total)}/{fmt(maximum)} ({solution.seconds:.1f} s); "
                  f"student copy: {fmt(empty.total)}/{fmt(maximum)} ({empty.seconds:.1f} s) -> "
                  + ("OK" if ok else f"NOT OK, see {out}/feedback"))
            return 0 if ok else 1
        if args.command == "grade":
            lab = find_lab(root, args.lab)
            if not args.submissions.is_dir():
                parser.error(f"{args.submissions} is not a folder")
            grade_batch(lab, args.submissions, args.out, workers=args.workers,
                        submission_timeout=args.submission_timeout, resume=args.resume,
                        budget=Budget(memory_gb=args.memory_budget_gb, disk_mib=args.disk_budget_mib),
                        options=Options(timeout=args.timeout, limits=_limits(args), runs=args.runs, seed=args.seed))
            return 0
        if args.command == "release":
            copied = build_release(root, args.out)
            print(f"release written to {args.out}: {', '.join(copied)}")
            return 0
    except (SourceError, ReleaseError, IsolationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
