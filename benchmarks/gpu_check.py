"""The GPU path, checked in one short run on a machine with CUDA (not part of CI).

    python benchmarks/gpu_check.py [--device cuda] [--out DIR]

On a GPU node without a package registry, run ``bash benchmarks/gpu_node.sh`` instead: it
installs the wheels `benchmarks/gpu_wheels.py` gathered, runs this, and packs the records.

What one GPU can honestly run, and what is checked there:

1. A 1-stage job on CUDA: the CUDA-event clock, events ordered and non-overlapping on the
   stage, traced compute within the step's wall time, forward/backward medians, peak memory
   per stage, step time.
2. The same instructions timed by CUDA events and by the host clock side by side (two nested
   tracers on one engine in this process): the host clock sees when a kernel was *queued*,
   the events when it *ran*; their ratio per instruction kind is printed.
3. Per-layer profiling on the GPU feeding the simulator, printed as 模拟 (simulated): the
   predicted bubble of a 4-stage exact partition, a prediction, not a run.
4. The dynamic half: the per-layer cost meter's CUDA events with freezing, and variable-length
   token-budget micro-batches, on which the fixed cost of a micro-batch is fitted in token
   units (`utils.analysis.microbatch_fit`; the plans assume `varlen.OVERHEAD_TOKENS`, a CPU
   figure).

5. An NCCL timeout seen from the host (`nccl_timeout`): one rank's all-reduce stuck behind GPU
   work returns to the host before the process-group timeout, and the watchdog's flight-recorder
   dump lands where the launcher's environment for NCCL jobs puts it (chapter 26.7).

Multi-stage jobs need a GPU per rank (NCCL refuses two ranks on one GPU); with >= 2 GPUs it
also runs a 2-stage job over NCCL, the tracer overhead benchmark, a live re-partition (loss
equal to the static job's) and the re-balancing benchmark.

``--device cpu`` runs the same checks with a small model on a CPU: the test suite runs it
(tests/integration/test_gpu_kit.py) so that the script works the first time on a GPU.

Every job has a short timeout (`JOB_TIMEOUT_S`; DeepSpeed's process group gets that plus two
minutes), so a hang costs minutes, not the session; gpu_node.sh bounds the whole run. The
results are also written to ``OUT/gpu_check.json`` and every run is recorded under
``OUT/runs``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB_TIMEOUT_S = 180
"""Each job's limit: a gpt-large job of a few steps takes seconds on one GPU."""

#: The model per device: the GPU-sized preset, and a small one for the CPU rehearsal.
MODELS = {"cuda": {"model": "gpt-large"},
          "cpu": {"model": "gpt", "model_options": {"blocks": 4, "hidden": 64, "heads": 4, "vocab": 256,
                                                    "seq_len": 32}}}


def job_spec(device: str, **fields):
    """A spec for this check: the device's model, a short timeout, a few steps."""
    import utils

    return utils.JobSpec(**{**MODELS[device], "device": device, "timeout": JOB_TIMEOUT_S, "micro_batches": 8,
                            "steps": 6, **fields})


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def one_job(device: str, stages: int, results: dict) -> None:
    import utils

    run = utils.run_job(job_spec(device, num_stages=stages, name=f"gpu-check-{stages}-stage"), progress=False)
    tl = run.timeline
    for stage in range(stages):
        events = tl.select(stage=stage)
        for a, b in zip(events, events[1:]):
            assert a.end <= b.start + 1e-6, f"overlapping events on stage {stage}: {a} {b}"
    for step, wall in enumerate(run.step_times):
        compute = sum(e.duration for e in tl.select(step=step, stage=0, kinds=["forward", "backward"]))
        assert compute <= wall * 1.01, (step, compute, wall)
    f = [e.duration for e in tl.select(stage=0, kinds=["forward"]) if e.step > 0]
    b = [e.duration for e in tl.select(stage=0, kinds=["backward"]) if e.step > 0]
    m = tl.metrics()
    results[f"{stages}_stage_job"] = row = {
        "step_ms": [ms(t) for t in run.step_times], "forward_median_ms": ms(statistics.median(f)),
        "forward_range_ms": [ms(min(f)), ms(max(f))], "backward_median_ms": ms(statistics.median(b)),
        "backward_over_forward": round(statistics.median(b) / statistics.median(f), 3),
        "bubble": round(m.bubble_ratio, 4), "peak_memory_bytes": run.peak_memory, "memory_kind": run.memory_kind,
        "notes": list(run.notes)}
    print(f"{stages}-stage job: {json.dumps(row)}")


def compare_clocks(device: str, results: dict, steps: int = 6) -> None:
    """CUDA events (inner tracer) against the host clock (outer tracer) on the same
    instructions of one engine in this process. Run last: it joins a 1-rank process group."""
    import torch

    from utils.jobs.multinode import free_port
    from utils.runtime.rank import build_engine, use_device
    from utils.runtime.tracing import CudaClock, HostClock, InstructionTracer
    from utils.workloads.models import batches, get_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    use_device(device)
    spec = job_spec(device, num_stages=1)
    model = get_model(spec.model, spec.model_options)
    engine = build_engine(spec, model, [0, model.num_layers], device)
    device_clock = CudaClock() if device == "cuda" else HostClock()
    inner = InstructionTracer(engine, stage=0, rank=0, clock=device_clock)
    outer = InstructionTracer(engine, stage=0, rank=0, clock=HostClock())
    data = batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size)
    per_kind: dict[str, list[tuple[float, float]]] = {}
    for step in range(steps):
        outer.begin_step(step)
        inner.begin_step(step)
        engine.train_batch(data_iter=data)
        timed, hosted = inner.end_step(), outer.end_step()
        assert [(e.kind, e.micro_batch) for e in timed] == [(e.kind, e.micro_batch) for e in hosted]
        if step > 0:
            for d, h in zip(timed, hosted):
                per_kind.setdefault(d.kind, []).append((d.duration, h.duration))
    results["clocks"] = rows = {
        kind: {"device_clock_median_ms": ms(statistics.median(d for d, _ in pairs)),
               "host_clock_median_ms": ms(statistics.median(h for _, h in pairs)), "samples": len(pairs)}
        for kind, pairs in per_kind.items()}
    for kind, row in rows.items():
        print(f"clock {kind:>10}: {'CUDA events' if device == 'cuda' else 'host'} {row['device_clock_median_ms']} ms, "
              f"host clock {row['host_clock_median_ms']} ms ({row['samples']} samples)")
    del engine, inner, outer
    torch.distributed.destroy_process_group()
    if device == "cuda":
        torch.cuda.empty_cache()


def profile_and_simulate(device: str, results: dict) -> None:
    """GPU layer costs feeding the simulator: a prediction, labelled as one."""
    import utils

    spec = job_spec(device, num_stages=1)
    profile = utils.profile_layers(spec.model, model_options=spec.model_options, device=device,
                                   micro_batch_size=spec.micro_batch_size, repeats=5)
    stages = min(4, len(profile.forward))
    parts = utils.partition_layers(profile.total, stages)
    forward = utils.stage_costs(profile.forward, parts)
    backward = utils.stage_costs(profile.backward, parts)
    simulated = utils.simulate(utils.build_schedule("1f1b", stages, 8), forward, backward, label="模拟 (simulated)")
    results["profile"] = row = {
        "device_name": profile.device_name, "layer_total_ms": [ms(t) for t in profile.total],
        "simulated_partition": parts, "simulated_bubble": round(simulated.metrics().bubble_ratio, 4)}
    print(f"layer profile on {profile.device_name}: {row['layer_total_ms']} ms per layer")
    print(f"模拟 (simulated, not a run): {stages} stages at {parts}, 8 micro-batches -> bubble {row['simulated_bubble']:.1%}")


def dynamic_half(device: str, results: dict) -> None:
    import utils

    model = utils.get_model(MODELS[device]["model"], MODELS[device].get("model_options"))
    freeze = max(1, model.num_layers // 2)
    run = utils.run_job(job_spec(device, num_stages=1, micro_batches=4, rebalance=utils.Rebalance(every=2, window=1),
                                 freeze_at={3: freeze}, name="gpu-check-meter"), progress=False)
    costs = run.layer_costs[max(run.layer_costs)]
    assert all(f > 0 for f, _ in costs.values()), costs
    assert all(b == 0 for i, (_, b) in costs.items() if i < freeze), costs
    assert all(b > 0 for i, (_, b) in costs.items() if i >= freeze), costs
    tokens = model.options["seq_len"]
    budget = utils.run_job(job_spec(device, num_stages=1, micro_batches=4, batching="token-budget",
                                    token_budget=4 * tokens, name="gpu-check-varlen"), progress=False)
    # The fixed cost of a micro-batch on this device, in token units (chapter 19's `a`): the plan
    # assumes varlen.OVERHEAD_TOKENS, fitted on a 2-core CPU.
    from utils.analysis.microbatch_fit import fit_micro_batch_costs
    from utils.workloads.varlen import OVERHEAD_TOKENS, default_cost

    fitted = fit_micro_batch_costs(budget, default_cost(model))
    results["dynamic"] = row = {
        "meter_forward_ms": [ms(f) for f, _ in costs.values()], "frozen_layers": freeze,
        "token_budget_losses": [round(x, 5) for x in budget.losses],
        "token_budget_micro_batches": [len(v) for v in budget.micro_batch_tokens.values()],
        "fixed_cost_tokens": {kind: round(fit.fixed_tokens, 1) for (_, kind), fit in fitted.items()},
        "fixed_cost_ms": {kind: ms(fit.fixed_s) for (_, kind), fit in fitted.items()},
        "fixed_cost_points": fitted[0, "forward"].points, "plan_assumes_tokens": OVERHEAD_TOKENS}
    print(f"dynamic half: {json.dumps(row)}")


def two_gpus(results: dict) -> None:
    import utils

    one_job("cuda", 2, results)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tracer_overhead.py"), "--device", "cuda",
                    "--stages", "2", "--model", "gpt-large"], check=True, timeout=2 * JOB_TIMEOUT_S)
    static = utils.run_job(job_spec("cuda", num_stages=2, micro_batches=4, name="gpu-check-static"), progress=False)
    parts = static.parts
    moved = utils.run_job(replace(static.spec, partition=tuple(parts), name="gpu-check-live",
                                  repartition_at={3: (0, parts[1] + 2, parts[2])}), progress=False)
    gap = max(abs(a - b) / abs(b) for a, b in zip(moved.losses, static.losses))
    live = max(e.duration for e in moved.timeline.select(kinds=("repartition",)))
    # Each rank's own record of the move (utils.runtime.migrate.MOVES): the process groups it held before and
    # after (an NCCL communicator each), and the CUDA allocator's peak over the move against its start.
    moves = {rank: result["live_moves"][0] for rank, result in moved.results.items()}
    results["live_repartition"] = {"ms": ms(live), "loss_gap": gap, "per_rank": {
        rank: {"groups_before": m["groups_before"], "groups_after": m["groups_after"],
               "cuda_max_memory_allocated": m.get("cuda_max_memory_allocated"), "memory_base": m["memory"]["base"]}
        for rank, m in moves.items()}}
    print(f"live re-partition over NCCL: {live * 1e3:.0f} ms, loss gap to static {gap:.2g}")
    for rank, m in sorted(moves.items()):
        print(f"  rank {rank}: process groups {m['groups_before']} -> {m['groups_after']}, allocator peak during the "
              f"move {m.get('cuda_max_memory_allocated', 0) / 2**20:.1f} MiB (at its start "
              f"{m['memory']['base'] / 2**20:.1f} MiB)")
    assert all(m["groups_after"] == m["groups_before"] for m in moves.values())
    assert gap <= 1e-5
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dynamic_rebalance.py"), "--device", "cuda"],
                   check=True, timeout=4 * JOB_TIMEOUT_S)


NCCL_PROBE = r"""
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(seconds=float(sys.argv[1])),
                        device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda._sleep(10 ** 6); torch.cuda.synchronize()  # load the kernel first: the timing below is of the sleep alone
start.record(); torch.cuda._sleep(10 ** 8); end.record(); end.synchronize()
per_second = int(1e3 / start.elapsed_time(end) * 10 ** 8)  # cycles; one _sleep call takes at most 2**31
for _ in range(int(float(sys.argv[2]))):
    torch.cuda._sleep(per_second)  # the GPU busy this many seconds
t0 = time.monotonic()
work = dist.all_reduce(x, async_op=True)  # queued behind the sleep: it cannot finish within the timeout
work.wait()
print(f"WAIT {time.monotonic() - t0:.3f}", flush=True)
x[0].item()
print(f"ITEM {time.monotonic() - t0:.3f}", flush=True)
time.sleep(float(sys.argv[2]) + 30)
print("ALIVE", flush=True)
"""


def nccl_timeout(results: dict, *, timeout_s: float = 5.0, busy_s: float = 15.0) -> None:
    """What the host sees when an NCCL operation outlives the process-group timeout (chapter 26.7,
    `utils.diagnose`'s ``nccl-host-view``): one rank, an all-reduce queued behind `busy_s` of GPU
    work, a `timeout_s` process-group timeout, with the flight-recorder environment the launcher
    gives an NCCL job (`utils.jobs.launchers.nccl_debug_environment`). Checked: ``work.wait()``
    returns to the host before the timeout (the host runs ahead of the stuck operation), and the
    watchdog writes the flight-recorder dump where that environment says."""
    from utils.jobs.launchers import nccl_debug_environment
    from utils.jobs.rundir import RunDir

    run_dir = RunDir(Path(os.environ["WORKBOOK_RUNS"]) / "gpu-check-nccl-timeout")
    run_dir.path.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    env.update(nccl_debug_environment(run_dir, env), MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", NCCL_PROBE, str(timeout_s), str(busy_s)], env=env,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    dumps = sorted(str(p.relative_to(run_dir.path)) for p in run_dir.path.rglob("*") if p.is_file())
    results["nccl_timeout"] = row = {
        "timeout_s": timeout_s, "gpu_busy_s": busy_s, "exit_code": proc.returncode,
        "wait_returned_s": float(lines.get("WAIT", "nan")), "item_returned_s": float(lines.get("ITEM", "nan")),
        "blocking_wait": env.get("TORCH_NCCL_BLOCKING_WAIT", "0"),
        "alive_after_timeout": "ALIVE" in proc.stdout, "seconds": round(time.monotonic() - started, 1),
        "dumps": dumps, "watchdog": [ln for ln in proc.stderr.splitlines() if "Watchdog caught" in ln][:1]}
    print(f"nccl timeout: {json.dumps(row)}")
    (run_dir.path / "probe-stderr.txt").write_text(proc.stderr)
    assert row["wait_returned_s"] < timeout_s, row  # the host ran ahead of the stuck all-reduce
    assert row["watchdog"], "NCCL's watchdog did not report the timeout"
    assert dumps, f"no flight-recorder dump under {run_dir.path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default="gpu-check-out", help="where gpu_check.json and the runs go")
    parser.add_argument("--only", default="", help="comma-separated checks (job, profile, dynamic, two-gpus, "
                        "nccl, clocks); default: all that this machine can run")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["WORKBOOK_RUNS"] = str(out / "runs")  # every run of this check, and nothing else, there
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cuda" and gpus == 0:
        sys.exit("this check needs a GPU (torch sees none); --device cpu rehearses it on a CPU")
    results = {"device": args.device, "gpus": gpus, "torch": torch.__version__}
    print(json.dumps(results))
    checks = {"job": lambda: one_job(args.device, 1, results),
              "profile": lambda: profile_and_simulate(args.device, results),
              "dynamic": lambda: dynamic_half(args.device, results),
              "two-gpus": lambda: two_gpus(results),
              "nccl": lambda: nccl_timeout(results),
              "clocks": lambda: compare_clocks(args.device, results)}  # last: it joins a process group
    chosen = args.only.split(",") if args.only else [
        c for c in checks if (c != "two-gpus" or gpus >= 2) and (c != "nccl" or args.device == "cuda")]
    unknown = sorted(set(chosen) - set(checks))
    if unknown:
        sys.exit(f"unknown check(s) {unknown}; choose from {sorted(checks)}")
    failed = []
    for name in sorted(chosen, key=list(checks).index):
        started = time.monotonic()
        try:  # a failing check does not cost the others: a GPU session is short and rare
            checks[name]()
        except Exception:  # noqa: BLE001 - reported, then the next check runs
            traceback.print_exc()
            failed.append(name)
        results.setdefault("seconds", {})[name] = round(time.monotonic() - started, 1)
        print(f"[{name}] {'FAILED' if name in failed else 'passed'} in {results['seconds'][name]} s", flush=True)
        results["failed"] = failed
        (out / "gpu_check.json").write_text(json.dumps(results, indent=1))  # kept as far as it got
    if failed:
        sys.exit(f"failed: {failed}; results in {out / 'gpu_check.json'}")
    print(f"all checks passed; results in {out / 'gpu_check.json'}")


if __name__ == "__main__":
    main()
