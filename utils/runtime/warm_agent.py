"""torchrun's agent, with the ranks forked from a warm interpreter: how jobs start on a CPU.

``python -m utils.runtime.warm_agent ARGS`` takes torchrun's arguments and runs what
``python -m torch.distributed.run ARGS`` runs: torch's own argument parser, launch config and
`elastic_launch`, so the rendezvous, the monitoring of the ranks, stopping the others when
one fails and the failure summary (the ``ChildFailedError`` text ``@record`` prints) are
torchrun's. One thing differs: how a rank process starts. torchrun execs a fresh
interpreter per rank, which then imports torch, DeepSpeed and ``torch._dynamo`` (imported
by every torch optimizer): about 3.3 CPU-seconds per rank on the 2-core CI machine, most of
a short job. Here the ranks are ``multiprocessing`` children of a fork server (elastic's
function entry point with ``start_method="forkserver"``, as ``elastic_launch`` documents)
that imported those modules once, while this agent was still importing torch itself.

Why a fork server and not a plain ``fork`` of this agent: a child forked after the
rendezvous inherits the agent's ``TCPStore``, whose destructor joins a libuv thread that does
not exist in the child, and every rank hung at exit. The fork server is started before any
store exists and before this process has a thread.

Only for CPU jobs (``utils.jobs.launchers.LocalTorchrun.agent_argv``): on a GPU node nothing
may initialise CUDA in a process that forks ranks, so there torchrun's own command runs.
``command.txt`` is always torchrun's command: it starts the same job, only slower.

The warm path relies on private APIs of multiprocessing and torch's elastic launcher, listed
in `utils.system.private_apis`. The launcher checks the standard-library ones before each
CPU job (torch's would import torch in the notebook) and runs torchrun's command when one is
gone (``WORKBOOK_WARM_START=0`` does so on request). torch's are met here: should setting up
fail, before any rank exists (a torch name gone, a changed signature), `fall_back` replaces
this process with torchrun's command, after a note in the launcher log.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import traceback
import uuid
from multiprocessing import forkserver, resource_tracker, util
from typing import NoReturn

RANK_PROGRAM = "utils.runtime.rank"
"""The only program this agent runs (``utils.jobs.launchers.RANK_PROGRAM``)."""
PRELOAD = ("torch", "torch._dynamo", "deepspeed", "deepspeed.pipe", RANK_PROGRAM)
"""What the fork server imports before it forks a rank. `utils.runtime.rank` reads its rank
when it runs, not when it is imported, so one import serves every rank."""
SOCKET_PARENT = "/tmp"
"""Where multiprocessing's folder for the fork server's socket is made when ``TMPDIR`` is too deep."""
SOCKET_PATH_MAX = 107
"""The longest path a Unix socket address holds (``sun_path`` is 108 bytes with its NUL)."""
SOCKET_UNDER_TEMP = len("/pymp-12345678/listener-12345678")
"""What multiprocessing adds to the temporary folder: its own folder, then the socket."""
BANNER = ("[workbook] torchrun's elastic agent (torch.distributed.run's launch) with ranks "
          "forked from a preloaded fork server; command.txt is the same job as a plain torchrun command")
TORCHRUN_MODULE = "torch.distributed.run"
"""What `fall_back` runs instead (``utils.jobs.launchers.TORCHRUN_MODULE``)."""
FALLBACK_NOTE = ("[workbook] the warm agent could not be set up (the private multiprocessing/torch APIs it "
                 "relies on have changed: update utils/runtime/warm_agent.py and utils/system/private_apis.py); "
                 "running torchrun's own command instead, the same job started slower")


def start_fork_server() -> None:
    """Start the fork server now, so that it imports `PRELOAD` while this process imports
    torch and meets the rendezvous (two cores, two imports at once).

    multiprocessing puts the fork server's Unix socket in a temporary folder of its own, made
    under ``TMPDIR``, which the launcher puts inside the run directory (so it goes with the
    job). Under a deep run directory that path is longer than a Unix socket address may be
    ("AF_UNIX path too long"): then that one folder is made in `SOCKET_PARENT` instead.
    multiprocessing keeps using the folder it made; `main` removes it at the end."""
    forkserver.set_forkserver_preload(list(PRELOAD))
    job_tmp = tempfile.tempdir
    if len(tempfile.gettempdir()) + SOCKET_UNDER_TEMP > SOCKET_PATH_MAX:
        tempfile.tempdir = SOCKET_PARENT
    try:
        forkserver.ensure_running()
    finally:
        tempfile.tempdir = job_tmp  # everything else (torchelastic's folders) stays in the run directory


def report_every_failure() -> None:
    """Make elastic report every rank that has failed when it notices a failure, as torchrun's
    command does, not only the first that ``join`` meets.

    ``start_processes`` runs function entry points in a ``MultiprocessContext``, whose ``_poll``
    turns the first ``ProcessExitedException`` into the whole report: when rank 1 is killed
    and rank 0 then exits on its lost connection, the summary could name rank 0 alone and
    never rank 1's signal. torchrun's ``SubprocessContext`` lists every worker that has exited
    non-zero by then, with its exit code, which is what the workbook's failure report reads
    (``utils.jobs.launchers.torchrun_report``). The subclass below adds the ranks that had
    already failed before that poll stopped the rest; those it stops are not failures, in
    either context."""
    import torch.distributed.elastic.multiprocessing as elastic_mp
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    class EveryFailureContext(MultiprocessContext):
        def _poll(self):
            before = {i: p.exitcode for i, p in enumerate(self._pc.processes)} if self._pc else {}
            result = super()._poll()
            if result is not None and result.failures:
                for i, code in before.items():
                    if code not in (None, 0) and i not in result.failures:
                        result.failures[i] = ProcessFailure(local_rank=i, pid=self._pc.processes[i].pid,
                                                            exitcode=code, error_file=self.error_files[i])
            return result

    if elastic_mp.MultiprocessContext is not MultiprocessContext:  # torch changed: say so, don't guess
        raise RuntimeError("torch.distributed.elastic.multiprocessing no longer names MultiprocessContext "
                           "where start_processes finds it: update utils/runtime/warm_agent.py")
    elastic_mp.MultiprocessContext = EveryFailureContext


def launch(argv: list[str]) -> None:
    """torchrun's ``run`` with the ranks as forked functions (see the module docstring)."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from utils.runtime.rank import forked_main

    args = parse_args(argv)
    if not args.module or args.training_script != RANK_PROGRAM:
        raise SystemExit(f"warm_agent runs `-m {RANK_PROGRAM} RUN_DIR` only; got {args.training_script!r}: "
                         "use torchrun for anything else")
    if args.standalone:  # what torchrun's `run` does for --standalone
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(args)
    config.start_method = "forkserver"
    elastic_launch(config=config, entrypoint=forked_main)(*args.training_script_args)


def set_up() -> None:
    """What the warm path needs before a rank exists: the fork server, the every-failure
    context, and the torch names `launch` uses. Raises when those private APIs changed."""
    start_fork_server()
    report_every_failure()
    from torch.distributed.launcher.api import elastic_launch  # noqa: F401 - missing now, not midway
    from torch.distributed.run import config_from_args, parse_args  # noqa: F401


def fall_back(argv: list[str], error: BaseException) -> NoReturn:
    """Replace this process with torchrun's own command for `argv` (same pid, same log), after
    a note saying why and ending the fork server if it started. Does not return."""
    print(f"{FALLBACK_NOTE}: {type(error).__name__}: {error}", flush=True)
    end()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", TORCHRUN_MODULE, *argv])


def main(argv: list[str]) -> None:
    print(BANNER, flush=True)
    try:
        set_up()
        from torch.distributed.elastic.multiprocessing.errors import record
    except Exception as exc:  # noqa: BLE001 - whatever changed, torchrun's command still runs the job
        fall_back(argv, exc)

    code = 0
    try:
        record(launch)(argv)  # as torchrun's main: records a failed rank, then re-raises
    except SystemExit as exc:  # --help, or bad arguments (argparse printed why)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would (torchrun's summary)
        traceback.print_exc()
        code = 1
    end()
    sys.stdout.flush()
    sys.stderr.flush()
    # By now the ranks are gone (elastic stopped them) and the rendezvous is shut down; what
    # is left is tearing down torch's object graph, 0.7 s of a 2-rank job's 4.4 s (measured).
    os._exit(code)


def end() -> None:
    """What this agent's interpreter would do at exit that matters, before ``os._exit``.

    The fork server is killed and reaped here: left to exit on its own when it sees this
    process gone, it spends a second tearing torch down as an orphan (the launcher then waited
    for it, 1-2 s a job, measured). Then multiprocessing's own exit handler (what ``atexit``
    runs) unlinks the named semaphores elastic made for the ranks' return values
    (``/dev/shm/sem.mp-*``, which accumulated otherwise) and removes the socket's folder.
    Last, multiprocessing's resource tracker is stopped and reaped: it ignores SIGTERM, so
    as an orphan it made the launcher wait for it."""
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    exit_function = getattr(util, "_exit_function", None)  # each may be gone (private APIs)
    if exit_function is not None:
        exit_function()
    stop_tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_stop", None)
    if stop_tracker is not None:
        stop_tracker()


if __name__ == "__main__":
    main(sys.argv[1:])
