"""The GPU path, checked in one short run on a machine with CUDA (not part of CI).

    python benchmarks/gpu_check.py

1. A 1-stage job on CUDA: the CUDA-event clock resolves once per step, events are ordered
   and non-overlapping on the stage, and the traced compute adds up to no more than the
   step's wall time (the job synchronizes only at step ends).
2. Per-instruction timing sanity: forward and backward durations are positive and stable
   across steps (spread printed), backward/forward ratio printed.
3. With >= 2 GPUs, a 2-stage job on NCCL, same checks, plus the tracer overhead ratio.
"""

import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import utils  # noqa: E402


def check(stages: int) -> None:
    run = utils.run_job(utils.JobSpec(model="gpt-large", num_stages=stages, micro_batches=8, steps=6,
                                      device="cuda", timeout=900), progress=False)
    tl = run.timeline
    for stage in range(stages):
        events = tl.select(stage=stage)
        for a, b in zip(events, events[1:]):
            assert a.end <= b.start + 1e-6, f"overlapping events on stage {stage}: {a} {b}"
    m = tl.metrics()
    for step, wall in enumerate(run.step_times):
        compute = sum(e.duration for e in tl.select(step=step, stage=0, kinds=["forward", "backward"]))
        assert compute <= wall * 1.01, (step, compute, wall)
    f = [e.duration for e in tl.select(stage=0, kinds=["forward"]) if e.step > 0]
    b = [e.duration for e in tl.select(stage=0, kinds=["backward"]) if e.step > 0]
    print(f"{stages} stage(s): step times {[round(t * 1e3, 1) for t in run.step_times]} ms")
    print(f"  forward median {statistics.median(f) * 1e3:.2f} ms (min {min(f) * 1e3:.2f}, max {max(f) * 1e3:.2f}); "
          f"backward median {statistics.median(b) * 1e3:.2f} ms; backward/forward {statistics.median(b) / statistics.median(f):.2f}")
    print(f"  bubble {m.bubble_ratio:.1%}, makespan {m.makespan * 1e3:.1f} ms, step {m.step_time * 1e3:.1f} ms, "
          f"peak memory {run.peak_memory} ({run.memory_kind})")


if __name__ == "__main__":
    assert torch.cuda.is_available(), "this check needs a GPU"
    print(torch.cuda.get_device_name(0), "GPUs:", torch.cuda.device_count())
    check(1)
    if torch.cuda.device_count() >= 2:
        check(2)
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tracer_overhead.py"), "--device", "cuda",
                        "--stages", "2", "--model", "gpt-large"], check=True)
