"""Which device a job or a measurement runs on: the one place ``"auto"`` is resolved."""

from __future__ import annotations

from typing import Literal

Device = Literal["auto", "cpu", "cuda"]


def resolve_device(requested: str, *, ranks: int = 1) -> Literal["cpu", "cuda"]:
    """``"cpu"`` or ``"cuda"`` for a request of ``"auto"``, ``"cpu"`` or ``"cuda"``.

    ``"auto"`` means CUDA only when there are at least as many GPUs as `ranks` (every rank
    of a pipeline job needs a device of its own), else CPU: a 2-stage job on a one-GPU node
    runs on CPU instead of failing. An explicit ``"cuda"`` is returned as asked; the
    planner refuses it when there are too few GPUs, with the reason.
    """
    if requested not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {requested!r}; choose 'auto', 'cpu' or 'cuda'")
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks else "cpu"
