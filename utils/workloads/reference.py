"""The same model, weights and data as a pipeline job, trained as one sequential model in
this process: the yardstick that shows pipelining changes *when* work runs, not *what* is
computed (its losses match the pipeline's to float32 rounding)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from utils.workloads.models import batches, get_model

if TYPE_CHECKING:  # a type only: workloads sit below jobs and never import them
    from utils.jobs.spec import JobSpec


def train_sequential(spec: JobSpec) -> list[float]:
    """Train `spec`'s model for `spec.steps` steps without a pipeline; the loss per step.

    Mirrors the DeepSpeed job exactly: layers seeded as ``seed_layers=True`` seeds them,
    micro-batches from the same generator, gradients accumulated over micro-batches with
    the loss divided by their number (DeepSpeed's ``scale_wrt_gas``), then torch's AdamW with
    its defaults (what DeepSpeed's ``Adam`` + ``torch_adam: true`` builds).
    """
    spec.check()
    if spec.data_parallel != 1:
        raise ValueError("the sequential reference covers data_parallel=1 only")
    model = get_model(spec.model, spec.model_options)
    net = model.build_sequential(seed=spec.seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=spec.lr)
    data = batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size)
    losses = []
    for _ in range(spec.steps):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(spec.micro_batches):
            inputs, labels = next(data)
            loss = model.loss_fn(net(inputs), labels)
            (loss / spec.micro_batches).backward()
            total += loss.item()
        optimizer.step()
        losses.append(total / spec.micro_batches)
    return losses
