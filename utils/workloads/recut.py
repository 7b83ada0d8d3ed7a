"""Fixed-length samples of any model, re-cut into another number of micro-batches per step.

A job whose micro-batch count changes between steps (`JobSpec.micro_batches_at`, a
`MicroBatchPolicy`) trains on the same samples whatever the count: each step draws what the
static job would — `JobSpec.micro_batches` micro-batches of `micro_batch_size` from the model's
own ``make_batch`` stream (`utils.workloads.layers.Batches`) — and cuts their concatenation into
the count in force, in equal parts. With a loss that is a per-sample mean (the presets', and a
learner's ``mse_loss`` or ``cross_entropy`` with their default ``reduction="mean"``), DeepSpeed's
1/m scaling of every micro-batch's backward then gives the same gradient for every count that
divides the step's samples, so the losses equal the static job's and `train_sequential`'s.

The workbook's own language-model presets draw variable-length token samples instead
(`utils.workloads.varlen`); this is for every other model.
"""

from __future__ import annotations

import torch

from utils.planning.microbatching import MicroBatchPlan
from utils.workloads.layers import Batches, Model


class RecutBatches:
    """One replica's micro-batches when their count varies (see the module docstring).

    Set `micro_batches` (the count for the coming step), call `begin_step(step)` (returns the
    count), then iterate ``(inputs, labels)`` micro-batches. `plan` and `step_lengths` describe
    the step like a variable-length plan does (every sample `seq_len` tokens long, or 1).
    """

    def __init__(self, model: Model, *, seed: int, replica: int, micro_batch_size: int, micro_batches: int):
        self.stream = Batches(model, seed=seed, micro_batch_size=micro_batch_size, replica=replica)
        self.draws = micro_batches
        self.samples = micro_batch_size * micro_batches
        self.micro_batches = micro_batches
        self.length = model.seq_len or 1
        self.step = -1
        self.plan: MicroBatchPlan | None = None
        self.step_lengths: list[int] = []
        self._queue: list[tuple[torch.Tensor, torch.Tensor]] = []

    def begin_step(self, step: int) -> int:
        m = self.micro_batches
        if self.samples % m:
            raise ValueError(f"{m} micro-batches do not divide the step's {self.samples} samples")
        drawn = [next(self.stream) for _ in range(self.draws)]
        inputs = torch.cat([d[0] for d in drawn])
        labels = torch.cat([d[1] for d in drawn])
        n = self.samples // m
        self._queue = list(zip(inputs.split(n), labels.split(n)))[::-1]
        self.plan = MicroBatchPlan(tuple(tuple(range(j * n, (j + 1) * n)) for j in range(m)), (self.length,) * m)
        self.step, self.step_lengths = step, [self.length] * self.samples
        return m

    def __iter__(self) -> RecutBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._queue:
            raise RuntimeError(f"step {self.step} asked for more micro-batches than it was cut into "
                               f"({self.micro_batches}); begin_step was not called?")
        return self._queue.pop()

    def state(self) -> dict:
        """The position in the model's sample stream, after the last step drawn."""
        return self.stream.state()

    def restore(self, state: dict) -> None:
        self.stream.restore(state)
