"""The instruction tracer on a hand-built engine (no processes): what it records and what
it tolerates."""

from types import SimpleNamespace

from utils.jobs.records import SlotStatus
from utils.runtime.tracing import HostClock, InstructionTracer


class ForwardPass:  # named like DeepSpeed's instruction classes: the tracer keys on the name
    pass


class CommitP2P:  # DeepSpeed's DualPipeVEngine has it; the tracer's table does not
    pass


def fake_engine(calls):
    def forward(engine, buffer_id):
        calls.append(("forward", buffer_id))

    def commit(engine):
        calls.append(("commit",))

    return SimpleNamespace(_INSTRUCTION_MAP={ForwardPass: forward, CommitP2P: commit})


class Slot:
    def __init__(self):
        self.status = None

    def write(self, **fields):
        self.status = SlotStatus(**fields)


def test_unknown_instructions_run_untraced():
    # Before, building the tracer raised KeyError('CommitP2P') and the job died at start.
    calls, slot = [], Slot()
    engine = fake_engine(calls)
    tracer = InstructionTracer(engine, stage=0, rank=0, clock=HostClock(), status=slot)
    tracer.begin_step(0)
    engine._INSTRUCTION_MAP[ForwardPass](engine, buffer_id=1)
    engine._INSTRUCTION_MAP[CommitP2P](engine)
    assert slot.status.describe() == "step=0 CommitP2P (untraced)" and slot.status.untraced
    events = tracer.end_step()
    assert calls == [("forward", 1), ("commit",)]
    assert [(e.kind, e.micro_batch) for e in events] == [("forward", 0)]


def test_the_tracer_wraps_the_map_it_finds_and_can_be_switched_off():
    calls = []
    engine = fake_engine(calls)
    stashed = []
    original = engine._INSTRUCTION_MAP[ForwardPass]
    # What the schedule lowering does on the last stage: its own wrapper in an instance map.
    engine._INSTRUCTION_MAP = {**engine._INSTRUCTION_MAP,
                               ForwardPass: lambda e, buffer_id: (original(e, buffer_id=buffer_id),
                                                                  stashed.append(buffer_id))}
    tracer = InstructionTracer(engine, stage=1, rank=3, clock=HostClock())
    tracer.begin_step(2)
    engine._INSTRUCTION_MAP[ForwardPass](engine, buffer_id=0)
    [event] = tracer.end_step()
    assert stashed == [0] and (event.stage, event.rank, event.step) == (1, 3, 2)  # installed after: both run
    tracer.enable(False)
    tracer.begin_step(3)
    engine._INSTRUCTION_MAP[ForwardPass](engine, buffer_id=0)
    assert tracer.end_step() == [] and stashed == [0, 0]
