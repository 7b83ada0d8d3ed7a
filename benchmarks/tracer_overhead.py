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


def worker(args) -> None:
    import torch

    from utils.job import build_engine
    from utils.models import batches, get_model
    from utils.spec import JobSpec
    from utils.tracing import CudaClock, HostClock, InstructionTracer

    spec = JobSpec(model=args.model, num_stages=args.stages, micro_batches=args.micro_batches,
                   steps=args.steps, device=args.device)
    device = spec.resolved_device()
    if device == "cpu":
        torch.set_num_threads(1)
    model = get_model(spec.model, spec.model_options)
    engine = build_engine(spec, model, spec.boundaries())
    tracer = InstructionTracer(engine, stage=engine.stage_id, rank=int(os.environ["RANK"]),
                               clock=CudaClock() if device == "cuda" else HostClock())
    data = batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default="gpt", help="gpt (CPU size) or gpt-large (GPU size)")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    out = Path(tempfile.mkdtemp()) / "times.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    if args.device == "cuda":
        env["DS_ACCELERATOR"] = "cuda"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={args.stages}", __file__, "--worker", f"--stages={args.stages}",
                    f"--micro-batches={args.micro_batches}", f"--steps={args.steps}",
                    f"--device={args.device}", f"--model={args.model}", f"--out={out}"],
                   check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = json.loads(out.read_text())
    traced, untraced = statistics.median(times["True"]), statistics.median(times["False"])
    print(f"steps per arm: {len(times['True'])} traced, {len(times['False'])} untraced "
          f"({args.stages} stages, {args.micro_batches} micro-batches)")
    print(f"median step time: traced {traced * 1e3:.1f} ms, untraced {untraced * 1e3:.1f} ms")
    print(f"tracer overhead ratio (traced / untraced): {traced / untraced:.3f}  (target <= 1.03)")


if __name__ == "__main__":
    main()
