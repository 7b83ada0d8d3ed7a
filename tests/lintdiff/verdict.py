"""Two verdicts per case, in one vocabulary, and whether they agree.

DeepSpeed's verdict comes from what really happened (`tests.lintdiff.world`):
``rejects`` — it failed in ``deepspeed.initialize`` or in the first ``train_batch()`` (or the
world crashed); ``differs`` — it ran, but a fact the engine reports is not what the config
writes (or what a misspelt key meant, the case's `intent`), a top-level key was never looked
up in the run, or the pipeline got fewer micro-batches than stages from a count the config
does not write; ``as-written`` — it ran and
every written value it has a fact for is what the engine uses.

The linter's verdict: ``rejects`` when it reports an error, ``differs`` when it reports only
warnings, ``as-written`` when it reports nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: dotted config key -> the engine fact (`world.engine_facts`) it sets.
WRITTEN_FACTS = {
    "train_batch_size": "train_batch_size",
    "train_micro_batch_size_per_gpu": "micro_batch_size",
    "gradient_accumulation_steps": "micro_batches",
    "zero_optimization.stage": "zero_stage",
    "fp16.enabled": "fp16",
    "bf16.enabled": "bf16",
    "bfloat16.enabled": "bf16",
    "optimizer.params.betas": "betas",
    "optimizer.params.eps": "eps",
    "optimizer.params.weight_decay": "weight_decay",
    "gradient_clipping": "gradient_clipping",
    "steps_per_print": "steps_per_print",
    "wall_clock_breakdown": "wall_clock_breakdown",
    "prescale_gradients": "prescale_gradients",
    "gradient_predivide_factor": "gradient_predivide_factor",
    "communication_data_type": "communication_data_type",
    "pipeline.pipe_partitioned": "pipe_partitioned",
    "pipeline.grad_partitioned": "grad_partitioned",
    "pipeline.activation_checkpoint_interval": "activation_checkpoint_interval",
    "scheduler.type": "scheduler",
    "zero_optimization.overlap_comm": "zero_overlap_comm",
}
DTYPES = {"fp32": "torch.float32", "float32": "torch.float32", "float": "torch.float32", "fp16": "torch.float16",
          "float16": "torch.float16", "half": "torch.float16", "bf16": "torch.bfloat16", "bfloat16": "torch.bfloat16"}
Verdict = str  # "rejects" | "differs" | "as-written"


@dataclass(frozen=True)
class Judged:
    deepspeed: Verdict
    linter: Verdict
    why: tuple[str, ...]
    """What DeepSpeed did: its error, or each fact that is not what the config says."""

    @property
    def agree(self) -> bool:
        return self.deepspeed == self.linter


def _get(config: dict, path: str):
    node: Any = config
    for name in path.split("."):
        if not isinstance(node, dict) or name not in node:
            return _MISSING
        node = node[name]
    return node


_MISSING = object()


def _coerced(value: Any, like: Any) -> Any:
    """`value` as written, read as the type of the fact `like` (``"true"`` as True, ``"4"``
    as 4); `_MISSING` when it has no such reading (``"auto"``, None)."""
    if isinstance(like, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        return _MISSING
    if isinstance(like, (int, float)):
        try:
            return float(value)
        except (TypeError, ValueError):
            return _MISSING
    return value


def _same(want: Any, got: Any) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        try:
            return math.isclose(float(want), float(got), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(want) == len(got) and all(_same(a, b) for a, b in zip(want, got))
    return want == got


def expected(config: dict, intent: dict, facts: dict) -> dict[str, tuple[str, Any]]:
    """fact -> (where the expectation comes from, the value the config asks for)."""
    out: dict[str, tuple[str, Any]] = {}
    for path, fact in WRITTEN_FACTS.items():
        value = _get(config, path)
        if value is _MISSING or fact not in facts:
            continue
        if fact == "communication_data_type":
            value = DTYPES.get(str(value), _MISSING) if value is not None else _MISSING
        else:
            value = _coerced(value, facts[fact])
        if value is not _MISSING:
            out[fact] = (path, value)
    fp16 = _get(config, "fp16.enabled")
    scale = _get(config, "fp16.loss_scale")
    if fp16 is True and isinstance(scale, (int, float)) and scale > 0:
        out["loss_scale"] = ("fp16.loss_scale", float(scale))
    lr = _get(config, "optimizer.params.lr")
    if isinstance(lr, (int, float)) and _get(config, "scheduler") is _MISSING:
        out["lr"] = ("optimizer.params.lr", float(lr))
    reentrant = _get(config, "pipeline.use_reentrant")
    if reentrant is not _MISSING and _coerced(reentrant, True) is not _MISSING:
        out["checkpoint_function"] = ("pipeline.use_reentrant",
                                      "checkpoint" if _coerced(reentrant, True) else "non_reentrant_checkpoint")
    section = _get(config, "activation_checkpointing")
    if isinstance(section, dict) and any(v is True for v in section.values()):
        out["checkpointing_configured"] = ("activation_checkpointing", True)
    for fact, value in intent.items():
        out[fact] = ("intent", value)
    return out


def deepspeed_verdict(case: dict) -> tuple[Verdict, tuple[str, ...]]:
    """What DeepSpeed did with `case` (a recorded case: its config, world, intent and outcome)."""
    result = case["outcome"]
    if result["phase"] != "done":
        error = result["error"] or {}
        return "rejects", (f"{result['phase']}: {error.get('type')}: {error.get('message', '')[:160]}",)
    facts = dict(result["facts"])
    facts.setdefault("schedule", "1f1b")  # the engine's TrainSchedule, whatever the config says
    facts.setdefault("partition", "uniform")  # the module's partition_method, which the config cannot set
    why = []
    for fact, (source, want) in expected(case["config"], case["intent"], facts).items():
        got = facts.get(fact)
        if not _same(want, got):
            why.append(f"{fact}: {source} asks for {want!r}, the engine has {got!r}")
    for key in facts.get("unread_top_level", ()):
        why.append(f"{key}: DeepSpeed never looked it up (initialize and the first step)")
    if "gradient_accumulation_steps" not in case["config"] and facts["micro_batches"] < case["num_stages"]:
        why.append(f"micro_batches: derived {facts['micro_batches']} < {case['num_stages']} stages")
    return ("differs" if why else "as-written"), tuple(why)


def linter_verdict(findings) -> Verdict:
    if any(f.severity == "error" for f in findings):
        return "rejects"
    return "differs" if findings else "as-written"


def judge(case: dict, findings) -> Judged:
    deepspeed, why = deepspeed_verdict(case)
    return Judged(deepspeed, linter_verdict(findings), why)


#: Cases where the linter and DeepSpeed disagree, each with why the linter cannot (or does not
#: yet) say what DeepSpeed does. The agreement test prints them and fails on one not listed
#: here, or listed and no longer disagreeing.
KNOWN_DISAGREEMENTS: dict[str, str] = {}


def judge_all(data: dict) -> list[tuple[dict, Judged]]:
    """Every recorded case of `data` (tests/data/lint_outcomes.json) with both verdicts."""
    from utils.jobs.configlint import lint_config

    out = []
    for case in data["cases"]:
        findings = lint_config(case["config"], num_stages=case["num_stages"], data_parallel=case["data_parallel"],
                               device="cpu")
        out.append((case, judge(case, findings)))
    return out


def summary(judged: list[tuple[dict, Judged]]) -> str:
    """The agreement line that docs/config-lint.md quotes."""
    agree = sum(j.agree for _, j in judged)
    return f"Agreement: {agree} of {len(judged)} configs ({100 * agree / len(judged):.1f} %)"
