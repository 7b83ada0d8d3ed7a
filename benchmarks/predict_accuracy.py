"""How far can the simulator be trusted? Calibrate on one real run, predict others, measure.

    python benchmarks/predict_accuracy.py [--steps 4]

For 2 stages of the gpt preset, two partitions, micro-batch counts 2–16 and both schedules
DeepSpeed runs here (1f1b, gpipe), every configuration is run for real. Per partition, the
1f1b run with 4 micro-batches calibrates the per-stage costs (`utils.predict_from_timeline`); every other
configuration is predicted from it and compared with its measured step time. The step time
predicted is the simulated pipeline phase plus the calibration run's per-step remainder
(optimizer step, gradient reduction), which the simulator does not model.
Prints |predicted − measured| / measured per configuration, the median and the maximum
(target: median <= 10 %), then how many search configurations evaluate in the time of one
real run.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import utils  # noqa: E402
from utils.planning.whatif import _time_search  # noqa: E402

PARTITIONS = {"parameters": "parameters", "[0,6,8]": [0, 6, 8]}
MICRO_BATCHES = (2, 4, 8, 16)
from utils.jobs.spec import JOB_SCHEDULES as SCHEDULES  # noqa: E402 - the schedules a job runs


def measured(run) -> tuple[float, float]:
    """Median step time and median pipeline makespan over steps but step 0."""
    times = run.step_times[1:]
    return statistics.median(times), run.timeline.metrics().makespan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    rows, slowest_run = [], 0.0
    for label, partition in PARTITIONS.items():
        runs = {}
        for m in MICRO_BATCHES:
            for schedule in SCHEDULES:
                started = time.perf_counter()
                runs[m, schedule] = utils.run_job(utils.JobSpec(
                    num_stages=2, micro_batches=m, schedule=schedule, partition=partition,
                    steps=args.steps, device="cpu"), progress=False)
                slowest_run = max(slowest_run, time.perf_counter() - started)
        calibration = runs[4, "1f1b"]
        step_time, makespan = measured(calibration)
        remainder = step_time - makespan
        for (m, schedule), run in runs.items():
            if run is calibration:
                continue
            predicted = utils.predict_from_timeline(calibration.timeline, micro_batches=m, schedule=schedule)
            real, _ = measured(run)
            guess = predicted.metrics().makespan + remainder
            rows.append((label, schedule, m, real, guess, abs(guess - real) / real))

    print(f"{'partition':>11} {'schedule':>8} {'m':>3} {'measured ms':>12} {'predicted ms':>13} {'error':>7}")
    for label, schedule, m, real, guess, err in rows:
        print(f"{label:>11} {schedule:>8} {m:>3} {real * 1e3:12.1f} {guess * 1e3:13.1f} {err:7.1%}")
    errors = [r[-1] for r in rows]
    print(f"prediction error over {len(rows)} configurations: median {statistics.median(errors):.1%}, "
          f"max {max(errors):.1%}  (target: median <= 10%)")
    n, seconds = _time_search()
    print(f"search: {n} configurations in {seconds:.2f} s; one real run took up to {slowest_run:.1f} s "
          f"(ratio {slowest_run / seconds:.0f}x)")


if __name__ == "__main__":
    main()
