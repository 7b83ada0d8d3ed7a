"""The GPU path made ready for its first run on a one-GPU node (issue 24), with the device
count faked: what a reading of the GPU branch found would go wrong there. (Point 1, "auto"
on one GPU, and point 2, `JobSpec.for_this_machine`, are tested in test_plan and test_spec.)"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from utils.jobs.launchers import LocalTorchrun
from utils.jobs.plan import plan_job
from utils.jobs.spec import JobSpec
from utils.system.paths import PROJECT_ROOT


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, PROJECT_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_gpu(monkeypatch, tmp_path):
    """torch sees one GPU; anything that would initialise CUDA (and open a context) fails;
    ``nvidia-smi`` answers as on the lent H200 machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def touching(name):
        def touched(*args, **kwargs):  # one function per name: torch._dynamo refuses a shared one
            raise AssertionError(f"torch.cuda.{name} initialised CUDA outside a measurement")
        return touched

    for name in ("_lazy_init", "init", "current_device", "get_device_name", "get_device_properties", "set_device"):
        monkeypatch.setattr(torch.cuda, name, touching(name))
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\necho "NVIDIA H200"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("WORKBOOK_CACHE", str(tmp_path / "cache"))
    return smi.parent / "args"


# --- 3. the tracer benchmark checks the device before it starts ranks ---------------------------
def test_the_tracer_benchmark_refuses_two_stages_on_one_gpu_before_starting(one_gpu, monkeypatch):
    """Before: ``make bench`` on one GPU started two ranks on CUDA and rank 1 died with
    "invalid device ordinal"."""
    bench = _benchmark("tracer_overhead")
    started = []

    def start(argv, **kwargs):
        started.append(argv)
        raise KeyboardInterrupt  # stop right after the launch, which is all this test looks at

    monkeypatch.setattr(bench.subprocess, "run", start)
    monkeypatch.setattr(sys, "argv", ["tracer_overhead.py", "--device", "cuda", "--stages", "2"])
    with pytest.raises(ValueError, match="needs 2 GPUs .* but 1 are visible"):
        bench.main()
    assert not started
    monkeypatch.setattr(sys, "argv", ["tracer_overhead.py", "--device", "auto", "--stages", "2"])
    with pytest.raises(KeyboardInterrupt):
        bench.main()
    assert "--device=cpu" in started[0] and "--local-addr=127.0.0.1" in started[0]


# --- 4. a rank takes its device from the plan ---------------------------------------------------
def test_a_rank_takes_deepspeeds_accelerator_from_the_plan_not_the_environment():
    """Before: a rank pairing a stale DS_ACCELERATOR with the plan's device crashed in
    DeepSpeed. Here the environment says cuda (on a machine without one) and the plan cpu."""
    probe = ("from utils.runtime.rank import use_device\n"
             "use_device('cpu')\n"
             "from deepspeed.accelerator import get_accelerator\n"
             "print('ACCELERATOR', get_accelerator()._name)\n"
             "try:\n    use_device('cuda')\nexcept RuntimeError as e:\n    print('REFUSED', e)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT,
                          env={**os.environ, "DS_ACCELERATOR": "cuda", "CUDA_VISIBLE_DEVICES": "",
                               "PYTHONPATH": str(PROJECT_ROOT)})
    assert "ACCELERATOR cpu" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "REFUSED DeepSpeed already uses its 'cpu' accelerator" in done.stdout


# --- 5. a hang costs minutes ----------------------------------------------------------------------
def test_the_gpu_check_bounds_every_job_and_the_whole_run(one_gpu):
    check = _benchmark("gpu_check")
    spec = check.job_spec("cuda", num_stages=1)
    # timing-claim: construction — a configured timeout constant, nothing measured
    assert spec.timeout <= 300 and spec.timeout == check.JOB_TIMEOUT_S
    environment = LocalTorchrun().environment(plan_job(JobSpec(num_stages=1, device="cuda", partition="uniform",
                                                               timeout=spec.timeout)))
    assert int(environment["DEEPSPEED_TIMEOUT"]) <= 5  # minutes; was 17 with the old 900 s
    node = (PROJECT_ROOT / "benchmarks" / "gpu_node.sh").read_text()
    assert 'timeout -k 15 "${GPU_CHECK_LIMIT:-480}"' in node  # inside the device's 600 s per command


# --- 6. single-node jobs meet on loopback ---------------------------------------------------------
def test_single_node_jobs_give_their_workers_a_loopback_master_address(tmp_path):
    from torch.distributed.run import get_args_parser

    from utils.jobs.rundir import RunDir

    plan = plan_job(JobSpec(num_stages=2, device="cpu", partition="uniform"))
    argv = LocalTorchrun().argv(plan, RunDir(tmp_path))
    args = get_args_parser().parse_args(argv[argv.index("torch.distributed.run") + 1:])
    # torch's RendezvousStoreInfo.build: MASTER_ADDR = local_addr or socket.getfqdn()
    assert args.standalone and args.local_addr == "127.0.0.1"


# --- 7. the launcher and the notebook leave the GPU alone -----------------------------------------
def test_planning_a_cuda_job_never_initialises_cuda(one_gpu):
    """Before: every launch read the device name for the profile cache's key through torch,
    which opened a CUDA context in the launching process."""
    from utils.profiling.profile import profile_layers

    plan = plan_job(JobSpec(num_stages=1, device="cuda", partition="uniform", model="gpt-large"))
    assert plan.device == "cuda" and plan.profile is None  # looked up (nothing cached), not measured
    assert profile_layers("gpt-large", device="cuda", measure=False) is None
    assert one_gpu.read_text().split() == ["--query-gpu=name", "--format=csv,noheader"]


def test_the_gpu_name_is_read_for_the_first_visible_gpu(one_gpu, monkeypatch):
    from utils.profiling.profile import _device_name

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _device_name("cuda") == "NVIDIA H200"
    assert one_gpu.read_text().split()[0] == "--id=3"


def test_measuring_on_cuda_hands_the_memory_back(monkeypatch):
    """The layers, activations and gradients of a GPU profile (GBs for gpt-large) must not
    stay reserved in the notebook's process on cuda:0, where rank 0 of the next job trains."""
    import utils.profiling.measure as measure

    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(measure, "_measure_rounds", lambda model, key, **kw: "profile")
    assert measure.measure_layers(None, {"device": "cuda"}) == "profile" and emptied == [True]

    def fails(model, key, **kw):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(measure, "_measure_rounds", fails)
    with pytest.raises(RuntimeError):
        measure.measure_layers(None, {"device": "cuda"})
    assert emptied == [True, True]  # also when the measurement failed
    monkeypatch.setattr(measure, "_measure_rounds", lambda model, key, **kw: "profile")
    measure.measure_layers(None, {"device": "cpu"})
    assert emptied == [True, True]  # a CPU profile leaves CUDA alone


# --- 8 and 9. what a GPU run says about itself ----------------------------------------------------
def test_a_cuda_job_says_why_its_end_stages_show_more_bubble_and_why_ranks_need_own_gpus(one_gpu):
    plan = plan_job(JobSpec(num_stages=1, device="cuda", partition="uniform", model="gpt-large"))
    assert any("from pageable host memory" in n and "_exec_load_micro_batch" in n for n in plan.notes)
    with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU"):
        plan_job(JobSpec(num_stages=2, device="cuda", partition="uniform"))
    assert not any("pageable" in n for n in plan_job(JobSpec(num_stages=2, device="cpu", partition="uniform")).notes)
