"""Schedules DeepSpeed's PipelineEngine can execute besides its own 1F1B (TrainSchedule).

The engine asks `self._train_schedule()` for a `PipeSchedule` at every `train_batch`, so
setting that attribute on the engine *instance* plugs in another order without subclassing
or copying engine code (DESIGN.md). This module is imported only inside job processes.
"""

from __future__ import annotations

from deepspeed.runtime.pipe import schedule as ds


class GPipeSchedule(ds.PipeSchedule):
    """All forward passes, then all backward passes in micro-batch order, then the step.

    Each micro-batch keeps its own buffer (m buffers), which is exactly GPipe's cost: a
    stage holds the activations of every micro-batch before the first backward starts.
    """

    def steps(self):
        first, last = self.stage_id == 0, self.stage_id == self.stages - 1
        for mb in range(self.micro_batches):
            cmds = []
            if not first:
                cmds.append(ds.RecvActivation(mb))
            if first or last:
                cmds.append(ds.LoadMicroBatch(mb))
            cmds.append(ds.ForwardPass(mb))
            if not last:
                cmds.append(ds.SendActivation(mb))
            yield cmds
        for mb in range(self.micro_batches):
            cmds = []
            if not last:
                cmds.append(ds.RecvGrad(mb))
            cmds.append(ds.BackwardPass(mb))
            if not first:
                cmds.append(ds.SendGrad(mb))
            if mb == self.micro_batches - 1:
                cmds += [ds.ReduceTiedGrads(), ds.ReduceGrads(), ds.OptimizerStep()]
            yield cmds

    def num_pipe_buffers(self) -> int:
        return self.micro_batches


def use_gpipe(engine) -> None:
    """Make `engine` run `GPipeSchedule`.

    The engine keeps a single ``self.loss`` for the last stage's backward, which is right for
    1F1B (each forward is followed by its backward) but not for GPipe, where all forwards run
    first. So the last stage stashes each micro-batch's loss by buffer and restores it before
    that buffer's backward; with it, GPipe and 1F1B give bit-identical losses.
    """
    engine._train_schedule = lambda: GPipeSchedule(
        micro_batches=engine.micro_batches, stages=engine.num_stages, stage_id=engine.stage_id)
    if not engine.is_last_stage():
        return
    table = dict(engine._INSTRUCTION_MAP)
    forward, backward = table[ds.ForwardPass], table[ds.BackwardPass]
    losses = {}

    def forward_keeping_loss(self, buffer_id):
        forward(self, buffer_id=buffer_id)
        losses[buffer_id] = self.loss

    def backward_with_its_loss(self, buffer_id):
        self.loss = losses.pop(buffer_id)
        backward(self, buffer_id=buffer_id)

    table[ds.ForwardPass], table[ds.BackwardPass] = forward_keeping_loss, backward_with_its_loss
    engine._INSTRUCTION_MAP = table
