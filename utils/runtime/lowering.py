"""Run any non-interleaved `utils.planning.schedules.Schedule` on DeepSpeed's PipelineEngine.

The engine asks `self._train_schedule()` for a `PipeSchedule` at every `train_batch`, so
setting that attribute on the engine *instance* plugs in another order without subclassing
or copying engine code (DESIGN.md). A schedule says only which compute runs where, in which
order; the engine needs the whole instruction stream. As in ``torch.distributed.pipelining``
the two are separate passes:

1. `lower` (pure data, no DeepSpeed): one row of `Instruction`s per stage, with loads, point-
   to-point transfers, buffer ids and the final reduce/step placed around the compute.
2. `LoweredPipeSchedule` and `install_schedule`: that row as DeepSpeed instructions. DeepSpeed
   is imported only when they are used, i.e. inside job processes.

The engine runs one model chunk per stage and one full backward, so interleaved schedules
(chunks > 1) and split-backward ones (zero bubble: I and W passes) are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from heapq import heappop, heappush

from utils.planning.catalogue import schedule_info
from utils.planning.schedules import Schedule, build_schedule
from utils.timeline import INSTRUCTION_KINDS, KIND_LETTER, STEP_KINDS, InstructionKind

# LoweredPipeSchedule is public too, but left out so that `import *` never imports DeepSpeed.
__all__ = ["Instruction", "install_schedule", "lower", "num_buffers"]

#: Unit costs of the plan that orders the events: any positive costs give a valid order;
#: backward = 2 x forward is the usual ratio and makes the plan look like a real run.
_COST = {"forward": 1.0, "backward": 2.0}
_NOT_SUPPORTED = ("DeepSpeed's PipelineEngine runs one model chunk per stage and one full "
                  "backward per micro-batch")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction of a stage's stream; `buffer` is the engine's pipe-buffer slot."""

    kind: InstructionKind
    micro_batch: int | None = None
    buffer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in INSTRUCTION_KINDS:
            raise ValueError(f"unknown instruction kind {self.kind!r}; "
                             f"expected one of {INSTRUCTION_KINDS}")

    def __str__(self) -> str:  # "ra1@0 L1@0 F1@0 sa1@0 ... R O": kind letter, micro-batch @ buffer
        mb = "" if self.micro_batch is None else str(self.micro_batch)
        return KIND_LETTER[self.kind] + mb + ("" if self.buffer is None else f"@{self.buffer}")


@lru_cache(maxsize=64)  # train_batch asks again at every step; schedules are hashable data
def lower(schedule: Schedule) -> tuple[tuple[Instruction, ...], ...]:
    """Each stage's instruction stream for `schedule`, deadlock-free under rendezvous p2p.

    DeepSpeed's p2p send may block until the peer posts the matching recv (gloo and NCCL
    alike), so we assume it always does (rendezvous); and sends and recvs between two ranks
    match in the order posted, whatever they carry. So we build ONE global sequence of
    events: every compute action plus one rendezvous per transfer (the activation of
    micro-batch b from stage s to s+1, the gradient of b from s+1 to s), in an order that
    respects every rank's own order and every data dependency, and each row is that sequence
    projected onto its rank. This cannot deadlock: by induction, once all events before
    event k have run, event k is the next instruction of every rank it involves (all their
    earlier instructions are earlier events), so a compute runs and a transfer finds both
    ends posted. And as both ends of a link list its transfers in the same (global) order,
    every recv gets the tensor it expects.

    The order: start times of a simulated run with positive unit costs (`_COST`, no comm
    time), so one rank's computes start at strictly increasing times and a consumer starts
    no earlier than its producer ends. A transfer sits at its *consumer's* start (when the
    receiver is ready; the producer ended earlier), ahead of any compute starting then.
    Not at the producer's end, because the engine keeps received data per receiver: a
    recv_act arriving before a backward frees a buffer would cost a buffer more than the
    schedule keeps in flight (1F1B: p - s + 1 instead of p - s), and the engine holds a
    single received gradient (``grad_layer``), so a second recv_grad must not land before
    the backward that reads the first. So every recv directly precedes the compute that
    reads it. Ties: gradients before activations (a send_grad frees the sender's buffer
    before a recv_act takes one), then stage, micro-batch.
    """
    p = schedule.num_stages
    if schedule.chunks > 1 or schedule.split_backward:
        what = "interleaved (chunks > 1)" if schedule.chunks > 1 else "split-backward (I/W)"
        raise ValueError(f"schedule {schedule.name!r} is {what}; {_NOT_SUPPORTED}, so it "
                         "cannot be lowered onto it")
    plan = schedule._plan  # validates: complete, well placed, deadlock-free as an order
    start, _ = plan.times([_COST[a.kind] for a in plan.actions], 0.0, p)
    events = []  # (time, class: 0 grad transfer / 1 activation transfer / 2 compute, stage, mb, kind)
    for a, t in zip(plan.actions, start):
        s, b = a.virtual_stage, a.micro_batch
        events.append((t, 2, s, b, a.kind))
        if a.kind == "forward" and s > 0:
            events.append((t, 1, s, b, "act"))  # s-1 -> s, just before this forward
        elif a.kind == "backward" and s < p - 1:
            events.append((t, 0, s, b, "grad"))  # s+1 -> s, just before this backward
    rows: list[list[tuple[str, int]]] = [[] for _ in range(p)]
    for _, _, s, b, kind in sorted(events):
        if kind == "act":
            rows[s - 1].append(("send_act", b))
            rows[s].append(("recv_act", b))
        elif kind == "grad":
            rows[s + 1].append(("send_grad", b))
            rows[s].append(("recv_grad", b))
        else:
            if kind == "forward" and s in (0, p - 1):
                rows[s].append(("load", b))  # as TrainSchedule: first loads inputs, last labels
            rows[s].append((kind, b))
    for s in {0, p - 1}:
        # LoadMicroBatch draws the *next* batch from the data iterator: micro-batch b must be
        # the b-th forward on the first and the last stage, or inputs and labels would not match.
        order = [b for kind, b in rows[s] if kind == "forward"]
        if order != sorted(order):
            raise ValueError(f"schedule {schedule.name!r}: stage {s} runs forwards in order "
                             f"{order}; DeepSpeed loads data in micro-batch order")
    steps = tuple(Instruction(kind) for kind in STEP_KINDS)  # after the last compute, everywhere
    return tuple(_assign_buffers(row) + steps for row in rows)


def _assign_buffers(row: Sequence[tuple[str, int]]) -> tuple[Instruction, ...]:
    """Give each micro-batch the lowest free buffer from its first instruction on this stage
    (recv_act, load or forward) until after its last (backward, or send_grad, which still
    reads the input's gradient from the buffer). For GPipe and 1F1B the count is exactly the
    schedule's peak in flight (`Schedule.in_flight`; tested)."""
    last = {b: i for i, (_, b) in enumerate(row)}
    free = list(range(len(last)))  # a heap of free buffer ids; more than can ever be needed
    held: dict[int, int] = {}
    out = []
    for i, (kind, b) in enumerate(row):
        if b not in held:
            held[b] = heappop(free)
        out.append(Instruction(kind, b, held[b]))
        if last[b] == i:
            heappush(free, held.pop(b))
    return tuple(out)


def num_buffers(rows: Sequence[Sequence[Instruction]], stage: int) -> int:
    """Pipe buffers `stage` uses in the lowered `rows`: its peak number of micro-batches held."""
    return 1 + max((i.buffer for i in rows[stage] if i.buffer is not None), default=-1)


# --- DeepSpeed adapter (imports DeepSpeed on first use: job processes only) -------------------
@cache
def _deepspeed_classes() -> tuple[type, dict[str, type]]:
    from deepspeed.runtime.pipe import schedule as ds

    classes = {"load": ds.LoadMicroBatch, "forward": ds.ForwardPass, "backward": ds.BackwardPass,
               "send_act": ds.SendActivation, "recv_act": ds.RecvActivation,
               "send_grad": ds.SendGrad, "recv_grad": ds.RecvGrad,
               "reduce_tied_grads": ds.ReduceTiedGrads, "reduce_grads": ds.ReduceGrads,
               "optimizer_step": ds.OptimizerStep}

    class LoweredPipeSchedule(ds.PipeSchedule):
        """`lower(schedule)`'s row for `stage_id`, as DeepSpeed instructions.

        One instruction per step: the engine runs steps back to back. Unlike TrainSchedule's
        lock-step rows, these are not aligned step by step across stages, so PipeSchedule's
        note that a barrier may sit between two steps does not hold here (nothing places one).
        """

        def __init__(self, schedule: Schedule, stage_id: int):
            super().__init__(micro_batches=schedule.num_micro_batches, stages=schedule.num_stages,
                             stage_id=stage_id)
            self.rows = lower(schedule)

        def steps(self):
            for ins in self.rows[self.stage_id]:
                cls = classes[ins.kind]
                yield [cls() if ins.buffer is None else cls(buffer_id=ins.buffer)]

        def num_pipe_buffers(self) -> int:
            return max(1, num_buffers(self.rows, self.stage_id))

    return LoweredPipeSchedule, classes


def __getattr__(name: str):  # importing LoweredPipeSchedule from here imports DeepSpeed
    if name == "LoweredPipeSchedule":
        return _deepspeed_classes()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install_schedule(engine, name: str) -> None:
    """Make `engine` run ``build_schedule(name, stages, micro-batches)``, lowered.

    The schedule is rebuilt from ``engine.micro_batches`` at every `train_batch`, so
    ``engine.set_train_batch_size`` keeps working (`build_schedule` and `lower` cache per
    micro-batch count). Install `utils.runtime.tracing.InstructionTracer` *after* this: it
    wraps the instruction map it finds, and this replaces the last stage's map.

    The engine keeps a single ``self.loss`` for the last stage's backward, which is right for
    1F1B (each forward is followed by its backward) but not for GPipe, where all forwards run
    first. So the last stage stashes each micro-batch's loss by buffer and restores it before
    that buffer's backward; with it, GPipe and 1F1B give bit-identical losses.
    """
    info = schedule_info(name)
    if not info.runs_on("deepspeed"):
        raise ValueError(f"schedule {name!r} runs on {', '.join(info.runtimes)} only: {_NOT_SUPPORTED}")
    lower(build_schedule(name, engine.num_stages, engine.micro_batches))  # refuse now, not at step 1
    pipe_schedule, classes = _deepspeed_classes()
    engine._train_schedule = lambda: pipe_schedule(
        build_schedule(name, engine.num_stages, engine.micro_batches), engine.stage_id)
    if not engine.is_last_stage():
        return
    table = dict(engine._INSTRUCTION_MAP)  # the instance's copy; the class map stays untouched
    forward, backward = table[classes["forward"]], table[classes["backward"]]
    losses = {}

    def forward_keeping_loss(self, buffer_id):
        forward(self, buffer_id=buffer_id)
        losses[buffer_id] = self.loss

    def backward_with_its_loss(self, buffer_id):
        self.loss = losses.pop(buffer_id)
        backward(self, buffer_id=buffer_id)

    table[classes["forward"]], table[classes["backward"]] = forward_keeping_loss, backward_with_its_loss
    engine._INSTRUCTION_MAP = table
