"""Lowering schedules onto DeepSpeed's instruction stream, checked by executing the rows.

`execute` runs every stage's row the way DeepSpeed's engine would, with rendezvous p2p (a
send proceeds only together with the peer's matching recv, both being their ranks' current
instruction) and the engine's per-buffer state, and fails on a deadlock, a wrong payload or
a buffer overwritten while a micro-batch still needs it. The negative tests show it can fail.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from utils.planning.schedules import Schedule, build_schedule
from utils.runtime.lowering import Instruction, install_schedule, lower, num_buffers

PEER = {"send_act": (1, "recv_act"), "recv_act": (-1, "send_act"),
        "send_grad": (-1, "recv_grad"), "recv_grad": (1, "send_grad")}
LETTER = {"forward": "F", "backward": "B"}


class Deadlock(AssertionError):
    pass


class Stage:
    """What one rank of the engine holds: pipe buffers (inputs, labels, outputs or the
    last stage's stashed loss, by buffer id) and the single received gradient."""

    def __init__(self, s: int, p: int):
        self.s, self.first, self.last = s, s == 0, s == p - 1
        self.inputs: dict[int, int] = {}
        self.labels: dict[int, int] = {}
        self.outputs: dict[int, int] = {}
        self.input_grads: dict[int, int] = {}
        self.grad_layer: int | None = None
        self.loads: list[int] = []
        self.computes: list[str] = []
        self.stepped: list[str] = []

    def put(self, slots: dict[int, int], ins: Instruction, what: str) -> None:
        assert ins.buffer not in slots, (f"stage {self.s}: {ins} overwrites {what} of micro-batch "
                                         f"{slots.get(ins.buffer)} in buffer {ins.buffer}")
        slots[ins.buffer] = ins.micro_batch

    def holds(self, slots: dict[int, int], ins: Instruction, what: str) -> None:
        assert slots.get(ins.buffer) == ins.micro_batch, (
            f"stage {self.s}: {ins} expects {what} of micro-batch {ins.micro_batch} in buffer "
            f"{ins.buffer}, which holds {slots.get(ins.buffer)}")

    def local(self, ins: Instruction) -> None:
        b, k = ins.micro_batch, ins.kind
        assert not self.stepped or k in ("reduce_tied_grads", "reduce_grads", "optimizer_step"), \
            f"stage {self.s}: {ins} after the optimizer step began"
        if k == "load":
            assert self.first or self.last, f"stage {self.s} loads data"
            assert b == len(self.loads), f"stage {self.s}: load of {b} draws batch {len(self.loads)}"
            self.loads.append(b)
            if self.first:
                self.put(self.inputs, ins, "inputs")
            if self.last:
                self.put(self.labels, ins, "labels")
        elif k == "forward":
            self.holds(self.inputs, ins, "inputs (recv_act or load first)")
            if self.last:
                self.holds(self.labels, ins, "labels (load first)")
            self.put(self.outputs, ins, "outputs")  # the last stage: its stashed loss
            self.computes.append(f"F{b}")
        elif k == "backward":
            self.holds(self.outputs, ins, "outputs")
            if not self.last:
                assert self.grad_layer == b, \
                    f"stage {self.s}: {ins} but the received gradient is of {self.grad_layer}"
                self.grad_layer = None
            del self.outputs[ins.buffer]
            self.labels.pop(ins.buffer, None)
            if self.first:
                del self.inputs[ins.buffer]
            else:
                self.input_grads[ins.buffer] = b
            self.computes.append(f"B{b}")
        else:
            assert b is None and ins.buffer is None, ins
            self.stepped.append(k)

    def send(self, ins: Instruction) -> tuple[str, int]:
        if ins.kind == "send_act":
            self.holds(self.outputs, ins, "outputs (forward first)")
            return "act", ins.micro_batch
        self.holds(self.input_grads, ins, "input gradient (backward first)")
        del self.input_grads[ins.buffer], self.inputs[ins.buffer]  # send_grad frees the inputs
        return "grad", ins.micro_batch

    def recv(self, ins: Instruction, payload: tuple[str, int]) -> None:
        kind = "act" if ins.kind == "recv_act" else "grad"
        assert payload == (kind, ins.micro_batch), f"stage {self.s}: {ins} received {payload}"
        if kind == "act":
            self.put(self.inputs, ins, "inputs")
        else:
            self.holds(self.outputs, ins, "outputs")
            assert self.grad_layer is None, \
                f"stage {self.s}: {ins} overwrites the gradient of {self.grad_layer}"
            self.grad_layer = ins.micro_batch


def execute(rows) -> list[Stage]:
    """Run `rows` to the end under rendezvous semantics; raise `Deadlock` if they get stuck."""
    p = len(rows)
    stages = [Stage(s, p) for s in range(p)]
    pos = [0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(rows[r]):
                ins = rows[r][pos[r]]
                if ins.kind not in PEER:
                    stages[r].local(ins)
                    pos[r] += 1
                    progress = True
                    continue
                step, partner = PEER[ins.kind]
                q = r + step
                assert 0 <= q < p, f"stage {r}: {ins} has no peer"
                if pos[q] == len(rows[q]) or rows[q][pos[q]].kind != partner:
                    break  # blocked until the peer posts the matching op
                sender, receiver = (r, q) if ins.kind.startswith("send") else (q, r)
                stages[receiver].recv(rows[receiver][pos[receiver]],
                                      stages[sender].send(rows[sender][pos[sender]]))
                pos[r] += 1
                pos[q] += 1
                progress = True
    stuck = [f"stage {r} at {rows[r][pos[r]]}" for r in range(p) if pos[r] < len(rows[r])]
    if stuck:
        raise Deadlock("deadlock: " + "; ".join(stuck))
    for st in stages:
        assert not (st.inputs or st.labels or st.outputs or st.input_grads), \
            f"stage {st.s} still holds buffers at the end"
        assert st.stepped == ["reduce_tied_grads", "reduce_grads", "optimizer_step"]
    return stages


GRID = [(name, p, m) for name in ("gpipe", "1f1b") for p in range(1, 6) for m in range(1, 9)]


@pytest.mark.parametrize("name,p,m", GRID)
def test_lowered_schedules_run_to_the_end(name, p, m):
    schedule = build_schedule(name, p, m)
    rows = lower(schedule)
    stages = execute(rows)
    for s, st in enumerate(stages):
        assert st.computes == schedule.compute_order(s)
        assert st.loads == (list(range(m)) if s in (0, p - 1) else [])
        assert num_buffers(rows, s) == schedule.in_flight(s)
        if name == "1f1b":
            assert num_buffers(rows, s) == min(p - s, m)
        for i, ins in enumerate(rows[s]):  # load right before each forward, on first and last
            if ins.kind == "forward" and s in (0, p - 1):
                assert rows[s][i - 1] == Instruction("load", ins.micro_batch, ins.buffer)


def test_rows_read_as_expected():
    rows = lower(build_schedule("1f1b", 2, 3))
    assert " ".join(map(str, rows[0])) == \
        "L0@0 F0@0 sa0@0 L1@1 F1@1 rg0@0 sa1@1 B0@0 L2@0 F2@0 rg1@1 sa2@0 B1@1 rg2@0 B2@0 RT R O"
    assert " ".join(map(str, rows[1])) == \
        "ra0@0 L0@0 F0@0 B0@0 sg0@0 ra1@0 L1@0 F1@0 B1@0 sg1@0 ra2@0 L2@0 F2@0 B2@0 sg2@0 RT R O"
    with pytest.raises(ValueError, match="unknown instruction kind"):
        Instruction("commit_p2p")


# --- the interpreter can fail ------------------------------------------------------------------
def naive_lower(schedule: Schedule):
    """Each rank on its own: recv right before the compute, send right after it."""
    p, rows = schedule.num_stages, []
    for s, actions in enumerate(schedule.actions):
        row = []
        for a in actions:
            b, fwd = a.micro_batch, a.kind == "forward"
            if fwd and s > 0:
                row.append(Instruction("recv_act", b, b))
            if not fwd and s < p - 1:
                row.append(Instruction("recv_grad", b, b))
            if fwd and s in (0, p - 1):
                row.append(Instruction("load", b, b))
            row.append(Instruction(a.kind, b, b))
            if fwd and s < p - 1:
                row.append(Instruction("send_act", b, b))
            if not fwd and s > 0:
                row.append(Instruction("send_grad", b, b))
        rows.append(tuple(row) + tuple(Instruction(k) for k in ("reduce_tied_grads", "reduce_grads",
                                                                   "optimizer_step")))
    return rows


def test_interpreter_catches_a_deadlocking_lowering():
    execute(naive_lower(build_schedule("gpipe", 3, 4)))  # fine for GPipe...
    with pytest.raises(Deadlock, match="stage 0 at sa1"):  # ...but 1F1B: both ends send
        execute(naive_lower(build_schedule("1f1b", 2, 4)))


def test_interpreter_catches_wrong_payloads_and_overwritten_buffers():
    rows = [list(r) for r in lower(build_schedule("gpipe", 2, 3))]
    i, j = (k for k, ins in enumerate(rows[1]) if ins.kind == "recv_act" and ins.micro_batch < 2)
    rows[1][i], rows[1][j] = rows[1][j], rows[1][i]
    with pytest.raises(AssertionError, match="received"):
        execute(rows)
    one_buffer = [[Instruction(x.kind, x.micro_batch, 0 if x.buffer is not None else None) for x in r]
                  for r in lower(build_schedule("gpipe", 2, 3))]
    with pytest.raises(AssertionError, match="overwrites"):
        execute(one_buffer)


# --- refusals ----------------------------------------------------------------------------------
def test_interleaved_and_split_backward_are_refused():
    with pytest.raises(ValueError, match="one model chunk per stage and one full backward"):
        lower(build_schedule("interleaved-1f1b", 2, 4, chunks=2))
    with pytest.raises(ValueError, match="one model chunk per stage and one full backward"):
        lower(build_schedule("zb-h1", 2, 4))
    with pytest.raises(ValueError, match="micro-batch order"):
        lower(Schedule.from_strings(["0F1 0F0 0B0 0B1"]))
    engine = SimpleNamespace(num_stages=2, micro_batches=4)
    for name in ("interleaved-1f1b", "zb-h1"):
        with pytest.raises(ValueError, match="one model chunk per stage"):
            install_schedule(engine, name)


# --- the DeepSpeed adapter ---------------------------------------------------------------------
DS_NAMES = {"load": "LoadMicroBatch", "forward": "ForwardPass", "backward": "BackwardPass",
            "send_act": "SendActivation", "recv_act": "RecvActivation", "send_grad": "SendGrad",
            "recv_grad": "RecvGrad", "reduce_tied_grads": "ReduceTiedGrads",
            "reduce_grads": "ReduceGrads", "optimizer_step": "OptimizerStep"}


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_deepspeed_schedule_yields_the_lowered_rows(name):
    ds = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    from utils.runtime.lowering import LoweredPipeSchedule

    schedule = build_schedule(name, 3, 5)
    rows = lower(schedule)
    for s in range(3):
        sched = LoweredPipeSchedule(schedule, s)
        assert isinstance(sched, ds.PipeSchedule)
        got = [cmd for step in sched for cmd in step]  # how the engine iterates it
        assert [type(c).__name__ for c in got] == [DS_NAMES[i.kind] for i in rows[s]]
        assert [c.kwargs.get("buffer_id") for c in got] == [i.buffer for i in rows[s]]
        assert sched.num_pipe_buffers() == num_buffers(rows, s)


def test_install_schedule_follows_micro_batches_and_keeps_each_loss():
    ds = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    seen = []

    def forward(self, buffer_id):
        self.loss = f"loss{self.forwards}"
        self.forwards += 1

    def backward(self, buffer_id):
        seen.append(self.loss)

    base = {ds.ForwardPass: forward, ds.BackwardPass: backward}
    engine = SimpleNamespace(num_stages=2, micro_batches=3, stage_id=1, forwards=0,
                             is_last_stage=lambda: True, _INSTRUCTION_MAP=base)
    install_schedule(engine, "gpipe")
    assert engine._INSTRUCTION_MAP is not base and base[ds.ForwardPass] is forward
    sched = engine._train_schedule()
    assert (sched.micro_batches, sched.num_pipe_buffers()) == (3, 3)
    for step in sched:  # what the engine's _exec_schedule does, for forward and backward only
        for cmd in step:
            if type(cmd) in base:
                engine._INSTRUCTION_MAP[type(cmd)](engine, **cmd.kwargs)
    assert seen == ["loss0", "loss1", "loss2"]  # without the stash: loss2 three times
    engine.micro_batches = 5  # what engine.set_train_batch_size does
    assert engine._train_schedule().micro_batches == 5
