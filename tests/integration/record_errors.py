"""Record the error texts of real DeepSpeed pipeline mistakes, for `utils.jobs.errors`.

    .venv/bin/python tests/integration/record_errors.py            # every case, ~5 min on 2 cores
    .venv/bin/python tests/integration/record_errors.py batch dict_out

Each mistake of chapter 25 that `JobSpec` cannot express (it needs a layer list of its own) runs
as a 2-rank CPU/gloo job of this file under torchrun (``--rank-program``); the workbook's
injected faults and misused dynamic features run as real jobs (`utils.run_job`). Every failing rank's error (type,
message, the end of its traceback) or, for a rank that died in C++, the end of its log, is
written to tests/data/deepspeed_errors.json with the code `utils.jobs.errors.explain` should
give it; tests/unit/test_diagnose.py checks the patterns against these texts, so a new
DeepSpeed or torch version that words an error differently shows up as a failing test after
re-recording. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "deepspeed_errors.json"
V, H, L, B = 512, 64, 16, 2

#: case -> the code `explain` must give the error of the rank that failed first.
MISTAKES = {
    "batch": "batch-arithmetic",               # train_batch_size != micro x gas x dp
    "stages_gt_layers": "empty-stage",         # 2 stages, 1 layer
    "no_loss_fn": "loss-not-scalar",           # loss on the wrong stage: none on the last
    "loss_mid": "scalar-between-stages",       # loss on the wrong stage: computed mid-model
    "dict_out": "non-tensor-output",
    "tuple_int": "non-tensor-output",
    "unused_float": "received-activation-without-grad",  # requires_grad on received activations
    "detached": "output-without-grad",
    "tied_attr": "tied-weight-attr",
    "tied_no_fn": "tied-forward",
    "zero2": "zero-with-pipeline",
    "non_contiguous": "non-contiguous-output",
}
#: case -> (Fault fields, expected code): recorded from real jobs of the workbook.
FAULTS = {
    "fault_shape_step1": ({"kind": "mismatch", "stage": 0, "step": 1}, "tensor-mismatch"),
    "fault_dtype_step0": ({"kind": "mismatch", "stage": 0, "step": 0, "tensor": "dtype"}, "dtype-mismatch"),
    "fault_shape_step0": ({"kind": "mismatch", "stage": 0, "step": 0}, "shape-mismatch"),
    "fault_memory": ({"kind": "memory", "stage": 1, "cap_mb": 1}, "out-of-memory"),
    "fault_raise": ({"kind": "raise", "stage": 1, "step": 1}, "injected-fault"),
    "fault_exhausted": ({"kind": "exhausted", "stage": 0, "step": 1}, "data-exhausted"),
}

#: case -> (JobSpec fields over the small GPT's, expected code): dynamic features misused.
JOBS = {
    # A restart-mode move of 3 stages with DeepSpeed's own optimizer loader: stages 0 and 2
    # change their parameter count (a size error); stage 1 keeps it and loads silently.
    "optimizer_reload": ({"model_options": {"blocks": 6, "hidden": H, "heads": 4, "vocab": V, "seq_len": 16},
                          "num_stages": 3, "steps": 3, "partition": [0, 3, 6, 8], "repartition_at": {2: (0, 2, 5, 8)},
                          "repartition_mode": "restart", "repartition_optimizer": "deepspeed"},
                         "optimizer-state-mismatch"),
    # wall_clock_breakdown with 2 stages: the first non-last stage starts bwd_microstep twice (chapter 23.4).
    "wall_clock_breakdown": ({"deepspeed_config": {"wall_clock_breakdown": True}, "strict": False},
                             "timer-started-twice"),
    # The process-group timeout before the job's own (chapter 26.5): stage 1 hangs in its backward and
    # stage 0's recv_grad raises gloo's own timeout; the only error record is this consequence.
    "pg_timeout_hang": ({"pg_timeout": 5, "fault": {"kind": "hang", "stage": 1, "step": 1, "instruction": "backward"}},
                        "collective-timeout"),
}


def rank_program(case: str, out: str) -> None:
    """One rank of a mistake: build the pipeline the mistake describes, train two steps."""
    import deepspeed
    import torch
    import torch.nn as nn
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    from utils.workloads.models import Block, Embedding, LMHead, lm_loss

    class Scalar(nn.Module):  # a loss computed in the middle of the model
        def forward(self, x):
            return x.float().pow(2).mean()

    class Linear(nn.Module):
        def __init__(self, out="tensor"):
            super().__init__()
            self.lin, self.out = nn.Linear(H, H), out

        def forward(self, x):
            y = self.lin(x)
            return {"dict": lambda: {"hidden": y}, "tuple_int": lambda: (y, 3),
                    "mask": lambda: (y, torch.ones(x.shape[:2])), "detached": lambda: y.detach(),
                    "slice": lambda: y.transpose(1, 2), "tensor": lambda: y}[self.out]()

    class TakeFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(H)

        def forward(self, inputs):
            return self.ln(inputs[0])

    class Untranspose(nn.Module):
        def forward(self, x):
            return x.transpose(1, 2)

    def tied_head(embedding, x):
        return x @ embedding.tokens.weight.t()

    emb = LayerSpec(Embedding, vocab=V, hidden=H, seq_len=L)
    head = LayerSpec(LMHead, hidden=H, vocab=V)

    def block():
        return LayerSpec(Block, hidden=H, heads=4)

    kw = {"num_stages": 2, "loss_fn": lm_loss, "partition_method": "uniform"}
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 10**9}
    layers = [emb, block(), block(), head]
    if case == "batch":
        config["train_batch_size"] = 12
    elif case == "stages_gt_layers":
        layers, kw["loss_fn"] = [block()], None
    elif case == "no_loss_fn":
        kw["loss_fn"] = None
    elif case == "loss_mid":
        layers, kw["partition_method"] = [emb, LayerSpec(Scalar), head], "type:Scalar|LMHead"
    elif case in ("dict_out", "tuple_int", "detached"):
        layers = [emb, LayerSpec(Linear, out={"dict_out": "dict"}.get(case, case)), block(), head]
    elif case == "unused_float":
        layers = [emb, LayerSpec(Linear, out="mask"), LayerSpec(TakeFirst), head]
    elif case == "non_contiguous":
        layers = [emb, LayerSpec(Linear, out="slice"), LayerSpec(Untranspose), head]
    elif case == "tied_attr":
        layers = [TiedLayerSpec("embed", Embedding, vocab=V, hidden=H, seq_len=L), block(), block(),
                  TiedLayerSpec("embed", Embedding, vocab=V, hidden=H, seq_len=L, forward_fn=tied_head)]
    elif case == "tied_no_fn":
        tied = {"vocab": V, "hidden": H, "seq_len": L, "tied_weight_attr": "tokens.weight"}
        layers = [TiedLayerSpec("embed", Embedding, **tied), block(), block(), TiedLayerSpec("embed", Embedding, **tied)]
    elif case == "zero2":
        config["zero_optimization"] = {"stage": 2}

    def data():
        generator = torch.Generator().manual_seed(0)
        while True:
            ids = torch.randint(0, V, (B, L), generator=generator)
            yield ids, ids

    rank = int(os.environ["RANK"])
    try:
        deepspeed.init_distributed(dist_backend="gloo")
        module = PipelineModule(layers=layers, **kw)
        engine, *_ = deepspeed.initialize(model=module, model_parameters=list(module.parameters()), config=config)
        batches = data()
        for _ in range(2):
            engine.train_batch(data_iter=batches)
    except BaseException as exc:  # noqa: BLE001 - recorded, then the rank fails
        record = {"rank": rank, "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
        Path(out, f"rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")
        os._exit(1)
    os._exit(0)


def _tail(text: str, lines: int = 14) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def record_mistake(case: str) -> dict:
    from utils.jobs.launchers import SINGLE_NODE_ARGS

    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT), "TORCH_EXTENSIONS_DIR": os.environ.get(
                   "TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", *SINGLE_NODE_ARGS, "--nproc-per-node=2",
                        __file__, "--rank-program", case, out], env=env, timeout=300, capture_output=True)
        errors = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    return {"errors": [{**e, "traceback": _tail(e["traceback"])} for e in errors]}


def record_fault(case: str) -> dict:
    from tests.helpers import SMALL_GPT
    from utils import Fault

    fields, _ = FAULTS[case]
    options = dict(SMALL_GPT["model_options"], **({"vocab": 4096, "seq_len": 32} if fields["kind"] == "memory" else {}))
    return record_job_failure({"model_options": options, "fault": Fault(**fields)})


def record_job_failure(fields: dict) -> dict:
    """Run a small-GPT job of 2 stages, 4 micro-batches and 2 steps with `fields` over them; its error records."""
    from tests.helpers import SMALL_GPT
    from utils import Fault, JobFailed, JobSpec, run_job

    if isinstance(fields.get("fault"), dict):
        fields = {**fields, "fault": Fault(**fields["fault"])}
    with tempfile.TemporaryDirectory() as runs:
        try:
            run_job(JobSpec(**{**SMALL_GPT, "num_stages": 2, "micro_batches": 4, "steps": 2, "timeout": 120, **fields}),
                    directory=runs, progress=False)
            return {"errors": []}
        except JobFailed as failed:
            run = failed.run
            errors = [e for r in run.ranks if (e := run.run_dir.error(r))]
            logs = {r: _tail(run.log(r), 8) for r in run.ranks if not run.run_dir.error(r)}
    return {"errors": [{**e, "traceback": _tail(e["traceback"])} for e in errors], "logs": logs}


def main(cases: list[str]) -> None:
    recorded = json.loads(OUT.read_text()) if OUT.exists() else {}
    for case in cases or [*MISTAKES, *FAULTS, *JOBS]:
        if case in MISTAKES:
            result, expected = record_mistake(case), MISTAKES[case]
        elif case in FAULTS:
            result, expected = record_fault(case), FAULTS[case][1]
        else:
            result, expected = record_job_failure(JOBS[case][0]), JOBS[case][1]
        recorded[case] = {"expected": expected, **result}
        print(f"{case}: {len(result['errors'])} error record(s), {len(result.get('logs', {}))} log(s)", flush=True)
    OUT.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["--rank-program"]:
        rank_program(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1:])
