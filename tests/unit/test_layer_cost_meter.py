"""How `LayerCostMeter` turns clock marks into per-layer costs (no engine: marks by hand).

A stage holds layers 3, 4, 5. Per micro-batch the marks are: forward start/end per layer;
then the BackwardPass instruction starts ("B"), the gradient of layer 5's output arrives
(its stamp "b"), then 4's, then 3's, and the instruction ends ("E")."""

import pytest

from utils.runtime.layercost import LayerCostMeter
from utils.runtime.tracing import HostClock


def _meter(last_stage: bool) -> LayerCostMeter:
    meter = LayerCostMeter(HostClock())
    meter._layers, meter._last_stage = [3, 4, 5], last_stage
    return meter


def _micro_batch(t0: float, *, stamps=(5, 4, 3)) -> list:
    marks = []
    t = t0
    for layer, cost in ((3, 1.0), (4, 2.0), (5, 3.0)):  # forward: 1, 2, 3
        marks += [("f", layer, t), ("F", layer, t + cost)]
        t += cost
    t += 1.0
    marks.append(("B", -1, t))           # backward starts; 0.5 of loss backward first
    t += 0.5
    for layer, cost in ((5, 6.0), (4, 4.0), (3, 2.0)):
        if layer in stamps:
            marks.append(("b", layer, t))
        t += cost
    marks.append(("E", -1, t))
    return marks


@pytest.mark.parametrize("last_stage, top_backward", [(False, 6.0), (True, 6.5)])
def test_each_layer_gets_its_own_forward_and_backward(last_stage, top_backward):
    meter = _meter(last_stage)
    meter._marks = _micro_batch(0.0) + _micro_batch(100.0)
    costs = meter.take_step()
    # On the last stage the loss's backward (before the first stamp) goes to the last layer.
    assert costs == {3: (1.0, 2.0), 4: (2.0, 4.0), 5: (3.0, top_backward)}
    assert meter.take_step() is None  # the marks were consumed


def test_a_frozen_prefix_costs_no_backward():
    """Layer 3's output needs no gradient (frozen, nothing trains before it): no stamp; layer
    4's backward runs to the instruction's end, layer 3's is zero."""
    meter = _meter(False)
    meter._marks = _micro_batch(0.0, stamps=(5, 4))
    costs = meter.take_step()
    assert costs[3] == (1.0, 0.0) and costs[4] == (2.0, 6.0) and costs[5] == (3.0, 6.0)


def test_disabled_meter_records_nothing():
    meter = _meter(False)
    meter.enabled = False
    assert meter.take_step() is None
