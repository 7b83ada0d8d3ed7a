"""Per-layer forward and backward cost, measured inside a running pipeline job.

The re-balancing policy needs what every layer costs *now*, under the job's own conditions
(its stage, its neighbours, frozen or not), not what a profile measured before launch.
`LayerCostMeter` times every local layer of a rank's engine while it trains:

- forward: a pre-hook and a hook on each layer module mark its start and end;
- backward: the forward hook registers a hook on the layer's output tensor that marks the
  moment the gradient of that output arrives — when this layer's backward starts. A tensor
  hook, not an identity autograd function around the output: the next layer may modify its
  input in place (``ReLU(inplace=True)``, as in DeepSpeed's own AlexNet example), which torch
  forbids on the view such a function returns; a tensor hook registered before an in-place
  change still fires with the gradient of the value it was registered on. The next stamp to fire below it (the layer before) marks its end; for the
  first layer of a stage the end of the BackwardPass instruction does. A layer whose output
  needs no gradient (a frozen prefix) gets no stamp and costs no backward.

What falls between the layers is the stage's own overhead: on the last stage mostly the loss,
which is folded into the last layer (it always lives with it); elsewhere the Python around
the layers, which no partition moves. Marks come from the rank's clock (`HostClock` on CPU,
CUDA events on GPU, resolved once per step), so measuring adds a few clock reads per layer
and micro-batch; `benchmarks/dynamic_rebalance.py` measures that overhead.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

import torch

from utils.runtime.frozen import local_layers


class LayerCostMeter:
    """Times the local layers of one engine; `take_step` returns one step's per-layer means.

    Install on each engine the rank builds, *before* the tracer (the meter wraps the
    BackwardPass instruction to mark its end; the tracer then times the wrapped one).
    """

    def __init__(self, clock):
        self.clock = clock
        self.enabled = True
        self._marks: list[tuple[str, int, object]] = []
        self._handles: list = []
        self._layers: list[int] = []
        self._last_stage = False

    def install(self, engine) -> None:
        from deepspeed.runtime.pipe.schedule import BackwardPass

        for handle in self._handles:  # hooks of a previous engine, gone with it anyway
            handle.remove()
        self._handles.clear()
        layers = local_layers(engine)
        self._layers = sorted(layers)
        self._last_stage = engine.is_last_stage()
        for index, module in layers.items():
            self._handles.append(module.register_forward_pre_hook(self._before_forward(index)))
            self._handles.append(module.register_forward_hook(self._after_forward(index)))
        found = dict(engine._INSTRUCTION_MAP)
        backward = found[BackwardPass]
        meter = self

        def timed_backward(engine, **kwargs):
            if meter.enabled:
                meter._marks.append(("B", -1, meter._mark()))
            backward(engine, **kwargs)
            if meter.enabled:
                meter._marks.append(("E", -1, meter._mark()))

        found[BackwardPass] = timed_backward
        engine._INSTRUCTION_MAP = found

    def _mark(self):
        """A clock mark; the step's first one starts the clock's step (on GPU: the origin
        event the others are resolved against, after one synchronize)."""
        if not self._marks:
            self.clock.begin_step()
        return self.clock.mark()

    def _before_forward(self, index: int):
        def hook(module, args):
            if self.enabled:
                self._marks.append(("f", index, self._mark()))
        return hook

    def _after_forward(self, index: int):
        def hook(module, args, output):
            if not self.enabled:
                return None
            self._marks.append(("F", index, self._mark()))
            if isinstance(output, torch.Tensor) and output.requires_grad and torch.is_grad_enabled():
                output.register_hook(self._backward_started(index))
            return None
        return hook

    def _backward_started(self, index: int):
        def hook(grad):
            self._marks.append(("b", index, self._mark()))
        return hook

    def take_step(self) -> dict[int, tuple[float, float]] | None:
        """This step's ``{layer: (forward, backward)}`` seconds per micro-batch (means over the
        step's micro-batches); None when nothing was measured. Clears the marks."""
        marks, self._marks = self._marks, []
        if not marks:
            return None
        times = self.clock.resolve([m for _, _, m in marks])
        forward: dict[int, list[float]] = defaultdict(list)
        backward: dict[int, list[float]] = defaultdict(list)
        started: dict[int, float] = {}
        fired: list[tuple[int, float]] = []  # backward stamps of the current BackwardPass
        backward_start = None
        for (kind, layer, _), t in zip(marks, times):
            if kind == "f":
                started[layer] = t
            elif kind == "F" and layer in started:
                forward[layer].append(t - started.pop(layer))
            elif kind == "B":
                fired, backward_start = [], t
            elif kind == "b":
                fired.append((layer, t))
            elif kind == "E":
                self._close_backward(fired, backward_start, t, backward)
                fired = []
        micro_batches = max((len(v) for v in forward.values()), default=0)
        if not micro_batches:
            return None
        costs = {}
        for layer in self._layers:
            f = fmean(forward[layer]) if forward[layer] else 0.0
            b = sum(backward[layer]) / micro_batches
            costs[layer] = (f, b)
        return costs

    def _close_backward(self, fired, start, end, backward) -> None:
        """One BackwardPass: stamps fire from the last layer down; each layer's backward runs
        from its stamp to the next stamp (the layer below), the lowest to the instruction's end.
        On the last stage the loss's backward, from the instruction's start to the first
        stamp, is added to the last layer."""
        if not fired:
            return
        for (layer, t), (_, t_next) in zip(fired, fired[1:] + [(None, end)]):
            backward[layer].append(max(0.0, t_next - t))
        if self._last_stage and start is not None:
            top = max(self._layers)
            if fired[0][0] == top:
                backward[top][-1] += max(0.0, fired[0][1] - start)
