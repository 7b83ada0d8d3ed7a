"""Record what DeepSpeed really does with every config of the corpus, on real ranks.

    .venv/bin/python -m tests.lintdiff.record             # the whole corpus -> tests/data/lint_outcomes.json
    .venv/bin/python -m tests.lintdiff.record --sample 12 # a sample, printed, nothing written
    .venv/bin/python -m tests.lintdiff.record --changed   # only new or changed cases, merged into the file

Cases are grouped by world (stages × data-parallel replicas); each group runs as CPU/gloo
ranks of `tests.lintdiff.world` under torchrun, which try the configs one after another. When
a world stops early (a case its ranks did not all pass or all fail alike in ``initialize``, a
crash, a hang), the next world starts at the case after the last one every rank recorded; a
case no rank could record is kept as ``crashed`` with the end of the ranks' output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.lintdiff.corpus import Case, corpus
from tests.lintdiff.world import RESTART

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ROOT / "tests" / "data" / "lint_outcomes.json"
#: seconds one world may run per case it has left, plus start-up (import deepspeed on every rank).
SECONDS_PER_CASE, START_SECONDS = 90, 240


def outcome(records: list[dict], world: int) -> dict:
    """One case's outcome from its ranks' lines: where it failed first (``initialize`` before
    ``step``) with that rank's error, or ``done`` with rank 0's facts. A rank with no line was
    stopped by torchrun after another failed."""
    failed = [r for r in records if r["phase"] != "done"]
    if not failed:
        return {"phase": "done", "error": None, "facts": records[0]["facts"]}
    # the rank whose own error is the cause: not one that timed out waiting for a crashed peer
    first = min(failed, key=lambda r: (r["phase"] != "initialize", _is_wait(r["error"]), r["rank"]))
    return {"phase": first["phase"], "error": first["error"], "facts": first["facts"] and
            {k: v for k, v in first["facts"].items() if k in ("micro_batches", "micro_batch_size", "train_batch_size")},
            "failed_ranks": sorted({r["rank"] for r in failed} | (set(range(world)) - {r["rank"] for r in records}))}


def _is_wait(error: dict | None) -> bool:
    text = f"{(error or {}).get('type')} {(error or {}).get('message')}".lower()
    return any(word in text for word in ("timed out", "timeout", "connection closed", "connection reset"))


def run_world(cases: list[Case], *, num_stages: int, data_parallel: int) -> dict[str, dict]:
    """Every case's outcome on `num_stages` × `data_parallel` ranks, restarting the world as needed."""
    results: dict[str, dict] = {}
    todo = list(cases)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    while todo:
        with tempfile.TemporaryDirectory() as out:
            path = Path(out, "cases.json")
            path.write_text(json.dumps([c.as_dict() for c in todo]), encoding="utf-8")
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1",
                       f"--nproc-per-node={num_stages * data_parallel}", "-m", "tests.lintdiff.world", str(path), out]
            try:
                proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT,
                                      timeout=START_SECONDS + SECONDS_PER_CASE * len(todo))
                code, log = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as expired:
                code, log = "timeout", f"{expired.stdout or ''}{expired.stderr or ''}"
            started = list(Path(out).glob("rank*.jsonl"))
            if not started:
                raise RuntimeError(f"the world did not start (exit {code}):\n{_tail(log, 40)}")
            lines = {}
            for file in started:
                for line in file.read_text(encoding="utf-8").splitlines():
                    record = json.loads(line)
                    lines.setdefault(record["id"], []).append(record)
        world = num_stages * data_parallel
        done = 0
        for case in todo:
            records = sorted(lines.get(case.id, []), key=lambda r: r["rank"])
            if len(records) == world or any(r["phase"] != "done" for r in records):
                # every rank's line, or a rank that failed and left (torchrun then stops the rest)
                results[case.id] = outcome(records, world)
                done += 1
                if len(records) == world:
                    continue
                break
            if records or not done:  # the case this world stopped in, with no rank's error
                results[case.id] = {"phase": "crashed", "error": {"type": "world", "message": _tail(log),
                                                                  "where": ""}, "facts": None,
                                    "failed_ranks": sorted(set(range(world)) - {r["rank"] for r in records})}
                done += 1
            break
        todo = todo[done:]
    return results


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-1500:]


def record(cases: list[Case]) -> dict[str, dict]:
    """Every case's outcome, world by world, with a progress line per world on stderr."""
    results = {}
    worlds = sorted({(c.num_stages, c.data_parallel) for c in cases})
    for num_stages, data_parallel in worlds:
        group = [c for c in cases if (c.num_stages, c.data_parallel) == (num_stages, data_parallel)]
        began = time.monotonic()
        results.update(run_world(group, num_stages=num_stages, data_parallel=data_parallel))
        print(f"{num_stages} stages × {data_parallel} replicas: {len(group)} configs in "
              f"{time.monotonic() - began:.0f} s", file=sys.stderr)
    return results


def update(cases: list[Case]) -> None:
    """Record the cases of `cases` that the outcomes file lacks or holds with another config or
    intent; keep the rest; drop those no longer in the corpus."""
    data = json.loads(OUTCOMES.read_text(encoding="utf-8"))
    if data["recorded_with"] != deepspeed_version():
        raise SystemExit(f"the file was recorded with {data['recorded_with']}: record the whole corpus again")
    kept = {c["id"]: c for c in data["cases"]}
    stale = [c for c in cases
             if c.id not in kept or (kept[c.id]["config"], kept[c.id]["intent"]) != (c.config, c.intent)]
    results = record(stale)
    old = {c["id"]: c["outcome"] for c in data["cases"]}
    fresh = {c.id: results[c.id] for c in stale}
    data["cases"] = [{**c.as_dict(), "outcome": fresh.get(c.id, old.get(c.id))} for c in cases]
    OUTCOMES.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(stale)} recorded, {len(cases) - len(stale)} kept -> {OUTCOMES.relative_to(ROOT)}", file=sys.stderr)


def deepspeed_version() -> str:
    from importlib.metadata import version

    return f"deepspeed {version('deepspeed')}, torch {version('torch')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=0, help="record this many cases (spread over the corpus), "
                        "print them and write nothing")
    parser.add_argument("--only", nargs="*", default=(), help="record only these case ids, print them")
    parser.add_argument("--changed", action="store_true", help="record only the cases the file lacks or holds with "
                        "another config or intent, and update the file (same DeepSpeed and torch only)")
    args = parser.parse_args()
    cases = corpus()
    if args.changed:
        update(cases)
        return
    if args.only:
        cases = [c for c in cases if c.id in set(args.only)]
    elif args.sample:
        cases = cases[:: max(1, len(cases) // args.sample)][: args.sample]
    results = record(cases)
    if args.sample or args.only:
        print(json.dumps(results, indent=1, ensure_ascii=False))
        return
    data = {"recorded_with": deepspeed_version(), "device": "cpu (gloo)",
            "cases": [{**c.as_dict(), "outcome": results[c.id]} for c in cases]}
    OUTCOMES.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} outcomes -> {OUTCOMES.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
