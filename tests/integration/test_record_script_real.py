"""A public DeepSpeed pipeline script the workbook did not write — DeepSpeed's own
pipeline-parallelism example (tests/data/deepspeedexamples_pipeline, verbatim) — run by
DeepSpeed's own launcher on CPU/gloo with `utils.record(engine)` added, and its record checked
against what the script really did: its stages, micro-batches, steps and the losses it printed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import utils
from utils import Run, list_runs
from utils.jobs.launchers import ranks_path
from utils.jobs.multinode import free_port
from utils.runtime.recorder import LAYER_COST_EVERY
from utils.system import shm
from utils.system.extensions import extensions_dir
from utils.system.paths import PROJECT_ROOT

pytestmark = pytest.mark.integration

SOURCE = PROJECT_ROOT / "tests" / "data" / "deepspeedexamples_pipeline"
EDITS = [  # (original text, replacement): each must occur exactly once (SOURCE.md says why each is needed)
    ("import torchvision\nfrom torchvision import transforms\nfrom torchvision.models import AlexNet\n"
     "from torchvision.models import vgg19\n",
     "from alexnet import AlexNet  # workbook: the example's own AlexNet; torchvision is not installed here\n"),
    ("import deepspeed\n", "import deepspeed\nimport utils  # workbook: documented line 1\n"),
    ("    transform = transforms.Compose([\n        transforms.Resize(256),\n        transforms.CenterCrop(224),\n"
     "        transforms.ToTensor(),\n"
     "        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),\n    ])\n", ""),
    ("    trainset = torchvision.datasets.CIFAR10(root=dl_path,\n                                            train=True,\n"
     "                                            download=True,\n"
     "                                            transform=transform)\n",
     "    trainset = torch.utils.data.TensorDataset(  # workbook: synthetic CIFAR-10 shapes, no download\n"
     "        torch.randn(64, 3, 224, 224, generator=torch.Generator().manual_seed(0)),\n"
     "        torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(1)))\n"),
    ("        training_data=trainset)\n\n    for step in range(args.steps):\n",
     "        training_data=trainset)\n    utils.record(engine)  # workbook: documented line 2\n\n"
     "    for step in range(args.steps):\n"),
    ("    torch.cuda.set_device(args.local_rank)\n",
     "    if torch.cuda.is_available():  # workbook: a CUDA-only call, guarded\n"
     "        torch.cuda.set_device(args.local_rank)\n"),
]
CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "torch_adam": True}},
          "steps_per_print": 1, "wall_clock_breakdown": False}


def _script(folder) -> None:
    text = (SOURCE / "train.py").read_text(encoding="utf-8")
    for old, new in EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (folder / "train.py").write_text(text, encoding="utf-8")
    shutil.copy(SOURCE / "alexnet.py", folder / "alexnet.py")
    (folder / "ds_config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    (folder / "hostfile").write_text("localhost slots=2\n", encoding="utf-8")


def _launch(folder, runs_root, *, steps: int = 3):
    """DeepSpeed's own launcher runs the script in `folder` on 2 CPU ranks; returns the finished
    process and the run directories it recorded under `runs_root`."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
           "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "TORCH_EXTENSIONS_DIR": str(extensions_dir()), "PATH": ranks_path(os.environ["PATH"]),
           "WORKBOOK_RUNS": str(runs_root)}
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", f"--hostfile={folder / 'hostfile'}",
            "--master_addr=127.0.0.1", f"--master_port={port}", "--no_ssh_check",
            "train.py", "--deepspeed_config=ds_config.json", "-p", "2", f"--steps={steps}", "--backend", "gloo"]
    before = {run.path for run in list_runs(runs_root)}
    try:
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shm.remove_job_buffers("127.0.0.1", port)  # DeepSpeed's runner leaves its CPU comm buffers behind
    return done, [run.path for run in list_runs(runs_root) if run.path not in before]


def test_deepspeeds_own_example_records_what_it_did(tmp_path, runs_root):
    changed = sum(1 for line in _edited_lines(tmp_path))
    print(f"lines changed in the public script: {changed}")
    done, paths = _launch(tmp_path, runs_root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = [float(x) for x in re.findall(r"steps: \d+ loss: ([\d.]+) iter time", done.stdout + done.stderr)]
    [path] = paths
    run = Run.load(path)
    # What the script did: 2 stages, 8 / 2 = 4 micro-batches, 3 steps, DeepSpeed's own partition.
    assert run.ok and run.spec.model == "recorded" and run.spec.num_stages == 2 and run.spec.micro_batches == 4
    assert run.spec.steps == 3 and len(run.losses) == 3 and not run.partial
    assert printed == [round(loss, 4) for loss in run.losses]  # the losses the script printed
    names = run.spec.shape.layer_names
    assert names[0] == "Conv2d" and names[-1] == "Linear" and "<lambda>" in names and len(run.parts) == 3
    timeline = run.timeline
    for step in range(3):
        for stage in range(2):
            forwards = timeline.select(step=step, stage=stage, kinds=("forward",))
            assert sorted(e.micro_batch for e in forwards) == [0, 1, 2, 3]
    assert {e.kind for e in timeline.events} >= {"forward", "backward", "send_act", "recv_act", "optimizer_step"}
    costs = run.layer_costs
    lam = names.index("<lambda>")  # the script's `lambda x: torch.flatten(x, 1)`: a function, no module to time
    # every module, on the steps utils.record samples (1, 1 + LAYER_COST_EVERY, ...; 3 steps here: step 1)
    assert set(costs) == {s for s in range(3) if LAYER_COST_EVERY == 1 or s % LAYER_COST_EVERY == 1} == {1}
    assert set(costs[1]) == set(range(len(names))) - {lam}
    assert utils.diagnose(run).kind == "ok"
    figure = utils.plot_timeline(timeline)
    assert {t.name for t in figure.data if t.type == "bar"} >= {"forward", "backward"}
    assert set(run.peak_memory) == {0, 1}
    assert {r: (p["node"], p["local_rank"]) for r, p in run.placement.items()} == {0: (0, 0), 1: (0, 1)}
    suggestion = utils.suggest_partition(run)  # from the layer costs the script's own ranks measured
    print(suggestion)
    assert suggestion.current == tuple(run.parts) and set(suggestion.candidates) == {
        "current", "balanced", "uniform", "parameters"}
    slowest = {name: c[1] for name, c in suggestion.candidates.items()}
    # timing-claim: construction — the exact min-max partition of one cost list has the smallest bottleneck of
    # every partition of it, the run's own and DeepSpeed's methods included
    assert slowest["balanced"] <= min(slowest.values())
    # timing-claim: construction — the run's own partition is a candidate, so the best predicted step is no longer
    assert suggestion.predicted_speedup >= 1.0
    assert suggestion.code.startswith(("# keep", "PipelineModule(..., partition_method=", "from deepspeed.pipe"))
    assert suggestion.untimed == (lam,)


def _edited_lines(folder):
    """The script written into `folder`, and the lines the edits changed (removed and added)."""
    import difflib

    _script(folder)
    original = (SOURCE / "train.py").read_text(encoding="utf-8").splitlines()
    edited = (folder / "train.py").read_text(encoding="utf-8").splitlines()
    return [line for line in difflib.unified_diff(original, edited, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_a_script_that_raises_is_recorded_as_failed_and_diagnosed(tmp_path, runs_root):
    """The script's own loop raises on rank 1 in step 1 (the learner's bug); DeepSpeed's launcher
    ends the other rank; the record says failed, with rank 1's error and where it was."""
    _script(tmp_path)
    script = tmp_path / "train.py"
    loop = "    for step in range(args.steps):\n        loss = engine.train_batch()\n"
    text = script.read_text(encoding="utf-8")
    assert text.count(loop) == 1
    script.write_text(text.replace(loop, loop + "        if step == 1 and dist.get_rank() == 1:\n"
                                              "            raise ValueError('a bug in my loop')\n"), encoding="utf-8")
    done, [path] = _launch(tmp_path, runs_root)
    assert done.returncode != 0
    run = Run.load(path)
    assert run.state == "failed" and run.run_dir.error(1)["message"] == "a bug in my loop"
    assert len(run.progress(1)) == 2  # steps 0 and 1 were recorded before the loop raised
    d = utils.diagnose(run)
    assert d.kind == "failed" and d.primary.where.rank == 1, d
    print(d)


def test_a_script_on_two_nodes_records_into_one_directory(tmp_path, runs_root):
    """Two torchrun agents with a c10d rendezvous are two nodes (one rank each) on this machine,
    whose filesystem both see, as a shared one would be: rank 0 picks the run directory, both
    ranks record into it, and each rank's node is the one torchrun gave it."""
    _script(tmp_path)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
           "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path),
           "TORCH_EXTENSIONS_DIR": str(extensions_dir()), "PATH": ranks_path(os.environ["PATH"]),
           "WORKBOOK_RUNS": str(runs_root)}
    before = {run.path for run in list_runs(runs_root)}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "train.py", "--deepspeed_config=ds_config.json",
         "-p", "2", "--steps=2", "--backend", "gloo"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    try:
        outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    [path] = [run.path for run in list_runs(runs_root) if run.path not in before]
    run = Run.load(path)
    assert run.ok and run.spec.num_stages == 2 and run.nodes == {0: 0, 1: 1}
    printed = [float(x) for x in re.findall(r"steps: \d+ loss: ([\d.]+) iter time", "".join(outputs))]
    assert printed == [round(loss, 4) for loss in run.losses] and len(printed) == 2
    assert sorted({e.rank for e in run.timeline.events}) == [0, 1]
