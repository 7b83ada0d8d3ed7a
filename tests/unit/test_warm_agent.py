"""The warm start of CPU jobs (`utils.runtime.warm_agent`), without starting a job: which
command the launcher runs (and when it falls back to torchrun's: `WORKBOOK_WARM_START=0`, a
private API gone), how a job's processes are found, and what the fork server may import
before it knows a rank. Jobs started this way are the integration tests'."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import multiprocessing.forkserver

import pytest

from utils.jobs.launch import start_job
from utils.jobs.launchers import TORCHRUN_MODULE, WARM_AGENT_MODULE, LocalTorchrun
from utils.jobs.plan import plan_job
from utils.jobs.rundir import RunDir
from utils.jobs.spec import JobSpec
from utils.runtime import warm_agent
from utils.system import private_apis
from utils.system.private_apis import WARM_START_ENV
from utils.system.procs import job_processes

TINY = {"model": "gpt", "micro_batch_size": 2, "num_stages": 2, "micro_batches": 2, "steps": 1,
        "model_options": {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}}


@pytest.fixture(scope="module")
def cpu_plan():
    return plan_job(JobSpec(**TINY, device="cpu"))


@pytest.fixture(autouse=True)
def default_switch(monkeypatch):
    """Each test starts from the default (the switch unset), whatever the shell exported."""
    monkeypatch.delenv(WARM_START_ENV, raising=False)


def test_a_cpu_job_runs_torchruns_arguments_through_the_warm_agent(cpu_plan, tmp_path):
    launcher, run_dir = LocalTorchrun(), RunDir(tmp_path / "run")
    argv = launcher.argv(cpu_plan, run_dir)
    started = launcher.agent_argv(cpu_plan, argv)
    assert argv[1:3] == ["-m", TORCHRUN_MODULE]
    assert started == [argv[0], "-m", WARM_AGENT_MODULE, *argv[3:]]  # the same arguments, another agent
    assert f"-m {TORCHRUN_MODULE} " in launcher.command(cpu_plan, run_dir)  # command.txt stays torchrun's


def test_torchruns_own_command_runs_on_a_gpu_and_when_asked(cpu_plan, tmp_path):
    run_dir = RunDir(tmp_path / "run")
    argv = LocalTorchrun().argv(cpu_plan, run_dir)
    gpu_plan = replace(cpu_plan, device="cuda")
    assert LocalTorchrun().agent_argv(gpu_plan, argv) == argv
    assert LocalTorchrun(warm=False).agent_argv(cpu_plan, argv) == argv


def test_the_switch_is_read_at_launch_and_0_runs_torchruns_own_command(cpu_plan, tmp_path, monkeypatch):
    launcher, run_dir = LocalTorchrun(), RunDir(tmp_path / "run")
    argv = launcher.argv(cpu_plan, run_dir)
    monkeypatch.setenv(WARM_START_ENV, "0")  # after the launcher exists: read when a job starts
    assert launcher.agent_argv(cpu_plan, argv) == argv
    assert launcher.warm_start(cpu_plan, argv) == (False, None)  # asked for: no note
    monkeypatch.setenv(WARM_START_ENV, "1")
    assert launcher.agent_argv(cpu_plan, argv)[1:3] == ["-m", WARM_AGENT_MODULE]


@pytest.mark.parametrize("value", ["", "yes", "false", " 0"])
def test_another_value_of_the_switch_stops_the_job_before_it_exists(value, tmp_path, monkeypatch):
    monkeypatch.setenv(WARM_START_ENV, value)
    with pytest.raises(ValueError, match=rf"{WARM_START_ENV}=.* use 1 .* or 0 "):
        start_job(JobSpec(**TINY, device="cpu"), directory=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run, no process


def test_a_missing_private_api_runs_torchruns_command_with_a_note(cpu_plan, tmp_path, monkeypatch):
    """What the launcher does when torch or Python changed under the warm agent: torchrun's own
    command, and a note (the job's notes, which the progress line prints, and its launcher log)."""
    monkeypatch.delattr(multiprocessing.forkserver, "ensure_running")  # as a Python that renamed it
    launcher, run_dir = LocalTorchrun(), RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    argv = launcher.argv(cpu_plan, run_dir)
    assert launcher.agent_argv(cpu_plan, argv) == argv
    notes = launcher.notes(cpu_plan, run_dir)
    assert len(notes) == 1 and "torchrun's own command" in notes[0]
    assert "multiprocessing.forkserver.ensure_running (checked against Python 3.11) is gone" in notes[0]
    assert notes[0] in run_dir.launcher_log().read_text()
    monkeypatch.setenv(WARM_START_ENV, "0")  # the learner chose torchrun's command: nothing to say
    assert launcher.notes(cpu_plan, run_dir) == [] and launcher.agent_argv(cpu_plan, argv) == argv
    gpu_plan = replace(cpu_plan, device="cuda")
    monkeypatch.delenv(WARM_START_ENV)
    assert LocalTorchrun().warm_start(gpu_plan, argv) == (False, None)  # never warm on a GPU: no note


def test_only_a_required_api_turns_the_warm_start_off(cpu_plan, tmp_path, monkeypatch):
    # torch._dynamo is only preloaded (a fork server skips what it cannot import): optional.
    optional = private_apis.PrivateApi("torch", "_no_such_preload", "torch 2.13.0", "slower ranks",
                                       (WARM_AGENT_MODULE,), required=False)
    monkeypatch.setattr(private_apis, "PRIVATE_APIS", (*private_apis.PRIVATE_APIS, optional))
    argv = LocalTorchrun().argv(cpu_plan, RunDir(tmp_path / "run"))
    assert LocalTorchrun().warm_start(cpu_plan, argv) == (True, None)
    assert [api for api, _ in private_apis.unavailable(WARM_AGENT_MODULE)] == [optional]


def test_the_agent_falls_back_to_torchruns_command_when_it_cannot_set_up(monkeypatch, capsys):
    """A change the launcher's check cannot see (a signature) fails while the agent sets up,
    before any rank exists: the agent then becomes torchrun's command, same pid, same log."""
    class Exec(Exception):
        pass

    execs = []

    def execv(path, args):
        execs.append((path, args))
        raise Exec

    def set_up():
        raise TypeError("config_from_args() takes 2 positional arguments but 1 was given")

    monkeypatch.setattr(warm_agent, "set_up", set_up)
    monkeypatch.setattr(warm_agent, "end", lambda: None)  # no fork server here to end
    monkeypatch.setattr(warm_agent.os, "execv", execv)
    argv = ["--standalone", "--nproc-per-node=2", "-m", warm_agent.RANK_PROGRAM, "/x"]
    with pytest.raises(Exec):
        warm_agent.main(argv)
    assert execs == [(sys.executable, [sys.executable, "-m", TORCHRUN_MODULE, *argv])]
    assert warm_agent.TORCHRUN_MODULE == TORCHRUN_MODULE
    out = capsys.readouterr().out.splitlines()
    assert out[0] == warm_agent.BANNER
    assert out[1].startswith(warm_agent.FALLBACK_NOTE) and "TypeError: config_from_args()" in out[1]


def test_the_warm_agent_takes_torchruns_arguments_and_refuses_another_program():
    from torch.distributed.run import parse_args

    args = parse_args(["--standalone", "--nproc-per-node=2", "-m", warm_agent.RANK_PROGRAM, "/x"])
    assert args.module and args.training_script == warm_agent.RANK_PROGRAM
    assert warm_agent.RANK_PROGRAM == "utils.runtime.rank" and warm_agent.RANK_PROGRAM in warm_agent.PRELOAD
    with pytest.raises(SystemExit, match="runs `-m utils.runtime.rank RUN_DIR` only"):
        warm_agent.launch(["--standalone", "--nproc-per-node=1", "-m", "http.server", "/x"])


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)


def test_a_jobs_processes_are_found_by_command_line_or_by_tmpdir(tmp_path):
    run = tmp_path / "20261202-000000-gpt-abc123"
    (run / "tmp").mkdir(parents=True)
    base = {"PATH": os.environ["PATH"]}
    forked = _sleeper({**base, "TMPDIR": str(run / "tmp")})      # a fork server's or a forked rank's
    server = _sleeper({**base, "WORKBOOK_RUNS": str(tmp_path)})  # a notebook server: not the job's
    by_name = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(30)", str(run)], env=base)
    try:
        deadline = time.time() + 10
        while {p.pid for p in job_processes(run)} != {forked.pid, by_name.pid} and time.time() < deadline:
            time.sleep(0.05)
        assert {p.pid for p in job_processes(run)} == {forked.pid, by_name.pid}
        assert {p.pid for p in job_processes(tmp_path)} == {forked.pid, by_name.pid}  # a runs folder
        assert [p.pid for p in job_processes(run / "tmp")] == [forked.pid]       # one launch's TMPDIR
    finally:
        for proc in (forked, server, by_name):
            proc.kill()
            proc.wait()
    assert job_processes(run) == []


def _run_at_import(node: ast.AST):
    """The nodes of `node` that run when its module is imported: everything but function
    bodies (a function's decorators and default values do run; a class body runs) and
    ``if __name__ == "__main__":`` blocks."""
    if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"'):
        return
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        children = [*getattr(node, "decorator_list", []), *node.args.defaults,
                    *(d for d in node.args.kw_defaults if d is not None)]
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _run_at_import(child)


def _module_level_environment_reads(path: Path) -> set[str]:
    """Names a module reads from the environment (``os.getenv``, ``os.environ.get``,
    ``os.environ[...]``) in code that runs when it is imported."""
    names, text = set(), path.read_text(encoding="utf-8")
    if "environ" not in text and "getenv" not in text:  # most of torch: no need to parse it
        return names
    for sub in _run_at_import(ast.parse(text)):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("getenv", "get") and sub.args
                and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str)
                and ast.unparse(sub.func.value) in ("os", "os.environ")):
            names.add(sub.args[0].value)
        elif (isinstance(sub, ast.Subscript) and ast.unparse(sub.value) == "os.environ"
              and isinstance(sub.slice, ast.Constant)):
            names.add(sub.slice.value)
    return names


def test_nothing_the_fork_server_imports_reads_a_ranks_variables_at_import():
    """The fork server imports `PRELOAD` (torch, DeepSpeed, the rank program) with the launch
    environment, before any rank exists; elastic sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*
    in each forked rank just before calling it. A module among those imports that read one of
    them at import would give every rank the fork server's value. DeepSpeed reads
    DEEPSPEED_TIMEOUT at import: the same for every rank of a job, set in the launch
    environment. (DeepSpeed's compile profiler reads LOCAL_RANK at import, but no rank
    imports it: the scan covers what the fork server really imports.)"""
    listing = subprocess.run(
        [sys.executable, "-c", "import sys\n"
         f"for m in {list(warm_agent.PRELOAD)!r}: __import__(m)\n"
         "print('\\n'.join(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))"],
        capture_output=True, text=True, check=True, cwd=Path(warm_agent.__file__).parents[2],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"})
    imported = [Path(f) for f in listing.stdout.split("\n") if f.endswith(".py") and Path(f).is_absolute()]
    assert any(p.name == "constants.py" and p.parent.name == "deepspeed" for p in imported)
    per_rank = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CROSS_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
    read = {name: str(p) for p in imported for name in _module_level_environment_reads(p)}
    assert "DEEPSPEED_TIMEOUT" in read  # the scan sees module-level reads (deepspeed/constants.py)
    assert not per_rank & read.keys(), {n: read[n] for n in per_rank & read.keys()}


def test_the_scan_tells_import_time_reads_from_later_ones(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n"
                      "RANK = int(os.environ.get('RANK', '0'))\n"          # at import: found
                      "class C:\n    port = os.environ['MASTER_PORT']\n"   # a class body runs: found
                      "def f(world=os.getenv('WORLD_SIZE')):\n"             # a default value: found
                      "    return os.environ['LOCAL_RANK']\n"               # a function body: not
                      "if __name__ == '__main__':\n    os.getenv('GROUP_RANK')\n")  # not on import
    assert _module_level_environment_reads(module) == {"RANK", "MASTER_PORT", "WORLD_SIZE"}
