"""The errors DeepSpeed pipeline jobs fail with, and what each one means.

Every pattern below was produced by real DeepSpeed 0.19.8 / torch 2.13 jobs on CPU/gloo (the
mistakes of chapter 25, the workbook's injected faults; tests/data/deepspeed_errors.json
keeps the texts they were matched against, and ``tests/integration/record_errors.py``
records them again), except NCCL's words for a lost neighbour (`PEER_FAILURE_TEXTS`).
`explain` matches the text a rank left — its error record (type, message, traceback) or, for
a rank that died in C++ without a Python error, the end of its log — and returns the first `Explanation` whose pattern fits: a stable `code`, the likely
cause and the fix, with the numbers the message carries filled in.

Some errors are *consequences*: a rank that loses its neighbour fails with "Connection closed
by peer". `Explanation.consequence` marks them, so a diagnosis looks for the rank that failed
first instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from utils.analysis.diagnosis import Symptom

__all__ = ["Explanation", "PATTERNS", "PEER_FAILURE_TEXTS", "Pattern", "engine_instruction_of", "explain",
           "timed_out"]


@dataclass(frozen=True)
class Pattern:
    code: str
    regex: str
    """Searched (``re.S``) in ``"<type>: <message>\\n<traceback or log>"``; named groups fill
    `cause` and `fix`."""
    cause: str
    fix: str
    consequence: bool = False
    """True: this rank failed because another one did (it is not the cause)."""


@dataclass(frozen=True)
class Explanation:
    code: str
    cause: str
    fix: str
    consequence: bool
    matched: str
    """The text the pattern matched (the evidence)."""


PEER_FAILURE_TEXTS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                      "ncclRemoteError", "NCCL communicator was aborted on rank")
"""What a rank's error says when a *neighbour* went away, not its own code: gloo's words (recorded
from real CPU jobs) and NCCL's. The NCCL texts are torch's own messages, read from the strings of
``libtorch_cuda.so`` of torch 2.11+cu130 on an H200 node (``ncclRemoteError: A call failed possibly
due to a network error or a remote process exiting prematurely.``; ``NCCL communicator was aborted
on rank N``): no job of two GPUs could produce them here."""

_TENSORS = ("make every stage return the same shape and dtype for every micro-batch and step (pad variable "
            "lengths to one size, cast to the model's dtype), or build the PipelineModule with dynamic_shape=True "
            "so DeepSpeed sends the shape before every transfer")

PATTERNS: tuple[Pattern, ...] = (
    Pattern("injected-fault", r"injected fault: stage (?P<stage>\d+) (?:fails at step (?P<step>\d+) in (?P<instr>\w+)"
                              r"|sends a tensor of the wrong (?P<what>\w+)|may allocate at most (?P<cap>[\d.]+) MB)",
            "a failure injected on purpose by the job's spec (JobSpec.fault)",
            "run the spec without fault=... (or with fault=None)"),
    Pattern("batch-arithmetic", r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* "
                                r"world_size (?P<batch>\d+) != (?P<micro>\d+) \* (?P<gas>\d+) \* (?P<dp>\d+)",
            "DeepSpeed asserts train_batch_size = micro-batch size × gradient_accumulation_steps (the micro-batch "
            "count) × data-parallel size; here {batch} ≠ {micro} × {gas} × {dp} ('world_size' in its message is "
            "the data-parallel size: ranks / stages)",
            "make the three agree: train_batch_size={micro}×{gas}×{dp}, or change micro_batches / micro_batch_size; "
            "JobSpec derives train_batch_size when it is None"),
    Pattern("zero-with-pipeline", r"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
            "the config asks for ZeRO stage 2 or 3, which shard gradients (and parameters) across data-parallel "
            "ranks; DeepSpeed's pipeline engine accumulates gradients over micro-batches itself and rejects them",
            "use zero_stage=0 or 1 (ZeRO-1 shards the optimizer state and works with pipelines)"),
    Pattern("empty-stage", r"optimizer got an empty parameter list",
            "this stage holds no layer with parameters: more stages than layers (DeepSpeed leaves a stage empty), "
            "or a partition that gave it only parameter-free layers",
            "use at most as many stages as layers with parameters, or boundaries that give every stage one"),
    Pattern("loss-not-scalar", r"loss must be a scalar tensor|grad can be implicitly created only for scalar outputs",
            "the last stage's output was used as the loss but is not a scalar: the PipelineModule has no loss_fn "
            "(DeepSpeed applies loss_fn on the last stage only, to its output and the labels)",
            "pass PipelineModule(loss_fn=...) and let the last layer return the logits, not a loss"),
    Pattern("scalar-between-stages", r"got input of size\s?\[\]",
            "this stage received a 0-dimensional tensor (a scalar): an earlier stage computed a loss or another "
            "reduction and sent it on; only the last stage computes the loss",
            "remove the loss from the middle of the layer list; give it to PipelineModule(loss_fn=...)"),
    Pattern("non-tensor-output", r"Could not send (?:meta|output of) type (?P<type><class '[^']+'>)"
                                 r"|_send_tensor_meta\n\s+assert isinstance\(tensor, torch\.Tensor\)",
            "a stage's output is not a tensor or a tuple of tensors ({type}): DeepSpeed can only send tensors "
            "between stages",
            "return a tensor or a tuple of tensors from every stage's last layer: dicts as tuples, numbers as "
            "tensors, no None"),
    Pattern("received-activation-without-grad", r"_exec_send_grads\n\s+assert (?:buffer|inputs)\.grad is not None",
            "DeepSpeed sets requires_grad=True on every floating-point tensor a stage receives and sends its "
            "gradient back; this stage received a float tensor that its layers never used for their output (a "
            "mask, a position table), so it has no gradient",
            "send such tensors as integer or bool tensors (DeepSpeed does not differentiate those), use them, or "
            "do not send them"),
    Pattern("output-without-grad", r"element \d+ of tensors does not require grad and does not have a grad_fn",
            "a stage's output has no autograd history (computed under torch.no_grad, .detach()ed, or rebuilt from "
            "numbers), so the backward cannot flow from the next stage into this one",
            "return tensors computed from the stage's input and parameters with autograd on"),
    Pattern("tied-weight-attr", r"_recursive_getattr.*AttributeError: '(?P<module>\w+)' object has no attribute "
                                r"'(?P<attr>\w+)'",
            "a TiedLayerSpec names tied_weight_attr '{attr}' (default 'weight'), which module {module} does not have",
            "give TiedLayerSpec the dotted path of the shared parameter, e.g. tied_weight_attr='tokens.weight'"),
    Pattern("tied-forward", r"Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                            r"Long, Int; but got torch\.\w*FloatTensor",
            "an embedding received float hidden states: a tied module (TiedLayerSpec) used a second time without "
            "forward_fn runs its own forward (the embedding) where the output projection was meant",
            "pass forward_fn to the second TiedLayerSpec, e.g. lambda emb, x: x @ emb.tokens.weight.t()"),
    Pattern("optimizer-state-mismatch", r"loaded state dict contains a parameter group that doesn't match the size "
                                        r"of optimizer's group",
            "a checkpoint's optimizer state was loaded into a stage whose parameters differ: DeepSpeed's "
            "load_checkpoint gives each stage the optimizer file of the stage with the same number and torch pairs "
            "its flat list by position; after a re-partition the parameter count differs (this error), and where "
            "it happens to match, the stage silently takes other layers' Adam moments",
            "after a re-partition load with load_optimizer_states=False and remap the state layer by layer "
            "(repartition_optimizer='remap'), or drop it explicitly ('drop')"),
    Pattern("tensor-mismatch", r"Received data size doesn't match expected size|op\.preamble\.length <= op\.nbytes\. "
                               r"(?P<got>\d+) vs (?P<expected>\d+)",
            "the tensor that arrived ({got} bytes) does not fit the receive buffer ({expected} bytes): DeepSpeed "
            "sends shapes and dtypes once, before the first transfer, and the sender's tensor changed shape or dtype "
            "since", _TENSORS),
    Pattern("dtype-mismatch", r"mixed dtype \(CPU\)|expected scalar type \w+ but found \w+|"
                              r"(?:mat1 and mat2|m1 and m2|both inputs) (?:must|to) have the same dtype|"
                              r"Input type \(\S+\) and weight type \(\S+\) should be the same",
            "a layer got an input whose dtype differs from its weights': the previous stage sent another dtype "
            "(float64, or fp32 into a bf16/fp16 stage)", _TENSORS),
    Pattern("shape-mismatch", r"Expected input batch_size \((?P<got>\d+)\) to match target batch_size "
                              r"\((?P<expected>\d+)\)",
            "the loss got outputs for {got} positions but labels for {expected}: a stage changed the shape of the "
            "activation it sent (the receiver allocates what the first transfer announced)", _TENSORS),
    Pattern("non-contiguous-output", r"input tensor has to be contiguous|Tensors must be contiguous",
            "a stage's output is a non-contiguous view (a slice, a transpose); point-to-point sends need contiguous "
            "memory", "return x.contiguous() from the stage's last layer"),
    Pattern("out-of-memory", r"can't allocate memory: you tried to allocate (?P<bytes>\d+) bytes|CUDA out of memory"
                             r"|OutOfMemoryError|MemoryError|Cannot allocate memory",
            "the rank needed more memory than it had: activations in flight (p - stage micro-batches in 1F1B, all m "
            "in GPipe), gradients and optimizer state of its layers",
            "activation checkpointing (activation_checkpoint_interval), a smaller micro_batch_size, 1F1B instead of "
            "GPipe, fewer layers on this stage, or more stages"),
    Pattern("timer-started-twice", r"(?P<timer>\w+) timer has already been started",
            "DeepSpeed started its '{timer}' timer a second time before stopping it: with wall_clock_breakdown on, "
            "a pipeline stage that is not the last starts bwd_microstep in _exec_backward_pass and again in the "
            "backward hook of the base engine (DeepSpeed 0.19.8; chapter 23.4), in the first backward of step 0; "
            "the flops profiler turns the same timers on",
            "set wall_clock_breakdown to false (and leave the flops profiler off) in a pipeline of 2 or more stages; "
            "time stages with the workbook's timeline instead"),
    Pattern("data-exhausted", r"^StopIteration: .*?in _next_batch\n\s+batch = next\(self\.data_iterator\)",
            "the data iterator given to train_batch ran out: each train_batch call takes gradient_accumulation_steps "
            "(the micro-batch count) batches from it on the first stage (inputs) and the last (labels), and a "
            "finite loader (a DataLoader's iterator) ends after len(loader) batches; the StopIteration leaves "
            "train_batch as it is, with an empty message",
            "wrap the loader in deepspeed.utils.RepeatingLoader (it starts the loader again when it ends), or give "
            "each train_batch call an iterator with at least micro_batches batches left (steps × micro_batches in "
            "all)"),
    Pattern("checkpoint-disk", r"CheckpointDiskError: .*?\((?P<what>(?:the checkpoint folder|the run directory) \S+ is not "
                               r"writable|no space left on the disk of \S+|not enough disk space for the restart-mode "
                               r"checkpoint)",
            "a restart-mode re-partition saves a checkpoint and loads it after the restart; it could not be saved: "
            "{what} (`utils.runtime.restart.save_checkpoint` checks the folder and the space before DeepSpeed "
            "writes, and removes what a failed save left)",
            "free space on that disk, run the job in another folder (run_job(..., directory=...) or "
            "WORKBOOK_RUNS), or re-partition with repartition_mode='live', which writes no checkpoint"),
    Pattern("peer-lost", "|".join(map(re.escape, PEER_FAILURE_TEXTS)),
            "a neighbouring rank went away (it failed or was stopped) while this one talked to it",
            "look at the rank that failed first", consequence=True),
    Pattern("collective-timeout", r"[Tt]imed out|Watchdog caught collective operation timeout",
            "a neighbour never answered within the process group's timeout (JobSpec.pg_timeout, else "
            "DEEPSPEED_TIMEOUT): it hung or died",
            "look at what the neighbour was doing (its status and stacks)", consequence=True),
)

_COMPILED = tuple((p, re.compile(p.regex, re.S)) for p in PATTERNS)


def explain(text: str) -> Explanation | None:
    """The first pattern matching `text` (an error's ``"type: message\\ntraceback"`` or a log),
    with its groups filled into cause and fix; None when nothing is known about it."""
    for pattern, regex in _COMPILED:
        match = regex.search(text)
        if match:
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            fill = _Filler(groups)
            return Explanation(pattern.code, pattern.cause.format_map(fill), pattern.fix.format_map(fill),
                               pattern.consequence, match.group(0).strip()[:300])
    return None


_EXEC = re.compile(r"in (_exec_\w+)")


def engine_instruction_of(traceback_text: str) -> str | None:
    """The pipeline instruction a traceback went through (its innermost DeepSpeed ``_exec_*``),
    ``"setup"`` when it failed while the engine was being built, else None."""
    from utils.jobs.stacks import ENGINE_METHODS

    found = [ENGINE_METHODS[m] for m in _EXEC.findall(traceback_text) if m in ENGINE_METHODS]
    if found:
        return found[-1]
    if re.search(r"in (initialize|build_engine|build_module|__init__)\b", traceback_text):
        return "setup"
    return None


def timed_out(victim: Symptom, suspects: dict[int, dict]) -> tuple[str, list[Symptom]]:
    """The findings of a ``collective-timeout``: a rank gave up waiting (the process group's
    timeout came before the job's own). Each rank it waited for that raised nothing and did not
    finish is a suspect (``hang``), first; the rank that timed out follows, as the consequence it
    is. `suspects`: rank -> ``where`` (a `Where` from its status slot), ``doing`` (the slot's
    text) and ``for_s`` (how long it had been in that instruction when the other gave up). Told
    from status slots only: the launcher collects stacks when the job's own timeout ends it.
    Returns the diagnosis's headline and its findings."""
    w = victim.where
    took = {r: f" for {s['for_s']:.0f} s" if s["for_s"] is not None else "" for r, s in suspects.items()}
    found = [Symptom(
        code="hang", where=s["where"],
        what=f"rank {r} (stage {s['where'].stage}) never answered rank {w.rank}'s {w.instruction}: it had been in "
             f"{s['where'].instruction}{took[r]} when rank {w.rank} gave up, and raised nothing",
        evidence={"doing": s["doing"], "for_s": s["for_s"], "waited_for_by": w.rank},
        cause=f"rank {w.rank} waited in {w.instruction} for it longer than the process group's timeout and raised "
              f"the timeout; rank {r} never reached its side of that operation: stuck in "
              f"{s['where'].instruction} (its own code, or one instruction slower than the timeout)",
        fix="run it again with pg_timeout=None (or longer than JobSpec.timeout): the job's own timeout then "
            "collects every rank's stack, and utils.diagnose names the frame it is stuck in")
        for r, s in suspects.items()]
    if not found:
        return f"rank {w.rank} (stage {w.stage}) failed first: {victim.what}", [victim]
    return (f"rank {w.rank} (stage {w.stage}) timed out in {w.instruction} waiting for rank(s) {sorted(suspects)}",
            [*found, replace(victim, severity="info")])


class _Filler(dict):
    """Format fields a match left empty read as "?" instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"
