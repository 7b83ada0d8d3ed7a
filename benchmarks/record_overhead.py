"""`utils.record` overhead: step time with the recorder on vs off, alternating step by step
inside one real job (so both see the same machine state), printed as a ratio.

    python benchmarks/record_overhead.py [--stages 2] [--steps 21] [--device auto] [--no-layer-costs]

Target (issue 40): recorded / not recorded <= 1.03. The recorder is what a learner's own script
gets from ``utils.record(engine)``: the instruction tracer, the memory meter at every
instruction, the per-layer cost meter (unless ``--no-layer-costs``; by default on one recorded
step in `LAYER_COST_EVERY` = 4, ``--layer-cost-every``) and the per-step records written to
disk. The engine is a plain DeepSpeed ``PipelineEngine`` of the ``gpt`` preset; this script is
its own worker program: run without ``--worker`` it starts itself under torchrun, one process
per stage. The printed ratio is the steady state: the median of recorded steps without and
with the layer meter, mixed 3 : 1 as a long run mixes them, over the median of plain steps.

Measured on the 2-core development VM (CPU, gloo; `gpt` CPU defaults, 2 stages, 8
micro-batches; quiet machine, load average ~1; 2026-12-04/05):

- default (layers timed one step in four), 41 steps: **1.016, 1.023, 1.011** (three runs);
- ``--layer-cost-every 1`` (every step), 41 steps: 1.012, 1.019, 1.024; an earlier 21-step run
  1.042 — the meter's cost is near the target's edge on this model: a pre-hook, a hook and a
  tensor hook per layer and micro-batch (a few tens of microseconds) on layers of about a
  millisecond, hence the one-in-four default;
- ``--no-layer-costs``: 1.004, 1.010; the tracer alone (`tracer_overhead.py`) 1.014.

Runs differ by about ±0.01 from one to the next, which is the resolution of these figures. With
two notebooks and a test suite running beside it, an earlier version read 1.103 (meter every
step): contention, not the recorder. The meter's cost is per layer call, so its share falls as
layers grow (GPU-sized layers: not measured, no GPU was lent).
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

from tracer_overhead import launch_alternating, worker_engine  # noqa: E402 - the same job and launch

from utils.runtime.recorder import LAYER_COST_EVERY  # noqa: E402


def worker(args) -> None:
    import torch

    import utils

    spec, engine, data = worker_engine(args)
    device = args.device
    recorder = utils.record(engine, out=args.record, layer_costs=not args.no_layer_costs,
                            layer_cost_every=args.layer_cost_every)
    times = {"plain": [], "recorded": [], "metered": []}  # metered: recorded steps that also timed every layer
    for step in range(spec.steps):
        recorded = step % 2 == 1  # step 0 (warm-up) not recorded and dropped below
        recorder.enable(recorded)
        metered = recorded and not args.no_layer_costs and recorder.times_layers(recorder.steps)
        started = time.perf_counter()
        engine.train_batch(data_iter=data)
        if device == "cuda":
            torch.cuda.synchronize()
        if step > 0:
            times["metered" if metered else "recorded" if recorded else "plain"].append(time.perf_counter() - started)
    if int(os.environ["RANK"]) == 0:
        Path(args.out).write_text(json.dumps(times))
    recorder.finish()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default="gpt", help="gpt (CPU size) or gpt-large (GPU size)")
    parser.add_argument("--no-layer-costs", action="store_true", help="record without the per-layer cost meter")
    parser.add_argument("--layer-cost-every", type=int, default=LAYER_COST_EVERY,
                        help="time every layer on one recorded step in this many (utils.record's default)")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--record", default="")
    parser.add_argument("--boundaries", default="", help="set by the parent from the job's plan")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    record = Path(tempfile.mkdtemp(prefix="record-overhead-")) / "run"
    times, _, device = launch_alternating(args, script=__file__, prefix="record-overhead-", extra=(
        f"--record={record}", f"--layer-cost-every={args.layer_cost_every}",
        *(["--no-layer-costs"] if args.no_layer_costs else [])))
    plain = statistics.median(times["plain"])
    every = 0 if args.no_layer_costs else args.layer_cost_every
    what = "tracer + memory meter + records" + (f" + per-layer cost meter every {every} steps" if every else "")
    print(f"steps: {len(times['plain'])} not recorded, {len(times['recorded'])} recorded, "
          f"{len(times['metered'])} recorded with every layer timed "
          f"({args.stages} stages, {args.micro_batches} micro-batches, {device}; {what})")
    print(f"median step time: not recorded {plain * 1e3:.1f} ms" + "".join(
        f", {arm} {statistics.median(times[arm]) * 1e3:.1f} ms ({statistics.median(times[arm]) / plain:.3f})"
        for arm in ("recorded", "metered") if times[arm]))
    # Over a long run one recorded step in `every` times the layers: the recorder's cost per step is the
    # mix of the two medians (medians, not the mean of a few steps: one descheduled step would dominate).
    parts = [(every - 1 if every else 1, times["recorded"]), (1 if every else 0, times["metered"])]
    weight = sum(w for w, found in parts if found)
    mixed = sum(w * statistics.median(found) for w, found in parts if found) / weight
    print(f"recorder overhead ratio (recorded / not, steady state): {mixed / plain:.3f}  (target <= 1.03)")
    print(f"the record: {record}")


if __name__ == "__main__":
    main()
