"""Headless demo for a GPU node over SSH (``make demo``): one real pipeline job, a standalone
HTML page of it (settings, metrics, per-stage time, the timeline of every step:
`utils.ui.report`) and a Chrome trace, and the metrics printed.

    python -m utils.ui.demo --out demo-output [--stages 4] [--micro-batches 8] [--steps 5] [--lang zh]

On a machine with at least `--stages` GPUs it runs the GPU-sized preset on CUDA + NCCL;
otherwise the CPU-sized preset on gloo — the same code path either way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from utils.jobs.launch import run_job
from utils.jobs.spec import JOB_SCHEDULES, JobSpec
from utils.ui.labels import LANGUAGES
from utils.ui.report import write_run_page


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--stages", type=int, default=None, help="default: 4 on a 4+ GPU node, else 2")
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--schedule", default="1f1b", choices=JOB_SCHEDULES)
    parser.add_argument("--lang", default=None, choices=LANGUAGES, help="page language (default: English)")
    args = parser.parse_args(argv)

    import torch

    stages = args.stages or (4 if torch.cuda.device_count() >= 4 else 2)
    spec = JobSpec.for_this_machine(num_stages=stages, micro_batches=args.micro_batches,
                                    steps=args.steps, schedule=args.schedule, name="demo",
                                    timeout=1800)
    on_gpu = spec.device == "cuda"
    print(f"running {stages} stages on {'CUDA/NCCL' if on_gpu else 'CPU/gloo'}: {spec.model}")
    run = run_job(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    html = write_run_page(run, args.out / "timeline.html", lang=args.lang)
    trace = run.timeline.to_chrome_trace(args.out / "trace.json")
    print(run.timeline.metrics())
    print(f"\npage (settings, metrics, every step): {html}\nchrome trace (open in ui.perfetto.dev): {trace}\nrun record: {run.path}")


if __name__ == "__main__":
    main()
