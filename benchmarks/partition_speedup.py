"""Profile-guided partitioning against DeepSpeed's methods, on real jobs, as ratios.

    python benchmarks/partition_speedup.py [--stages 2 4] [--micro-batches 16 32] [--rounds 5]
                                           [--steps 6] [--device cpu] [--model gpt]
                                           [--model-options '{"blocks": 6}'] [--profile-once]

For each stage count and micro-batch count it runs the same job with
``partition="uniform"``, ``"parameters"`` and ``"profile"``, interleaved round by round so
that load from other processes hits all three alike, and in an order that rotates each
round (uniform, parameters, profile; parameters, profile, uniform; ...) because the first run
after a profile measured slower in every round of a fixed order. Right before each profile
run it profiles the layers afresh under the conditions the job's ranks get
(`utils.profiling.profile_for_job`, ``cache=False``: the rank's thread count, as many
processes measuring at once as the job has ranks), because a shared VM's speed drifts by
tens of percent within a minute and a profile only predicts the machine it saw
(``--profile-once``: one profile per configuration, as a learner would reuse it). The
profile run partitions on that profile, and every run records its prediction from the
latest one.

16 micro-batches by default: fill and drain cost about (p - 1) micro-batch times whatever
the partition, so few micro-batches dilute what a better partition gains. Each profile
prints that ceiling: the parameters / balanced step-time ratio its own costs imply for 1F1B
(`utils.analysis.theory.makespan_estimate`); ``--micro-batches 16 32`` shows the measured ratio
approach it as m grows.

It prints per run and per method:

- the step time: median over the steps after step 0 (step 0 pays one-off warm-up costs);
- the bubble ratio (median over the same steps, `Timeline.metrics`);
- the slowest stage's measured compute per step (forward + backward, median over steps)
  against the prediction recorded before launch (predicted per-micro-batch cost of that
  stage × micro-batches), as a relative error;
- the 1F1B formula (`utils.analysis.theory.makespan_estimate`) on the per-stage compute the run
  measured, and the time its slowest stage spent inside send/recv per step: DeepSpeed's
  p2p calls block until the neighbour joins them, so in a balanced pipeline, where the
  neighbour is always busy, each handshake waits on the critical path. The summary chains
  the ratios: the profile's ceiling, the slowest-stage compute in the jobs, the formula on
  it, and the measured step, so it shows where the gain is lost;
- the share of the machine's CPU time the hypervisor took for other guests while the run
  ran (``steal`` in /proc/stat). A VM's speed can also drift with no steal at all (on a
  2-vCPU VM, by 60 % within a minute): the A/A ratio below shows how much;
- a CPU-time cross-check of the same: each rank's CPU seconds per step (sampled with psutil)
  against the prediction × the share of a core the profile got. On a shared machine the
  wall-clock error partly measures waiting for a core; this shows what is left without it
  (biased high by the rank's optimizer, load and send/recv work).

With 2 stages, uniform and parameters give the same boundaries on the default gpt, so their
step-time ratio within a round is an A/A test: the run-to-run noise of this machine.

Targets (judged on the median over all rounds; rounds without steal are summarised apart):
profile >= 1.2x faster than parameters on 2 CPU stages; measured slowest-stage compute
within 15 % of the prediction. The machine's load average is printed at the start, after
every round and at the end.
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
QUIET_STEAL = 0.02
"""A round counts as quiet when steal took at most this share of the CPU time in each of its
runs. Steal inflates wall-clock time directly; both verdicts, all rounds and quiet rounds,
are printed."""


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {len(os.sched_getaffinity(0))} cores"


def steal_counters() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs so far, from /proc/stat; None where unavailable."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def run_sampled(spec, directory: Path):
    """Run `spec` to the end while sampling each rank's CPU time, and return the `Run` and the
    CPU seconds each rank spent per step after step 0.

    The tracer times instructions by the wall clock, which on a busy machine includes
    waiting for a core; CPU time does not. Per rank: the CPU time between the first sample
    after it finished step 1 and the first sample after its last step, over the steps in
    between (samples every 50 ms, so a few % of a step at most)."""
    import psutil

    from utils import start_job

    job = start_job(spec, directory=directory)
    procs: dict[int, psutil.Process] = {}
    marks: dict[int, dict[int, float]] = {}  # rank -> steps done -> CPU seconds when first seen
    while job.poll() == "running":
        for rank, child in job.launcher.workers().items():
            procs.setdefault(rank, child)
        for rank, proc in procs.items():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            done = len(job.run_dir.progress(rank))
            marks.setdefault(rank, {}).setdefault(done, times.user + times.system)
        time.sleep(0.05)
    cpu_per_step = {}
    for rank, seen in marks.items():
        counts = sorted(k for k in seen if k >= 1)
        if len(counts) >= 2:
            cpu_per_step[rank] = (seen[counts[-1]] - seen[counts[0]]) / (counts[-1] - counts[0])
    return job.result(), cpu_per_step


def measure(run, cpu_per_step: dict[int, float], core_share: float | None) -> dict:
    """What one finished run says: step time, bubble, slowest stage measured vs predicted."""
    from utils.analysis.theory import makespan_estimate
    from utils.timeline import COMM_KINDS

    spec = run.spec
    summary = run.timeline.metrics()  # medians over steps >= 1
    compute = list(summary.stage_compute)
    slowest = max(range(spec.num_stages), key=compute.__getitem__)
    predicted = run.predicted_stage_costs
    # Where the step goes beyond the slowest stage's compute: the 1F1B formula on the
    # compute this run measured (fill and drain included), and the time the slowest stage
    # spent inside send/recv calls, which DeepSpeed makes blocking, so a handshake with a
    # busy neighbour waits on the critical path.
    formula = makespan_estimate([c / spec.micro_batches for c in compute], spec.micro_batches)
    p2p = statistics.median(
        sum(e.duration for e in run.timeline.select(step=step, stage=slowest, kinds=COMM_KINDS))
        for step in run.timeline.steps if step >= 1)
    row = {"method": run.partition_method, "parts": run.parts,
           "step_s": statistics.median(run.step_times[1:]),
           "bubble": summary.bubble_ratio, "compute_s": compute, "slowest": slowest,
           "formula_s": formula, "p2p_s": p2p,
           "predicted_s": None, "predicted_slowest": None, "error": None}
    if predicted is not None:
        per_step = [c * spec.micro_batches for c in predicted]
        p_slowest = max(range(spec.num_stages), key=per_step.__getitem__)
        row.update(predicted_s=per_step, predicted_slowest=p_slowest,
                   error=compute[slowest] / per_step[p_slowest] - 1)
        if core_share and p_slowest in cpu_per_step:
            # CPU seconds against CPU seconds: the profile's wall times × the share of a core
            # it got, against the rank's CPU time per step. Waiting for a core is out of both;
            # but the rank's CPU time also holds its non-compute work (optimizer step, loading,
            # send/recv), so it reads high, most on stages with many parameters.
            row["cpu_error"] = cpu_per_step[p_slowest] / (per_step[p_slowest] * core_share) - 1
            row["job_share"] = cpu_per_step[p_slowest] / compute[p_slowest]
            row["cpu_s"] = [cpu_per_step.get(s) for s in range(spec.num_stages)]
            row["predicted_cpu_s"] = [c * core_share for c in per_step]
    return row


def ms(values) -> str:
    return "[" + ", ".join(f"{v * 1e3:.0f}" for v in values) + "]"


def ideal_ratio(profile, stages: int, micro_batches: int) -> float:
    """parameters / balanced step time that the profile's costs imply for 1F1B
    (`utils.analysis.theory.makespan_estimate`: no communication, no per-step work, no noise): the
    most any measured ratio can be expected to show."""
    from utils.analysis.theory import makespan_estimate

    rows = {r["method"]: r["stage_ms"] for r in profile.compare_partitions(stages)}
    return (makespan_estimate(rows["parameters"], micro_batches)
            / makespan_estimate(rows["balanced"], micro_batches))


def run_rounds(args, base: dict, directory: Path) -> list[dict]:
    """All rounds of one (stages, micro-batches) configuration; prints as it goes."""
    from utils import JobSpec
    from utils.jobs.plan import profile_for_job

    stages, micro_batches = base["num_stages"], base["micro_batches"]
    rows: list[dict] = []

    def fresh_profile(round_: int):
        started = time.time()
        profile = profile_for_job(JobSpec(**base, partition="profile"), cache=False)
        share = "" if profile.core_share is None else f", got {profile.core_share:.0%} of a core"
        print(f"  profile in round {round_} (measured in {time.time() - started:.1f} s, "
              f"{profile.threads} thread(s) in each of {profile.concurrency} processes{share}), "
              f"ms per micro-batch, forward+backward per layer {ms(profile.total)}")
        for row in profile.compare_partitions(stages):
            print(f"    predicted {row['method']:>10}: parts {row['parts']}, stages {row['stage_ms']} ms, "
                  f"bottleneck {row['bottleneck_ms']} ms (stage {row['slowest_stage']})")
        print(f"    ideal step-time ratio parameters / balanced at {micro_batches} micro-batches: "
              f"{ideal_ratio(profile, stages, micro_batches):.2f}x")
        return profile

    profile = fresh_profile(0)
    for round_ in range(args.rounds):
        shift = round_ % len(METHODS)
        for method in METHODS[shift:] + METHODS[:shift]:
            if method == "profile" and rows and not args.profile_once:
                profile = fresh_profile(round_)  # just before the run it partitions
            before = steal_counters()
            run, cpu = run_sampled(JobSpec(**base, partition=method, name=f"{method}-{stages}-{micro_batches}"),
                                   directory)
            after = steal_counters()
            row = {**measure(run, cpu, profile.core_share), "round": round_,
                   "ideal": ideal_ratio(profile, stages, micro_batches),
                   "steal": None if not (before and after and after[1] > before[1])
                   else (after[0] - before[0]) / (after[1] - before[1])}
            rows.append(row)
            error = "n/a" if row["error"] is None else f"{row['error']:+.1%}"
            if "cpu_error" in row:
                error += (f" (CPU time: {row['cpu_error']:+.1%}; the rank got {row['job_share']:.0%} "
                          f"of a core while computing, the profile {profile.core_share:.0%}; "
                          f"CPU/stage {ms(c or 0 for c in row['cpu_s'])} ms vs predicted "
                          f"{ms(row['predicted_cpu_s'])} ms)")
            steal = "" if row["steal"] is None else f"  steal {row['steal']:.0%}"
            print(f"  round {round_} {method:>10} {str(row['parts']):<16} step {row['step_s'] * 1e3:7.1f} ms{steal}  "
                  f"bubble {row['bubble']:.3f}  compute/stage {ms(row['compute_s'])} ms  "
                  f"1F1B formula {row['formula_s'] * 1e3:.0f} ms  slowest stage in send/recv {row['p2p_s'] * 1e3:.0f} ms  "
                  f"predicted {ms(row['predicted_s']) if row['predicted_s'] else 'n/a'} ms  "
                  f"slowest-stage error {error}")
        print(f"  after round {round_}: {load()}")
    return rows


def summarise(stages: int, micro_batches: int, rows: list[dict]) -> None:
    """Medians over rounds per method, then the verdicts against the targets."""
    by_method = {m: [r for r in rows if r["method"] == m] for m in METHODS}
    for method, runs in by_method.items():
        step = statistics.median(r["step_s"] for r in runs)
        bubble = statistics.median(r["bubble"] for r in runs)
        slow = statistics.median(r["compute_s"][r["slowest"]] for r in runs)
        formula = statistics.median(r["formula_s"] for r in runs)
        p2p = statistics.median(r["p2p_s"] for r in runs)
        preds = [r["predicted_s"][r["predicted_slowest"]] for r in runs if r["predicted_s"]]
        errors = [r["error"] for r in runs if r["error"] is not None]
        pred = f"{statistics.median(preds) * 1e3:8.0f}" if preds else f"{'n/a':>8}"
        err = f"{statistics.median(errors):+7.1%}" if errors else f"{'n/a':>7}"
        parts = " or ".join(sorted({str(r["parts"]) for r in runs}))  # profile may vary by round
        print(f"{stages:>6} {micro_batches:>3} {method:>10} {parts:<16} {step * 1e3:8.1f} {bubble:7.3f} "
              f"{slow * 1e3:15.0f} {pred} {err} {formula * 1e3:8.0f} {p2p * 1e3:8.0f}")
    label = f"{stages} stages, {micro_batches} micro-batches"
    per_round = [p["step_s"] / q["step_s"] for p, q in zip(by_method["parameters"], by_method["profile"])]
    uniform = [p["step_s"] / q["step_s"] for p, q in zip(by_method["uniform"], by_method["profile"])]
    same = [u["step_s"] / q["step_s"] for u, q in zip(by_method["uniform"], by_method["parameters"])
            if u["parts"] == q["parts"]]
    if same:  # an A/A test for free: two runs of one partition in the same round
        print(f"{label}: uniform and parameters are the same partition here; their step-time "
              f"ratio per round ({', '.join(f'{x:.2f}' for x in same)}) is the run-to-run noise")
    ideal = statistics.median(r["ideal"] for r in by_method["profile"])
    print(f"{label}: step time parameters / profile = {statistics.median(per_round):.2f}x "
          f"(per round {', '.join(f'{x:.2f}' for x in per_round)}; target >= 1.2 on 2 stages; "
          f"the profiles' own costs allow {ideal:.2f}x); uniform / profile = {statistics.median(uniform):.2f}x")
    def ratio(pick) -> float:  # median over rounds of parameters / profile
        return statistics.median(pick(p) / pick(q) for p, q in zip(by_method["parameters"], by_method["profile"]))

    print(f"{label}: parameters / profile, step by step from the ceiling to the measurement: "
          f"profile's costs {ideal:.2f}x -> slowest-stage compute in the jobs "
          f"{ratio(lambda r: r['compute_s'][r['slowest']]):.2f}x -> 1F1B formula on that "
          f"compute {ratio(lambda r: r['formula_s']):.2f}x -> measured step "
          f"{statistics.median(per_round):.2f}x (the slowest stage spent "
          f"{statistics.median(r['p2p_s'] for r in by_method['parameters']) * 1e3:.0f} / "
          f"{statistics.median(r['p2p_s'] for r in by_method['profile']) * 1e3:.0f} ms per step "
          "in send/recv)")
    errors = [r["error"] for r in by_method["profile"]]
    print(f"{label}: profile runs' slowest-stage compute vs prediction: median "
          f"{statistics.median(errors):+.1%} (per round {', '.join(f'{e:+.1%}' for e in errors)}; "
          "target within ±15 %)")
    cpu_errors = [r["cpu_error"] for r in by_method["profile"] if "cpu_error" in r]
    if cpu_errors:
        print(f"{label}: the same in CPU time (waiting for a core taken out, the rank's "
              f"optimizer/load/send work left in): {', '.join(f'{e:+.1%}' for e in cpu_errors)}")
    quiet = [i for i, p in enumerate(by_method["parameters"])
             if all((r["steal"] or 0) <= QUIET_STEAL for r in rows if r["round"] == p["round"])]
    if quiet and len(quiet) < len(per_round):
        print(f"{label}: rounds where no run lost more than {QUIET_STEAL:.0%} to steal "
              f"({', '.join(str(i) for i in quiet)}): parameters / profile = "
              f"{statistics.median(per_round[i] for i in quiet):.2f}x, slowest-stage error "
              f"{', '.join(f'{errors[i]:+.1%}' for i in quiet)}")
    steals = [r["steal"] for r in rows if r["steal"] is not None]
    if steals:
        print(f"{label}: CPU time stolen by the hypervisor during the runs: median "
              f"{statistics.median(steals):.0%}, max {max(steals):.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--model-options", default="{}", help="JSON, e.g. '{\"blocks\": 8}'")
    parser.add_argument("--profile-once", action="store_true",
                        help="profile once per configuration instead of before every profile run")
    args = parser.parse_args()

    directory = Path(tempfile.mkdtemp(prefix="partition-speedup-"))
    options = json.loads(args.model_options)
    print(f"start: {load()}; runs under {directory}")
    results: dict[tuple[int, int], list[dict]] = {}
    for stages in args.stages:
        for micro_batches in args.micro_batches:
            base = dict(model=args.model, model_options=options, num_stages=stages,
                        micro_batches=micro_batches, steps=args.steps, device=args.device)
            print(f"\n=== {stages} stages, {micro_batches} micro-batches, {args.model} "
                  f"{options or ''} on {args.device} ===")
            cores = len(os.sched_getaffinity(0))
            if args.device == "cpu" and stages > cores:
                print(f"  note: {stages} ranks share {cores} cores; the profile measures with as many "
                      "processes at once, so its costs include waiting for a core")
            results[stages, micro_batches] = run_rounds(args, base, directory)

    print("\n=== summary (medians over rounds) ===")
    print(f"{'stages':>6} {'m':>3} {'method':>10} {'parts':<16} {'step ms':>8} {'bubble':>7} "
          f"{'slowest meas ms':>15} {'pred ms':>8} {'error':>7} {'1F1B ms':>8} {'p2p ms':>8}")
    for (stages, micro_batches), rows in results.items():
        summarise(stages, micro_batches, rows)
    print(f"\nend: {load()}")


if __name__ == "__main__":
    main()
