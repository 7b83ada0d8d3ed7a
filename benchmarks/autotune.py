"""Auto-tuner: how fast it searches, how well it predicts, and whether its choice beats
DeepSpeed's default configuration, measured side by side in one run.

    python benchmarks/autotune.py [--rounds 2] [--device auto]

1. Search speed: one real job's start-up (wall time of a 1-step `run_job` less its step) next
   to the search over every candidate of stage counts 2, 3, 4, 6 × micro-batch counts of a
   120-sample batch × four schedules × three partitions, with this model's fitted costs.
   Target: >= 500 candidates in less time than the job start (ratio printed).
2. `utils.autotune(spec, memory_budget=...)`: profiles, a calibration run of DeepSpeed's
   default (partition "parameters", 1F1B, the spec's micro-batches), the search, the first two
   runnable candidates in the tuner's order (the least memory among those predicted within 5 %
   of the fastest, then the rest fastest first: `utils.planning.tuning.ranked`) run for real. Target: median |predicted - measured| / measured step
   time <= 15 %.
3. The default and the tuned choice — the confirmed candidate that measured fastest, as a user
   would adopt it — then run again alternately (`--rounds` times each, A B A B) so that both
   see the same machine. Target: tuned step time <= the default's (ratio printed).

Measured on the 2-core CPU VM (2026-12-01, nothing else running, about 3 minutes): 574
candidates searched in 102 ms against a job start-up of 4.64 s (ratio 0.022). The calibration
run of the default (parameters [0, 4, 8], 1F1B, m = 4) measured 177.6 ms; the two confirmed
candidates, balanced [0, 6, 8] with GPipe at m = 8 and m = 4, were predicted 149.6 and 149.9 ms
and measured 159.2 and 142.9 ms (errors -6.0 % and +4.9 %, median 5.5 %). Alternating: default
175.4 ms, tuned (GPipe, m = 4) 144.1 ms: 1.22x. An earlier run picked the first candidate
instead of the fastest confirmed one and measured 1.06x; under three other jobs sharing the
cores the errors grew to 20-30 % and the ratio fell to 0.93-1.10x.

Again on 2026-12-02, with CPU jobs started by the warm agent (`utils.runtime.warm_agent`): 624
candidates in 112 ms against a start-up of 2.57 s (ratio 0.044); median prediction error 8.7 %;
default 191.6 ms against tuned (balanced [0, 6, 8], 1F1B, m = 4) 165.4 ms: 1.16x.

Again on 2026-12-04, with the memory tie-break and other helpers' jobs sharing the cores (load
3-5): 624 candidates in 368 ms against a start-up of 8.97 s (ratio 0.041). The fastest
prediction was GPipe m = 16 (301.0 ms, 155.1 MB); the tuner chose 1F1B m = 16 (309.1 ms, 2.7 %
slower, 32.8 MB) and confirmed it first: predicted 309.1, measured 328.4 ms (-5.9 %); GPipe
m = 16 measured 406.1 ms (-25.9 %); median error 15.9 %. Alternating: default 289.1 ms, tuned
476.0 ms (its two runs 378 and 574 ms): 0.61x -- under that load the ratio says nothing.

Again on 2026-12-04, nothing else running, twice: 624 candidates in 252 ms against a start-up of
3.29 s (0.077). Both times the model predicted m = 8 (micro-batches of 2 samples) fastest
(GPipe m = 8, 208.5 / 203.8 ms) and the tuner chose 1F1B m = 8 within 5 % (36 MB against 155);
the default to tuned ratio was 0.84x (default 219.8, tuned 261.8 ms) and 0.92x (264.7 against
288.5 ms), median errors 10.6 % and 19.2 %: the target is not met. What limits it, measured
alternately three times each (same machine, same hour): the default (parameters [0, 4, 8],
1F1B, m = 4) 264.1 ms, balanced [0, 6, 8] 1F1B m = 4 224.5 ms (1.18x), balanced 1F1B m = 8
267.6 ms (0.99x). So the partition the tuner finds is right, the micro-batch count is not:
the calibration (one run of the default at m = 4) underestimates what a micro-batch of 2
samples costs (errors -17 to -21 % at m = 8), and the confirmation runs, one job each, differ
by +-10 % between repeats of the same configuration, too much to undo a 2-5 % predicted gap.
A second calibration run at another micro-batch count would fit the fixed per-micro-batch
cost (`utils.analysis.microbatch_fit` does it for variable-length jobs); not done yet.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The gpt preset with a large vocabulary: its LM head is the heaviest layer by time but the
# embedding holds as many parameters, so DeepSpeed's "parameters" balance is not a time balance.
MODEL = {"model": "gpt", "model_options": {"blocks": 6, "vocab": 8192}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating re-runs of default and tuned")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--budget-mb", type=float, default=512.0, help="memory budget per rank (MB)")
    args = parser.parse_args()

    from utils import JobSpec, autotune, run_job, tune
    from utils.jobs.autotune import candidate_spec, layer_model_for, measured_step

    spec = JobSpec(**MODEL, num_stages=2, micro_batches=4, micro_batch_size=4, steps=4, device=args.device,
                   name="bench-tune")
    # 1. search speed against a job start
    t0 = time.perf_counter()
    one = run_job(replace(spec, steps=1, name="bench-start"), progress=False)
    start_up = time.perf_counter() - t0 - one.step_times[0]
    model = layer_model_for(spec)
    t0 = time.perf_counter()
    rows = tune(model, global_batch=120, stages=(2, 3, 4, 6))
    search = time.perf_counter() - t0
    print(f"search: {len(rows)} candidates in {search * 1e3:.1f} ms; one job's start-up {start_up:.2f} s; "
          f"ratio search / start-up = {search / start_up:.4f} (target < 1 with >= 500 candidates)")

    # 2. the tuner, confirmed
    tuning = autotune(spec, memory_budget=args.budget_mb * 2**20, confirm=2, steps=4)
    print(f"\nautotune: {len(tuning.candidates)} candidates for this batch in {tuning.search_seconds * 1e3:.1f} ms; "
          f"calibration {tuning.calibration}")
    for row in tuning.comparison():
        print("  ", row)
    print(f"median prediction error {tuning.median_error:.1%} (target <= 15 %)")
    for label, c in (("fastest", tuning.fastest), (f"chosen (least memory within {tuning.tolerance:.0%})", tuning.best)):
        print(f"  {label}: {c.partition} {list(c.boundaries)} {c.schedule} m={c.micro_batches}, "
              f"predicted {c.step_time * 1e3:.1f} ms, peak {max(c.peak_memory) / 2**20:.1f} MB")

    # 3. default against the tuned best, alternately
    best = tuning.best_measured.candidate
    default = replace(spec, partition="parameters", schedule="1f1b", name="bench-default")
    tuned = candidate_spec(spec, best, name="bench-tuned")
    measured: dict[str, list[float]] = {"default": [], "tuned": []}
    for _ in range(args.rounds):
        for label, job in (("default", default), ("tuned", tuned)):
            measured[label].append(measured_step(run_job(job, progress=False)))
    d, t = (statistics.median(measured[k]) for k in ("default", "tuned"))
    print(f"\nDeepSpeed default (parameters, 1f1b, m={spec.micro_batches}): {d * 1e3:.1f} ms/step {measured['default']}")
    print(f"tuned ({best.partition} {list(best.boundaries)}, {best.schedule}, m={best.micro_batches}): "
          f"{t * 1e3:.1f} ms/step {measured['tuned']}")
    print(f"speed-up default / tuned = {d / t:.2f}x (target >= 1)")


if __name__ == "__main__":
    main()
