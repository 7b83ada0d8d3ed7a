"""Resource limits for grading kernels, applied by a tiny launch wrapper, inside the
isolation of `isolation.py`.

The grader starts every kernel as::

    sh -c 'trap "" INT; exec "$@"' sh bwrap ...isolation... \
        python .../utils/grading/sandbox.py --memory-gb 16 --cpu-seconds 1800 [--uid 65534 --gid 65534] \
        -- python -m ipykernel_launcher -f ...

(without the first line when ``Limits.isolation == "none"``; `execute` puts
`containment.py`'s own exec-wrapper in front). The wrapper lowers its own
limits with `resource.setrlimit`, drops to the unprivileged uid when asked, restores the
default SIGINT action, and then *replaces itself* with the kernel (`os.execv`), so the kernel
keeps the wrapper's pid and everything the kernel starts inherits the same limits.

Which pid the KernelManager holds: without isolation, the wrapper's, which becomes the
kernel's. With isolation, bwrap's outer process (the ``sh`` execs bwrap); the kernel is its
grandchild (pid 2 in the sandbox's pid namespace, below bwrap's init) in the same process
group. jupyter_client interrupts by ``killpg(pgid, SIGINT)``: bwrap's two processes ignore
SIGINT (the ``trap``), the kernel does not (this wrapper reset it), so the interrupt reaches
the kernel alone; shutdown's SIGKILL to the group ends bwrap and with it the namespace and
every process in it.

Limits are **per process**, never summed: a real DeepSpeed job launched from a lab starts
torchrun and one process per rank, and each of them gets the same ceiling as the kernel,
so a generous default keeps those jobs working while still stopping a runaway submission.

* ``RLIMIT_AS`` (address space, bytes): a submission that allocates without bound gets a
  ``MemoryError`` instead of exhausting the machine. A CPU rank of a workbook job maps about
  2 GiB, hence the 16 GiB default. CUDA reserves huge virtual ranges, so on a machine with an
  NVIDIA driver (``/dev/nvidiactl``) the address-space limit is skipped and reported.
* ``RLIMIT_CPU`` (CPU seconds of one process): a kernel that burns CPU for longer is ended
  by the OS (SIGXCPU, then SIGKILL 30 s later). Per-cell *wall-clock* timeouts are the
  grader's job; this is the backstop for work hidden in threads or subprocesses.
* ``RLIMIT_FSIZE`` (largest file one process may write) and ``RLIMIT_CORE`` = 0 (no core dumps).

This file is run as a script by path, so it imports nothing but the standard library
(importing the `utils` package would import torch before every kernel start).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
from dataclasses import dataclass

GIB = 1024 ** 3
CPU_GRACE_SECONDS = 30
"""Between the soft CPU limit (SIGXCPU) and the hard one (SIGKILL)."""


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits of a grading kernel and every process it starts.

    A value of 0 (or None) leaves that limit as it is.
    """

    memory_gb: float = 16.0
    """Address space per process, GiB (``RLIMIT_AS``); skipped where an NVIDIA driver is present."""
    cpu_seconds: int = 1800
    """CPU time per process, seconds (``RLIMIT_CPU``)."""
    file_gb: float = 4.0
    """Largest file one process may write, GiB (``RLIMIT_FSIZE``)."""
    isolation: str = "bwrap"
    """``"bwrap"``: every kernel runs isolated (`isolation.py`), and grading refuses to start
    where bubblewrap does not work; ``"none"``: no isolation (trusted notebooks only)."""
    hide: tuple = ()
    """Paths an isolated kernel must not see, besides those always hidden
    (`isolation.HIDDEN_IN_PROJECT`: ``solutions/``, ``.git``...); the grader adds the lab
    source, the submission, the output and submissions folders."""

    def wrapper_args(self, isolation=None) -> list[str]:
        """The wrapper command up to and including ``--``; append the kernel command.

        `isolation` (an `isolation.Isolation`, or None for none) puts the sandbox first:
        bwrap then execs this wrapper, which execs the kernel.
        """
        prefix = isolation.prefix() if isolation is not None else []
        inner = isolation.wrapper_options() if isolation is not None else []
        return [*prefix, sys.executable, os.path.abspath(__file__),
                "--memory-gb", str(self.memory_gb or 0),
                "--cpu-seconds", str(self.cpu_seconds or 0),
                "--file-gb", str(self.file_gb or 0), *inner, "--"]


def _lower(kind: int, value: int, hard_extra: int = 0) -> None:
    """Set a limit no higher than the current hard limit (an unprivileged process may only
    lower it)."""
    soft, hard = resource.getrlimit(kind)
    new_hard = value + hard_extra
    if hard != resource.RLIM_INFINITY:
        new_hard = min(new_hard, hard)
    resource.setrlimit(kind, (min(value, new_hard), new_hard))


def apply(limits: Limits, *, report=print) -> None:
    """Apply `limits` to the current process (and so to everything it execs or starts)."""
    if limits.memory_gb:
        if os.path.exists("/dev/nvidiactl"):
            report("grading sandbox: NVIDIA driver present, address-space limit skipped "
                   "(CUDA reserves large virtual ranges)")
        else:
            _lower(resource.RLIMIT_AS, int(limits.memory_gb * GIB))
    if limits.cpu_seconds:
        _lower(resource.RLIMIT_CPU, int(limits.cpu_seconds), CPU_GRACE_SECONDS)
    if limits.file_gb:
        _lower(resource.RLIMIT_FSIZE, int(limits.file_gb * GIB))
    _lower(resource.RLIMIT_CORE, 0)


def drop_privileges(uid: int, gid: int) -> None:
    """Become `uid`/`gid` for good (no supplementary groups; as root this also clears every
    capability), forbid regaining privileges through set-uid programs or file capabilities
    (``no_new_privs``), and die with the parent (the sandbox's init) as before."""
    import ctypes
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise SystemExit("sandbox.py: could not drop privileges")
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig, pr_set_no_new_privs = 1, 38
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise SystemExit("sandbox.py: could not set no_new_privs")
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)  # cleared by the uid change


def main(argv: list[str] | None = None) -> None:
    """Parse the limits, apply them, drop privileges if asked, and exec the command after ``--``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: sandbox.py [--memory-gb G] [--cpu-seconds S] [--file-gb G] "
                         "[--uid U --gid G] -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="sandbox.py")
    parser.add_argument("--memory-gb", type=float, default=Limits.memory_gb)
    parser.add_argument("--cpu-seconds", type=int, default=Limits.cpu_seconds)
    parser.add_argument("--file-gb", type=float, default=Limits.file_gb)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    options = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit("sandbox.py: no command after --")
    apply(Limits(options.memory_gb, options.cpu_seconds, options.file_gb),
          report=lambda text: print(text, file=sys.stderr))
    if options.uid is not None:  # after the limits: an unprivileged process cannot raise them
        drop_privileges(options.uid, options.gid if options.gid is not None else options.uid)
    # bwrap runs with SIGINT ignored (see the module doc); the kernel must take interrupts.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
