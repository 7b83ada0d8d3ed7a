"""Failures injected on purpose (`JobSpec.fault`), to practise troubleshooting and to test
that the launcher copes. A fault lives on one rank: replica `fault.replica` of `fault.stage`.

How each kind is made (`FaultInjector`):

- ``raise``, ``hang``, ``exit``, ``killed``, ``collective``: as `fault.instruction` starts in `fault.step`
  (its first micro-batch), from the tracer's `before` callback, so the status slot already
  names the instruction when the rank fails or blocks.
- ``slow``: every forward and backward from `fault.step` on sleeps ``factor - 1`` times its
  own duration right after it ran, inside the interval the tracer times: the timeline shows
  a rank whose compute takes `factor` times as long, as a slower or throttled device would
  (on CUDA the duration is measured after a synchronize).
- ``mismatch``: at `fault.step` the first micro-batch's tensor the rank sends — the
  activation to the next stage (instruction ``"forward"``) or the gradient to the previous
  one (``"backward"``) — is one position longer or float64. DeepSpeed exchanges shapes and
  dtypes once, before the first send (unless ``dynamic_shape``), so the receiver fails with
  gloo's or torch's own error, as it does when a stage's output changes shape: at step 0 in
  its forward or loss (it allocated what the first send announced), later in its receive
  (gloo: "Received data size doesn't match expected size", the rank aborts). A *shorter*
  tensor would not fail at all on gloo: it fills the front of the larger buffer and the rest
  keeps stale data, silently.
- ``exhausted``: as `fault.step` starts (its first ``LoadMicroBatch``) the engine's data
  iterator is swapped for an empty one, so DeepSpeed's own ``next(self.data_iterator)`` in
  ``PipelineEngine._next_batch`` raises ``StopIteration``, as a finite loader does when a
  ``train_batch`` call needs more micro-batches than it has left.
- ``memory``: from `fault.step` on the rank may allocate `fault.cap_mb` MB more than it
  holds then. On CPU the cap is a limit on its address space (``RLIMIT_AS``: the size it
  has + the cap), on CUDA ``torch.cuda.set_per_process_memory_fraction``: a bigger
  allocation fails with the allocator's own out-of-memory error in that rank, never the
  machine's out-of-memory killer. The cap is lifted as soon as something fails, so the rank
  can still record its error.

The injector wraps the engine's instruction map *before* the tracer does (the tracer wraps
what it finds), so a slowed forward is timed as one longer forward.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from utils.timeline import KIND_OF_INSTRUCTION

if TYPE_CHECKING:
    from utils.jobs.spec import Fault, JobSpec

STRIKING = ("raise", "hang", "exit", "killed", "collective")
"""Kinds that strike once, as an instruction starts."""
SLOWED = ("forward", "backward")
"""Instruction kinds a ``slow`` fault stretches."""

_cap: dict[str, object] = {}
"""The memory cap in force in this process (``limit`` and how to lift it), if any: one per
process, whatever engine (a re-partition builds a new one) the rank trains on."""


def fault_injector(spec: JobSpec, stage: int, replica: int, device: str) -> FaultInjector | None:
    """The injector of `spec.fault` if it strikes this rank (stage, data-parallel replica), or None."""
    fault = spec.fault
    if fault is None or stage != fault.stage or replica != fault.replica:
        return None
    return FaultInjector(fault, stage, device)


class FaultInjector:
    """Injects one `Fault` on this rank: `install` wraps an engine's instructions (before the
    tracer is installed), `before` is the tracer's callback as each instruction starts."""

    def __init__(self, fault: Fault, stage: int, device: str):
        self.fault, self.stage, self.device = fault, stage, device
        self.step, self.kind, self.micro_batch = -1, "", None

    # --- the tracer's callback --------------------------------------------------------------------
    def before(self, step: int, kind: str, micro_batch: int | None) -> None:
        self.step, self.kind, self.micro_batch = step, kind, micro_batch
        fault = self.fault
        if fault.kind == "memory" and step >= fault.step and "limit" not in _cap:
            self._set_cap()
        if fault.kind in STRIKING and step == fault.step and kind == fault.instruction and micro_batch in (None, 0):
            self._strike(step, kind)

    def _strike(self, step: int, kind: str) -> None:
        if self.fault.kind == "collective":  # an all-reduce no other rank joins: it ends only in its timeout
            import torch
            from deepspeed import comm as dist

            print(f"injected fault: stage {self.stage} enters an all_reduce over every rank alone at step {step} "
                  f"in {kind}", flush=True)
            dist.all_reduce(torch.zeros(1, device="cuda" if self.device == "cuda" else "cpu"))
            return
        message = f"injected fault: stage {self.stage} fails at step {step} in {kind}"
        if self.fault.kind == "raise":
            raise RuntimeError(message)
        print(message, flush=True)
        if self.fault.kind == "exit":
            os._exit(3)
        if self.fault.kind == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # "hang": block like a rank stuck in a collective
            time.sleep(3600)

    # --- wrapping the engine's instructions ------------------------------------------------------
    def install(self, engine) -> None:
        """Wrap the instructions this fault changes on `engine` (its instance map)."""
        kind = self.fault.kind
        if kind in STRIKING:
            return
        mapping = dict(engine._INSTRUCTION_MAP)
        for cls, fn in mapping.items():
            name = KIND_OF_INSTRUCTION.get(cls.__name__)
            if kind == "slow" and name in SLOWED:
                mapping[cls] = self.slowed(fn)
            elif kind == "mismatch" and name == ("send_act" if self.fault.instruction == "forward" else "send_grad"):
                mapping[cls] = self._mismatched(fn, name)
            elif kind == "memory":
                mapping[cls] = _lifting_cap_on_failure(fn)
            elif kind == "exhausted" and name == "load":
                mapping[cls] = self._exhausting(fn)
        engine._INSTRUCTION_MAP = mapping

    def slowed(self, fn):
        """`fn` (an instruction, or a torch stage's compute call) stretched `factor` times from
        the fault's step on: it sleeps ``factor - 1`` times its own duration right after it ran."""
        injector, factor = self, self.fault.slowdown

        def slowed(*args, **kwargs):
            if injector.step < injector.fault.step:
                return fn(*args, **kwargs)
            started = time.perf_counter()
            out = fn(*args, **kwargs)
            if injector.device == "cuda":
                import torch

                torch.cuda.synchronize()
            time.sleep((factor - 1.0) * (time.perf_counter() - started))
            return out

        return slowed

    def _exhausting(self, fn):
        injector = self

        def exhausting(engine, **kwargs):
            if injector.step == injector.fault.step and injector.micro_batch in (None, 0):
                print(f"injected fault: stage {injector.stage}'s data loader is empty at step {injector.step}",
                      flush=True)
                engine.data_iterator = iter(())  # train_batch set it from data_iter as the step began
            return fn(engine, **kwargs)

        return exhausting

    def _mismatched(self, fn, name: str):
        injector = self

        def mismatched(engine, **kwargs):
            if injector.step != injector.fault.step or injector.micro_batch != 0:
                return fn(engine, **kwargs)
            buffers = engine.pipe_buffers["outputs" if name == "send_act" else "inputs"]
            buffer_id = kwargs["buffer_id"]
            kept = buffers[buffer_id]
            buffers[buffer_id] = (_wrong_activation if name == "send_act" else _wrong_gradient)(
                kept, injector.fault.tensor or "shape")
            print(f"injected fault: stage {injector.stage} sends a tensor of the wrong "
                  f"{injector.fault.tensor or 'shape'} in {name} at step {injector.step}", flush=True)
            try:
                fn(engine, **kwargs)
            finally:
                if name == "send_act":  # DeepSpeed frees the inputs itself after send_grad
                    buffers[buffer_id] = kept

        return mismatched

    def _set_cap(self) -> None:
        cap = int(self.fault.cap_mb * 2**20)
        if self.device == "cuda":
            import torch

            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            held = torch.cuda.memory_reserved()
            torch.cuda.set_per_process_memory_fraction(min(1.0, (held + cap) / total))
            _cap.update(limit=held + cap, lift=lambda: torch.cuda.set_per_process_memory_fraction(1.0))
        else:
            import resource

            import psutil

            held = psutil.Process().memory_info().vms
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = held + cap if hard == resource.RLIM_INFINITY else min(hard, held + cap)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
            _cap.update(limit=limit, lift=lambda: resource.setrlimit(resource.RLIMIT_AS, (soft, hard)))
        print(f"injected fault: stage {self.stage} may allocate at most {self.fault.cap_mb:g} MB more from step "
              f"{self.step} on ({held / 2**20:.0f} MB held now; limit {_cap['limit'] / 2**20:.0f} MB)", flush=True)


def lift_memory_cap() -> None:
    """End an injected memory cap (after a failure, so the rank can record it); idempotent."""
    lift = _cap.pop("lift", None)
    if callable(lift):
        lift()


def _lifting_cap_on_failure(fn):
    def guarded(engine, **kwargs):
        try:
            return fn(engine, **kwargs)
        except BaseException:
            lift_memory_cap()
            raise

    return guarded


def _wrong(tensor, what: str):
    """`tensor` one position longer along its second axis (its first if it has only one: the
    last position repeated), or as float64. Longer, not shorter: gloo fills a receive buffer
    larger than the message without complaint (the rest keeps stale data), a silent error
    no diagnosis could name."""
    import torch

    if what == "dtype":
        return tensor.to(torch.float32 if tensor.dtype == torch.float64 else torch.float64)
    axis = 1 if tensor.dim() >= 2 else 0
    return torch.cat([tensor, tensor.narrow(axis, tensor.shape[axis] - 1, 1)], dim=axis).contiguous()


def _wrong_activation(outputs, what: str):
    """The output buffer of a forward with its (first floating) tensor made wrong."""
    if isinstance(outputs, tuple):
        at = next((i for i, t in enumerate(outputs) if t.is_floating_point()), 0)
        return (*outputs[:at], _wrong(outputs[at], what).detach(), *outputs[at + 1:])
    return _wrong(outputs, what).detach()


def _wrong_gradient(inputs, what: str):
    """An input buffer whose (first floating) tensor carries a wrong ``.grad`` (what
    DeepSpeed's send_grad sends back)."""
    def carrier(tensor):
        wrong = _wrong(tensor.grad if tensor.grad is not None else tensor.detach(), what)
        leaf = wrong.detach().clone().requires_grad_(True)
        leaf.grad = wrong
        return leaf

    if isinstance(inputs, tuple):
        at = next((i for i, t in enumerate(inputs) if t.is_floating_point()), 0)
        return (*inputs[:at], carrier(inputs[at]), *inputs[at + 1:])
    return carrier(inputs)
