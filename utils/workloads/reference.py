"""The same model, weights and data as a pipeline job, trained as one sequential model in
this process: the yardstick that shows pipelining changes *when* work runs, not *what* is
computed (its losses match the pipeline's to float32 rounding)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch

from utils.workloads.models import batches, get_model

if TYPE_CHECKING:  # a type only: workloads sit below jobs and never import them
    from utils.jobs.spec import JobSpec


def train_sequential(spec: JobSpec, *, clip: Literal["global"] | int | None = None) -> list[float]:
    """Train `spec`'s model for `spec.steps` steps without a pipeline; the loss per step.

    Mirrors a pipeline job: layers seeded as ``seed_layers=True`` seeds them, micro-batches
    from the same generator, gradients accumulated over micro-batches with the loss divided by
    their number (DeepSpeed's ``scale_wrt_gas``), then torch's AdamW with its defaults (what
    DeepSpeed's ``Adam`` + ``torch_adam: true`` builds).

    `clip` is the gradient clipping, to max norm 1.0 (DeepSpeed's default ``gradient_clipping``),
    with DeepSpeed's formula ``min(1, 1 / (norm + 1e-6))``: None clips nothing; ``"global"``
    takes the norm of the whole model's gradient (the torch runtime, `utils.runtime.torchrank`);
    an integer k takes the norm of the first k layers' gradients only and scales every
    gradient by it — what DeepSpeed 0.19.8's pipeline engine does, k being its first stage's
    layer count (``clip_grad_norm_`` counts only the parameters of model-parallel rank 0).
    While no step's norm exceeds 1.0, the three agree.
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
        if clip is not None:
            counted = net if clip == "global" else net[:clip]
            norm = torch.stack([p.grad.float().norm() for p in counted.parameters()]).pow(2).sum().sqrt()
            coefficient = min(1.0, float(1.0 / (norm + 1e-6)))
            for p in net.parameters():
                p.grad.mul_(coefficient)
        optimizer.step()
        losses.append(total / spec.micro_batches)
    return losses
