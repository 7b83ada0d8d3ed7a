"""Tracer overhead: step time with the instruction tracer on vs off, alternating step by
step inside one real job (so both see the same machine state), printed as a ratio.

    python benchmarks/tracer_overhead.py [--stages 2] [--steps 21] [--device auto]

Target: traced / untraced <= 1.03. This script is its own worker program: run without
``--worker`` it starts itself under torchrun, one process per stage.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def job_spec(args):
    from utils.jobs.spec import JobSpec

    return JobSpec(model=args.model, num_stages=args.stages, micro_batches=args.micro_batches,
                   steps=args.steps, device=args.device)


def worker_engine(args):
    """In a worker: the job's spec, engine at the parent's boundaries, and data iterator, set up
    as every rank of a real job is (device, CPU threads). `benchmarks/record_overhead.py` uses it too."""
    from utils.runtime.rank import build_engine, use_device
    from utils.system.cpu import prepare_cpu_rank
    from utils.workloads.models import batches, get_model

    spec = job_spec(args)
    use_device(args.device)  # resolved by the parent, which set up this process's environment
    if args.device == "cpu":
        prepare_cpu_rank()
    model = get_model(spec.model, spec.model_options)
    engine = build_engine(spec, model, json.loads(args.boundaries), args.device)
    return spec, engine, batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size)


def worker(args) -> None:
    import torch

    from utils.runtime.tracing import CudaClock, HostClock, InstructionTracer

    spec, engine, data = worker_engine(args)
    device = args.device
    tracer = InstructionTracer(engine, stage=engine.stage_id, rank=int(os.environ["RANK"]),
                               clock=CudaClock() if device == "cuda" else HostClock())
    times = {True: [], False: []}
    for step in range(spec.steps):
        traced = step % 2 == 1  # step 0 (warm-up) untraced and dropped below
        tracer.enable(traced)
        tracer.begin_step(step)
        started = time.perf_counter()
        engine.train_batch(data_iter=data)
        if traced:
            tracer.end_step()
        elif device == "cuda":
            torch.cuda.synchronize()
        if step > 0:
            times[traced].append(time.perf_counter() - started)
    if int(os.environ["RANK"]) == 0:
        Path(args.out).write_text(json.dumps({str(k): v for k, v in times.items()}))
    os._exit(0)


def launch_alternating(args, *, script: str, prefix: str, extra: tuple[str, ...] = ()) -> tuple[dict, Path, str]:
    """Run `script` as its own worker under torchrun, one process per stage, with the environment
    a real job's ranks get; returns the step times rank 0 wrote (arm name -> list of seconds),
    the scratch folder and the device. The spec and the device are checked before anything starts.
    `benchmarks/record_overhead.py` uses it too."""
    from utils.jobs.launchers import SINGLE_NODE_ARGS, LocalTorchrun
    from utils.jobs.plan import plan_job

    plan = plan_job(job_spec(args))  # checks the spec and the device before anything starts
    env = LocalTorchrun().environment(plan)  # the environment a real job's ranks get
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    out, log = folder / "times.json", folder / "ranks.log"
    with open(log, "wb") as sink:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *SINGLE_NODE_ARGS,
                               f"--nproc-per-node={args.stages}", script, "--worker",
                               f"--stages={args.stages}", f"--micro-batches={args.micro_batches}",
                               f"--steps={args.steps}", f"--device={plan.device}", f"--model={args.model}",
                               f"--out={out}", f"--boundaries={json.dumps(list(plan.boundaries))}", *extra],
                              env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"the job failed (exit code {done.returncode}); the end of {log}:\n"
                 + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    return json.loads(out.read_text()), folder, plan.device


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default="gpt", help="gpt (CPU size) or gpt-large (GPU size)")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--boundaries", default="", help="set by the parent from the job's plan")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    times, _, _ = launch_alternating(args, script=__file__, prefix="tracer-overhead-")
    traced, untraced = statistics.median(times["True"]), statistics.median(times["False"])
    print(f"steps per arm: {len(times['True'])} traced, {len(times['False'])} untraced "
          f"({args.stages} stages, {args.micro_batches} micro-batches)")
    print(f"median step time: traced {traced * 1e3:.1f} ms, untraced {untraced * 1e3:.1f} ms")
    print(f"tracer overhead ratio (traced / untraced): {traced / untraced:.3f}  (target <= 1.03)")


if __name__ == "__main__":
    main()
