"""The torch runtime without processes: which runtime a spec resolves to, what it refuses
before launch, the partition into virtual stages, the tracer on stand-in stages, the V
placement in the what-if calibration, and the order the engine's wrappers are applied in."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from utils import Fault, JobSpec
from utils.jobs.plan import plan_boundaries
from utils.planning.catalogue import SCHEDULE_NAMES, schedule_info, schedules_on
from utils.planning.schedules import build_schedule, virtual_stage_of
from utils.planning.simulator import simulate
from utils.planning.whatif import measured_stage_costs, predict_from_timeline
from utils.runtime import assembly
from utils.runtime.torchrank import StageTracer
from utils.runtime.tracing import HostClock
from utils.workloads.models import get_model

MLP = dict(model="mlp", device="cpu")


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_auto_takes_the_catalogues_first_runtime_and_its_default_chunks(name):
    info = schedule_info(name)
    spec = JobSpec(**MLP, schedule=name, num_stages=2, micro_batches=4)
    spec.check()
    assert spec.resolved_runtime == info.runtimes[0]
    assert spec.model_chunks == info.default_chunks and spec.virtual_stages == 2 * info.default_chunks
    for runtime in info.runtimes:  # every runtime the record names accepts it
        JobSpec(**MLP, schedule=name, num_stages=2, micro_batches=4, runtime=runtime).check()


@pytest.mark.parametrize("fields, text", [
    ({"schedule": "zbv", "runtime": "deepspeed"}, "does not run on the deepspeed runtime"),
    ({"schedule": "interleaved-1f1b", "chunks": 1}, "chunks >= 2"),
    ({"schedule": "1f1b", "chunks": 2}, "one model chunk per rank"),
    ({"schedule": "dualpipev", "chunks": 3}, "exactly 2 model chunks"),
    ({"schedule": "zb-h1", "data_parallel": 2}, r"data_parallel \(data parallelism is DeepSpeed's grid"),
    ({"schedule": "1f1b", "runtime": "torch", "precision": "bf16"}, "precision"),
    ({"schedule": "zbv", "deepspeed_config": {"gradient_clipping": 0.0}}, "no DeepSpeed config"),
    ({"schedule": "interleaved-1f1b", "freeze_at": {1: 2}, "steps": 3}, "freeze_at"),
    ({"schedule": "interleaved-1f1b", "batching": "sorted"}, "batching"),
    ({"schedule": "zbv", "fault": Fault(kind="mismatch", stage=0)}, "mismatch and exhausted need DeepSpeed"),
    ({"schedule": "zbv", "fault": Fault(kind="raise", stage=0, instruction="recv_act")}, "instruction='recv_act'"),
    ({"schedule": "dualpipev", "micro_batches": 3}, r"at least 2 \* 2 = 4"),
    ({"schedule": "interleaved-1f1b", "micro_batches": 5}, "equal rounds"),
    ({"schedule": "interleaved-1f1b", "chunks": 3, "model_options": {"blocks": 5}}, "3 = 6 virtual stages"),
    ({"schedule": "zbv", "partition": [0, 4, 8]}, "one piece per virtual stage: 4"),
    ({"schedule": "1F1B"}, "write it as '1f1b'"),
    ({"runtime": "jax"}, "unknown runtime"),
    ({"fault": Fault(kind="raise", stage=0, instruction="backward_weight")}, "DeepSpeed.s engine never runs"),
])
def test_impossible_combinations_are_refused_before_launch_saying_what_to_change(fields, text):
    spec = JobSpec(**{**MLP, "num_stages": 2, "micro_batches": 4, **fields})
    with pytest.raises(ValueError, match=text):
        spec.check()


def test_the_partition_cuts_one_piece_per_virtual_stage():
    model = get_model("mlp")
    for name in SCHEDULE_NAMES:
        spec = JobSpec(**MLP, schedule=name, num_stages=2, micro_batches=4, partition="uniform")
        parts = plan_boundaries(spec, model, None)
        assert len(parts) == spec.virtual_stages + 1 and parts[0] == 0 and parts[-1] == model.num_layers


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_virtual_stage_of_inverts_rank_of(name):
    plan = build_schedule(name, 3, 6)
    for k in range(plan.num_virtual_stages):
        rank, chunk = plan.rank_of(k), k // 3
        assert virtual_stage_of(plan.placement, 3, rank, chunk) == plan.virtual_stage(rank, chunk) == k


@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if schedule_info(n).placement == "v"])
def test_the_calibration_reads_the_v_placement(name):
    """A simulated V run calibrates back to the costs it was simulated with, stage by stage,
    and predicting the same schedule from it gives the same timeline."""
    plan = build_schedule(name, 2, 4)
    forward, backward, weight = [1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0], [0.5, 0.5, 1.0, 1.0]
    timeline = simulate(plan, forward, backward, weight=weight, comm=0.1)
    costs = measured_stage_costs(timeline)
    assert costs.forward == tuple(forward) and costs.backward == tuple(backward)
    assert costs.weight == tuple(weight)
    predicted = predict_from_timeline(timeline)
    assert predicted.metrics().makespan == pytest.approx(timeline.metrics().makespan)


class _Stage:
    """A stand-in for ``PipelineStage``: the three compute calls torch's schedules make."""

    def __init__(self, calls: list):
        self.calls = calls

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.calls.append(("F", fwd_chunk_id))
        return fwd_chunk_id

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        self.calls.append(("B" if full_backward else "I", bwd_chunk_id))

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        self.calls.append(("W", bwd_chunk_id))


class _Slot:
    def __init__(self):
        self.writes = []

    def write(self, **fields):
        self.writes.append(fields)


def test_the_stage_tracer_times_every_compute_call_with_its_chunk_and_says_what_runs():
    calls, slot, struck, sampled = [], _Slot(), [], []
    stages = [_Stage(calls), _Stage(calls)]
    tracer = StageTracer([(stages[0], 0), (stages[1], 1)], rank=1, clock=HostClock(), status=slot,
                         before=lambda step, kind, mb: struck.append((step, kind, mb)),
                         after=lambda: sampled.append(1))
    tracer.set_origin(0.0)
    tracer.begin_step(3)
    assert stages[0].forward_one_chunk(0, "x") == 0  # the call runs and its result comes back
    stages[1].forward_one_chunk(0)
    stages[1].backward_one_chunk(0, full_backward=False)
    stages[1].backward_weight_one_chunk(0)
    stages[0].backward_one_chunk(0)
    events = tracer.end_step()
    assert calls == [("F", 0), ("F", 0), ("I", 0), ("W", 0), ("B", 0)]
    assert [(e.kind, e.chunk, e.micro_batch, e.step, e.stage, e.rank) for e in events] == [
        ("forward", 0, 0, 3, 1, 1), ("forward", 1, 0, 3, 1, 1), ("backward_input", 1, 0, 3, 1, 1),
        ("backward_weight", 1, 0, 3, 1, 1), ("backward", 0, 0, 3, 1, 1)]
    assert all(e.end >= e.start for e in events)
    assert struck == [(3, e.kind, 0) for e in events] and len(sampled) == 5
    doing = [(w["doing"], w.get("chunk")) for w in slot.writes]
    assert doing[:2] == [("forward", 0), ("wait", 0)] and doing[-1] == ("finished", None)


def test_the_wrappers_are_applied_in_wrap_order(monkeypatch):
    """`build_engine` then `trace` apply schedule, freeze, layer cost, fault and tracer in the
    order `WRAP_ORDER` names, each on the engine the one before left."""
    applied = []
    engine = SimpleNamespace(stage_id=0, grid=SimpleNamespace(data_parallel_id=0), _INSTRUCTION_MAP={})
    monkeypatch.setattr(assembly, "connect", lambda device, spec: None)
    monkeypatch.setattr(assembly, "build_module", lambda spec, model, boundaries: SimpleNamespace(
        parameters=lambda: []))
    import deepspeed

    import utils.runtime.faults as faults
    import utils.runtime.lowering as lowering
    import utils.runtime.tracing as tracing

    monkeypatch.setattr(deepspeed, "initialize", lambda **kwargs: (engine, None, None, None))
    monkeypatch.setattr(lowering, "install_schedule", lambda e, name: applied.append("schedule"))
    injector = SimpleNamespace(install=lambda e: applied.append("fault"), before=None)
    monkeypatch.setattr(faults, "fault_injector", lambda *args: injector)
    monkeypatch.setattr(tracing, "InstructionTracer", lambda *args, **kwargs: applied.append("tracer"))
    monkeypatch.setattr(assembly, "StatusSlot", lambda path: None)
    frozen = SimpleNamespace(install=lambda e, b: applied.append("freeze"))
    meter = SimpleNamespace(install=lambda e: applied.append("layer_cost"))
    spec = JobSpec(**MLP, schedule="gpipe", num_stages=1)
    built = assembly.build_engine(spec, None, [0, 8], "cpu", frozen=frozen, meter=meter)
    assembly.trace(built, spec, SimpleNamespace(status_slot=lambda rank: None), 0, "cpu")
    assert built is engine and applied == list(assembly.WRAP_ORDER)


def test_every_torch_schedule_is_a_torch_class_and_every_other_list_reads_the_catalogue():
    from torch.distributed import pipelining

    for name in schedules_on("torch"):
        info = schedule_info(name)
        base = (pipelining.schedules.PipelineScheduleMulti if info.torch_multi_stage
                else pipelining.schedules.PipelineScheduleSingle)
        assert issubclass(getattr(pipelining, info.torch_class), base), name
    spec = dataclasses.replace(JobSpec(**MLP), schedule="zbv")
    assert spec.resolved_runtime == "torch" and spec.virtual_stages == 4
