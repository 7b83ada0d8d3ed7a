"""Progressive layer freezing on a DeepSpeed pipeline engine (`JobSpec.freeze_at`).

Freezing the first `n` layers means: their parameters get no gradient and no optimizer
update, and — what makes freezing pay in a pipeline — no backward runs through the frozen
prefix at all. DeepSpeed does not know this: a stage always marks the activation it receives
as requiring a gradient (``_exec_recv_activations``: ``recvd.requires_grad =
recvd.is_floating_point()``), so a stage whose frozen layers sit behind other frozen layers
would still compute and send input gradients nobody uses. Only the first stage, whose input
is data, fails in ``outputs.backward`` when all its layers are frozen (its outputs need no
gradient); a later all-frozen stage back-propagates to its input and then fails in gradient
clipping, which indexes the first parameter that has a gradient (see below).

`FrozenPrefix` fixes both on the engine *instance*, the way the tracer does: it wraps four
instructions of the engine's instruction map. Every rank knows the frozen count and the
boundaries, so sender and receiver skip a gradient transfer together:

- RecvActivation: the received activation needs no gradient when every layer before this
  stage is frozen;
- SendGrad / RecvGrad: skipped on both sides of a cut whose upstream side is all frozen;
- BackwardPass: skipped on a stage whose layers (and all before them) are frozen;

and one engine method: DeepSpeed clips gradients by default, and ``clip_grad_norm_``
all-reduces the norm over the model-parallel group (every stage) and the data-parallel
group, then fails on a stage with no gradient at all (it indexes the first parameter that
has one). On such a stage `clip_fp32_gradients` joins the same collectives with one
zero-gradient stand-in, the norm 0 its absent gradients have. The optimizer step itself
runs, so the LR scheduler and the step counters stay in line with the other stages.

The parameters keep their place in the optimizer (Adam skips a parameter whose ``grad`` is
None), so a stage that becomes all-frozen still has an optimizer, and the optimizer's
parameter order never depends on when a layer froze.
"""

from __future__ import annotations

from collections.abc import Sequence


def _instruction(name: str):
    from deepspeed.runtime.pipe import schedule

    return getattr(schedule, name)


class FrozenPrefix:
    """The first `count` layers of the model are frozen; one object per rank, shared by
    every engine the rank builds (a re-partition installs it on the new one)."""

    def __init__(self, count: int = 0):
        self.count = count
        self._first = self._stop = 0
        self._last_stage = True

    def install(self, engine, boundaries: Sequence[int]) -> None:
        """Wrap `engine`'s instructions (before the tracer, which times what it finds) and
        freeze its local layers. Call once per engine."""
        stage = engine.stage_id
        self._first, self._stop = boundaries[stage], boundaries[stage + 1]
        self._last_stage = engine.is_last_stage()
        found = dict(engine._INSTRUCTION_MAP)  # the instance's map if a schedule set one
        wrapped = dict(found)
        for name, wrap in (("RecvActivation", self._recv_activation), ("SendGrad", self._send_grad),
                           ("RecvGrad", self._recv_grad), ("BackwardPass", self._backward)):
            cls = _instruction(name)
            wrapped[cls] = wrap(found[cls])
        engine._INSTRUCTION_MAP = wrapped
        engine.clip_fp32_gradients = self._clipping(engine, engine.clip_fp32_gradients)
        self.apply(engine)

    def freeze(self, engine, count: int) -> None:
        """Freeze the first `count` layers from now on (between two steps)."""
        self.count = count
        self.apply(engine)

    def apply(self, engine) -> None:
        """Mark this rank's frozen layers: no gradient from now on, and none left over."""
        for index, layer in local_layers(engine).items():
            if index < self.count:
                for param in layer.parameters():
                    param.requires_grad_(False)
                    param.grad = None

    # A stage's input needs a gradient only if some layer before the stage trains.
    def _input_needs_grad(self) -> bool:
        return self.count < self._first

    def _output_needs_grad(self) -> bool:
        return self.count < self._stop

    def _recv_activation(self, fn):
        prefix = self

        def recv_activation(engine, buffer_id):
            fn(engine, buffer_id=buffer_id)
            if not prefix._input_needs_grad():
                received = engine.pipe_buffers["inputs"][buffer_id]
                for tensor in received if isinstance(received, (tuple, list)) else (received,):
                    if tensor.is_leaf:
                        tensor.requires_grad_(False)

        return recv_activation

    def _send_grad(self, fn):
        prefix = self

        def send_grad(engine, buffer_id):
            if prefix._input_needs_grad():
                return fn(engine, buffer_id=buffer_id)
            engine.pipe_buffers["inputs"][buffer_id] = None  # what DeepSpeed's own send frees

        return send_grad

    def _recv_grad(self, fn):
        prefix = self

        def recv_grad(engine, buffer_id):
            if prefix._output_needs_grad():
                return fn(engine, buffer_id=buffer_id)
            engine.grad_layer = None

        return recv_grad

    def _backward(self, fn):
        prefix = self

        def backward(engine, buffer_id):
            if prefix._last_stage or prefix._output_needs_grad():
                return fn(engine, buffer_id=buffer_id)
            engine.pipe_buffers["output_tensors"][buffer_id] = None  # what DeepSpeed's backward frees
            engine.pipe_buffers["outputs"][buffer_id] = None

        return backward

    def _clipping(self, engine, clip):
        prefix = self

        def clip_fp32_gradients():
            if prefix._output_needs_grad():
                return clip()
            import torch
            from deepspeed.runtime.utils import clip_grad_norm_

            stand_in = torch.zeros(1, device=engine.device, requires_grad=True)
            stand_in.grad = torch.zeros_like(stand_in)
            return clip_grad_norm_(parameters=[stand_in], max_norm=engine.gradient_clipping(), mpu=engine.mpu)

        return clip_fp32_gradients


def local_layers(engine) -> dict[int, object]:
    """This rank's layers by global index: `PipelineModule` registers the layer built from
    spec ``i`` as child module ``str(i)`` (``PipelineModule._build``)."""
    return {int(name): module for name, module in engine.module.named_children() if name.isdigit()}
