"""Record every pipeline instruction a DeepSpeed engine executes, without copying its code.

`PipelineEngine._exec_schedule` looks each instruction up in ``self._INSTRUCTION_MAP`` and
binds it to the engine. Giving the engine *instance* its own map of wrapped functions
records every instruction (kind, micro-batch, start, end) while the class stays untouched.
DeepSpeed's own ``wall_clock_breakdown`` timers cannot do this: they crash every stage but the
last in 0.19.8 and know nothing of micro-batches.

Clocks: on CPU the host's monotonic clock; on GPU a pair of CUDA events per instruction,
resolved once per step. The CUDA clock synchronizes twice per step, never between
instructions: at the step's start (so its origin event and the host time read beside it
coincide) and at its end, before reading the events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from utils.timeline import KIND_OF_INSTRUCTION, STEP_KINDS, Event

if TYPE_CHECKING:
    from utils.jobs.rundir import StatusSlot


class HostClock:
    """Host monotonic time; marks are already seconds."""

    def begin_step(self) -> None:
        pass

    def mark(self) -> float:
        return time.perf_counter()

    def resolve(self, marks: list) -> list[float]:
        return marks


class CudaClock:
    """CUDA events on the current stream; converted to host seconds once per step.

    At the start of a step the device is idle (the previous step ended with a synchronize),
    so an origin event recorded then fires at the host time read next to it. Every other
    event is placed relative to that origin with `Event.elapsed_time`.
    """

    def __init__(self):
        import torch

        self._torch = torch
        self._origin_host = 0.0
        self._origin = torch.cuda.Event(enable_timing=True)

    def begin_step(self) -> None:
        self._torch.cuda.synchronize()  # the step's first synchronize: the device is idle now
        self._origin.record()
        self._origin_host = time.perf_counter()

    def mark(self):
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def resolve(self, marks: list) -> list[float]:
        self._torch.cuda.synchronize()  # the step's second and last synchronize
        return [self._origin_host + self._origin.elapsed_time(m) / 1e3 for m in marks]


class InstructionTracer:
    """Wraps one engine instance's instruction map and collects `Event`s per step.

    `before` (optional) is called with (step, kind, micro_batch) as each instruction starts;
    the job uses it to inject faults on purpose. `after` (optional) is called as each traced
    instruction ends (the job samples its memory there, `utils.runtime.memory`).

    Install it *after* anything else that changes the engine's instruction map (the schedule
    lowering stashes the last stage's losses there): it wraps the map it finds, so it times
    exactly what runs. An instruction outside `KIND_OF_INSTRUCTION` (say DeepSpeed's own
    ``CommitP2P`` of `DualPipeVEngine`) still runs, untraced, and shows in the status slot
    by its class name.
    """

    def __init__(self, engine, *, stage: int, rank: int, clock, status: StatusSlot | None = None,
                 before: Callable[[int, str, int | None], None] | None = None,
                 after: Callable[[], None] | None = None):
        self.engine = engine
        self.stage, self.rank = stage, rank
        self.clock = clock
        self.status = status
        self.before, self.after = before, after
        self.origin = 0.0
        self.step = -1
        self._pending: list[tuple[str, int | None, object, object]] = []
        self._counts: dict[str, int] = {}
        self._untraced = dict(engine._INSTRUCTION_MAP)  # instance map if one was set, else class map
        self._traced = {cls: self._wrap(fn, KIND_OF_INSTRUCTION[cls.__name__])
                        if cls.__name__ in KIND_OF_INSTRUCTION else self._pass_through(fn, cls.__name__)
                        for cls, fn in self._untraced.items()}
        self.enable(True)

    def enable(self, on: bool) -> None:
        """Switch tracing on or off between steps (the overhead benchmark alternates)."""
        self.engine._INSTRUCTION_MAP = self._traced if on else self._untraced

    def set_origin(self, origin: float) -> None:
        """Host time that becomes t = 0 (taken right after a barrier on every rank)."""
        self.origin = origin

    def _wrap(self, fn, kind: str):
        tracer = self

        def traced(engine, **kwargs):
            # The n-th instruction of a kind within a step serves micro-batch n: exact for
            # DeepSpeed's TrainSchedule and for GPipe, whereas buffer_id = mb % num_buffers
            # is ambiguous.
            if kind in STEP_KINDS:
                micro_batch = None
            else:
                micro_batch = tracer._counts.get(kind, 0)
                tracer._counts[kind] = micro_batch + 1
            if tracer.status is not None:
                tracer.status.write(step=tracer.step, doing=kind, micro_batch=micro_batch)
            if tracer.before is not None:
                tracer.before(tracer.step, kind, micro_batch)
            start = tracer.clock.mark()
            fn(engine, **kwargs)
            tracer._pending.append((kind, micro_batch, start, tracer.clock.mark()))
            if tracer.after is not None:
                tracer.after()

        return traced

    def _pass_through(self, fn, name: str):
        tracer = self

        def untraced(engine, **kwargs):
            if tracer.status is not None:
                tracer.status.write(step=tracer.step, doing=name, untraced=True)
            fn(engine, **kwargs)

        return untraced

    def begin_step(self, step: int) -> None:
        self.step = step
        self._counts.clear()
        self._pending.clear()
        self.clock.begin_step()

    def end_step(self) -> list[Event]:
        """Resolve this step's marks into events (seconds from the origin)."""
        marks = [m for _, _, start, end in self._pending for m in (start, end)]
        times = self.clock.resolve(marks)
        events = [Event(stage=self.stage, rank=self.rank, step=self.step, kind=kind, micro_batch=mb,
                        start=times[2 * i] - self.origin, end=times[2 * i + 1] - self.origin)
                  for i, (kind, mb, _, _) in enumerate(self._pending)]
        self._pending.clear()
        if self.status is not None:
            self.status.write(step=self.step, doing="finished")
        return events
