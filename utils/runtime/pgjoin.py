"""How a rank joins its job's process group: the backend for its device and the process-group
timeout.

The process-group timeout bounds each operation on the *default* (world) group: DeepSpeed's
pipeline sends and receives (``deepspeed/runtime/pipe/p2p.py`` calls ``dist.send``/``dist.recv``
with no group) and any collective without a group. Groups made later with ``new_group`` (DeepSpeed's
data-parallel and tied-weight groups) get torch's own default instead, not this one.

`JobSpec.pg_timeout` (seconds) sets it for one job; None keeps DeepSpeed's ``default_pg_timeout``,
``DEEPSPEED_TIMEOUT`` whole minutes read when ``deepspeed.constants`` is imported, which the
launcher sets longer than the job's own timeout (`utils.jobs.launchers.LocalTorchrun.environment`).
"""

from __future__ import annotations

import os
from datetime import timedelta


def pg_timeout(spec) -> timedelta | None:
    """`spec.pg_timeout` as the timedelta torch takes, or None (DeepSpeed's default)."""
    return None if spec.pg_timeout is None else timedelta(seconds=spec.pg_timeout)


def join_process_group(device: str, spec) -> None:
    """Join the job's process group on `device` (``"cuda"``: NCCL, else gloo), with the spec's
    process-group timeout; once per process (DeepSpeed ignores later calls)."""
    import deepspeed
    import torch

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = pg_timeout(spec)
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo",
                               **({} if timeout is None else {"timeout": timeout}))
