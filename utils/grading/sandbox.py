"""Resource limits for grading kernels, applied by a tiny launch wrapper.

The grader starts every kernel as::

    python .../utils/grading/sandbox.py --memory-gb 16 --cpu-seconds 1800 -- python -m ipykernel_launcher -f ...

The wrapper lowers its own limits with `resource.setrlimit` and then *replaces itself* with
the kernel (`os.execv`), so the kernel keeps the wrapper's pid (interrupts and shutdown reach
it as usual) and everything the kernel starts inherits the same limits.

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

    def wrapper_args(self) -> list[str]:
        """The wrapper command up to and including ``--``; append the kernel command."""
        return [sys.executable, os.path.abspath(__file__),
                "--memory-gb", str(self.memory_gb or 0),
                "--cpu-seconds", str(self.cpu_seconds or 0),
                "--file-gb", str(self.file_gb or 0), "--"]


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


def main(argv: list[str] | None = None) -> None:
    """Parse the limits, apply them and exec the command after ``--``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: sandbox.py [--memory-gb G] [--cpu-seconds S] [--file-gb G] -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="sandbox.py")
    parser.add_argument("--memory-gb", type=float, default=Limits.memory_gb)
    parser.add_argument("--cpu-seconds", type=int, default=Limits.cpu_seconds)
    parser.add_argument("--file-gb", type=float, default=Limits.file_gb)
    options = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit("sandbox.py: no command after --")
    apply(Limits(options.memory_gb, options.cpu_seconds, options.file_gb),
          report=lambda text: print(text, file=sys.stderr))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
