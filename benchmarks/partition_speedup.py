"""Profile-guided partitioning against DeepSpeed's methods, on real jobs, as ratios.

    python benchmarks/partition_speedup.py [--stages 2 4] [--rounds 3] [--micro-batches 8]
                                           [--steps 6] [--device cpu] [--model gpt]
                                           [--model-options '{"blocks": 6}'] [--reuse-profile]

For each stage count it first profiles the layers under the conditions a job rank gets
(`utils.profiling.profile_for_job`; measured afresh unless ``--reuse-profile``, so the
profile sees today's machine), then runs the same job with ``partition="uniform"``,
``"parameters"`` and ``"profile"``, interleaved round by round (uniform, parameters,
profile; uniform, parameters, profile; ...) so that load from other processes hits all
three alike. It prints per run and per method:

- the step time: median over the steps after step 0 (step 0 pays one-off warm-up costs);
- the bubble ratio (median over the same steps, `Timeline.metrics`);
- the slowest stage's measured compute per step (forward + backward, median over steps)
  against the prediction recorded before launch (predicted per-micro-batch cost of that
  stage × micro-batches), as a relative error.

Targets: profile >= 1.2x faster than parameters on 2 CPU stages; measured slowest-stage
compute within 15 % of the prediction. The machine's load average is printed at the start,
after every round and at the end: on a shared machine it explains most of the noise.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("uniform", "parameters", "profile")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {len(os.sched_getaffinity(0))} cores"


def measure(run) -> dict:
    """What one finished run says: step time, bubble, slowest stage measured vs predicted."""
    spec = run.spec
    summary = run.timeline.metrics()  # medians over steps >= 1
    compute = list(summary.stage_compute)
    slowest = max(range(spec.num_stages), key=compute.__getitem__)
    predicted = run.predicted_stage_costs
    row = {"method": run.partition_method, "parts": run.parts,
           "step_s": statistics.median(run.step_times[1:]),
           "bubble": summary.bubble_ratio, "compute_s": compute, "slowest": slowest,
           "predicted_s": None, "predicted_slowest": None, "error": None}
    if predicted is not None:
        per_step = [c * spec.micro_batches for c in predicted]
        p_slowest = max(range(spec.num_stages), key=per_step.__getitem__)
        row.update(predicted_s=per_step, predicted_slowest=p_slowest,
                   error=compute[slowest] / per_step[p_slowest] - 1)
    return row


def ms(values) -> str:
    return "[" + ", ".join(f"{v * 1e3:.0f}" for v in values) + "]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--model-options", default="{}", help="JSON, e.g. '{\"blocks\": 8}'")
    parser.add_argument("--reuse-profile", action="store_true",
                        help="use a cached profile if there is one instead of measuring afresh")
    args = parser.parse_args()

    from utils import JobSpec, run_job
    from utils.profiling import profile_for_job

    directory = Path(tempfile.mkdtemp(prefix="partition-speedup-"))
    options = json.loads(args.model_options)
    print(f"start: {load()}; runs under {directory}")
    results: dict[int, list[dict]] = {}
    for stages in args.stages:
        base = dict(model=args.model, model_options=options, num_stages=stages,
                    micro_batches=args.micro_batches, steps=args.steps, device=args.device)
        started = time.time()
        profile = profile_for_job(JobSpec(**base, partition="profile"), cache=args.reuse_profile)
        print(f"\n=== {stages} stages, {args.micro_batches} micro-batches of {profile.micro_batch_size}, "
              f"{args.model} {options or ''} on {profile.device} ===")
        print(f"profile ({'cached' if profile.cached else f'measured in {time.time() - started:.1f} s'}, "
              f"{profile.threads} thread(s)), ms per micro-batch: forward+backward per layer "
              f"{ms(profile.total)}; IQR fwd {ms(profile.forward_iqr)} bwd {ms(profile.backward_iqr)}")
        for row in profile.compare_partitions(stages):
            print(f"  predicted {row['method']:>10}: parts {row['parts']}, stages {row['stage_ms']} ms, "
                  f"bottleneck {row['bottleneck_ms']} ms (stage {row['slowest_stage']})")
        rows = results[stages] = []
        for round_ in range(args.rounds):
            for method in METHODS:
                run = run_job(JobSpec(**base, partition=method, name=f"{method}-{stages}"),
                              directory=directory, progress=False)
                row = {**measure(run), "round": round_}
                rows.append(row)
                error = "n/a" if row["error"] is None else f"{row['error']:+.1%}"
                print(f"  round {round_} {method:>10} {str(row['parts']):<16} step {row['step_s'] * 1e3:7.1f} ms  "
                      f"bubble {row['bubble']:.3f}  compute/stage {ms(row['compute_s'])} ms  "
                      f"predicted {ms(row['predicted_s']) if row['predicted_s'] else 'n/a'} ms  "
                      f"slowest-stage error {error}")
            print(f"  after round {round_}: {load()}")

    print("\n=== summary (medians over rounds) ===")
    print(f"{'stages':>6} {'method':>10} {'parts':<16} {'step ms':>8} {'bubble':>7} "
          f"{'slowest meas ms':>15} {'pred ms':>8} {'error':>7}")
    for stages, rows in results.items():
        by_method = {m: [r for r in rows if r["method"] == m] for m in METHODS}
        for method, runs in by_method.items():
            step = statistics.median(r["step_s"] for r in runs)
            bubble = statistics.median(r["bubble"] for r in runs)
            slow = statistics.median(r["compute_s"][r["slowest"]] for r in runs)
            preds = [r["predicted_s"][r["predicted_slowest"]] for r in runs if r["predicted_s"]]
            errors = [r["error"] for r in runs if r["error"] is not None]
            pred = f"{statistics.median(preds) * 1e3:8.0f}" if preds else f"{'n/a':>8}"
            err = f"{statistics.median(errors):+7.1%}" if errors else f"{'n/a':>7}"
            print(f"{stages:>6} {method:>10} {str(runs[0]['parts']):<16} {step * 1e3:8.1f} {bubble:7.3f} "
                  f"{slow * 1e3:15.0f} {pred} {err}")
        per_round = [p["step_s"] / q["step_s"] for p, q in zip(by_method["parameters"], by_method["profile"])]
        uniform = [p["step_s"] / q["step_s"] for p, q in zip(by_method["uniform"], by_method["profile"])]
        errors = [r["error"] for r in by_method["profile"]]
        print(f"{stages} stages: step time parameters / profile = {statistics.median(per_round):.2f}x "
              f"(per round {', '.join(f'{x:.2f}' for x in per_round)}; target >= 1.2 on 2 stages); "
              f"uniform / profile = {statistics.median(uniform):.2f}x")
        print(f"{stages} stages: profile runs' slowest-stage compute vs prediction: "
              f"{', '.join(f'{e:+.1%}' for e in errors)} (target within ±15 %)")
    print(f"\nend: {load()}")


if __name__ == "__main__":
    main()
