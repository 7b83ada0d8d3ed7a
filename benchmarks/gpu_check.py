"""The GPU path, checked in one short run on a machine with CUDA (not part of CI).

    python benchmarks/gpu_check.py

1. A 1-stage job on CUDA: the CUDA-event clock resolves once per step, events are ordered
   and non-overlapping on the stage, and the traced compute adds up to no more than the
   step's wall time (the job synchronizes only at step ends).
2. Per-instruction timing sanity: forward and backward durations are positive and stable
   across steps (spread printed), backward/forward ratio printed.
3. With >= 2 GPUs, a 2-stage job on NCCL, same checks, plus the tracer overhead ratio.
4. The dynamic half on CUDA: the per-layer cost meter's CUDA events, freezing and
   variable-length token-budget micro-batches on one GPU; with >= 2 GPUs a live
   re-partition over NCCL (loss equal to the static job's) and the re-balancing benchmark.
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


def check_dynamic() -> None:
    common = dict(model="gpt-large", micro_batches=4, steps=6, device="cuda", timeout=900)
    run = utils.run_job(utils.JobSpec(**common, num_stages=1, rebalance=utils.Rebalance(every=2, window=1),
                                      freeze_at={3: 4}, name="gpu-meter"), progress=False)
    costs = run.layer_costs[max(run.layer_costs)]
    assert all(f > 0 for f, _ in costs.values()), costs
    assert all(b == 0 for i, (_, b) in costs.items() if i < 4) and all(b > 0 for i, (_, b) in costs.items() if i >= 4)
    print(f"meter on CUDA: layer forward ms {[round(f * 1e3, 2) for f, _ in costs.values()]}")
    budget = utils.run_job(utils.JobSpec(**common, num_stages=1, batching="token-budget", token_budget=4 * 512,
                                         name="gpu-varlen"), progress=False)
    print(f"token-budget on CUDA: losses {[round(x, 4) for x in budget.losses]}, "
          f"micro-batches {[len(v) for v in budget.micro_batch_tokens.values()]}")
    if torch.cuda.device_count() >= 2:
        static = utils.run_job(utils.JobSpec(**common, num_stages=2, name="gpu-static"), progress=False)
        parts = static.parts
        moved = utils.run_job(utils.JobSpec(**common, num_stages=2, partition=tuple(parts),
                                            repartition_at={3: (0, parts[1] + 2, parts[2])}, name="gpu-live"),
                              progress=False)
        gap = max(abs(a - b) / abs(b) for a, b in zip(moved.losses, static.losses))
        live = max(e.duration for e in moved.timeline.select(kinds=("repartition",)))
        print(f"live re-partition over NCCL: {live * 1e3:.0f} ms, loss gap to static {gap:.2g}")
        assert gap <= 1e-5
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dynamic_rebalance.py"), "--device", "cuda"],
                       check=True)


if __name__ == "__main__":
    assert torch.cuda.is_available(), "this check needs a GPU"
    print(torch.cuda.get_device_name(0), "GPUs:", torch.cuda.device_count())
    check(1)
    if torch.cuda.device_count() >= 2:
        check(2)
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tracer_overhead.py"), "--device", "cuda",
                        "--stages", "2", "--model", "gpt-large"], check=True)
    check_dynamic()
