"""Failures injected on purpose (`JobSpec.fault`), to practise troubleshooting and to test
that the launcher copes: the first replica of one stage fails when it starts one
instruction of one step."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from utils.jobs.spec import JobSpec


def fault_hook(spec: JobSpec, stage: int, is_first_replica: bool) -> Callable[[int, str, int | None], None] | None:
    """The tracer's `before` callback that injects `spec.fault` on this rank, or None."""
    fault = spec.fault
    if fault is None or stage != fault.stage or not is_first_replica:
        return None

    def before(step: int, kind: str, micro_batch: int | None) -> None:
        if step == fault.step and kind == fault.instruction and micro_batch in (None, 0):
            message = f"injected fault: stage {stage} fails at step {step} in {kind}"
            if fault.kind == "raise":
                raise RuntimeError(message)
            print(message, flush=True)
            if fault.kind == "exit":
                os._exit(3)
            if fault.kind == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # "hang": block like a rank stuck in a collective
                time.sleep(3600)

    return before
