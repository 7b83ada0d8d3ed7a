"""`lint_config` on the seed's snippet, DeepSpeed's own config templates, misspellings and the
engines' own rules (the whole corpus against DeepSpeed's recorded verdicts: test_lint_agreement.py)."""

import glob
import json
import os

import pytest

from utils.jobs.configlint import deepspeed_reads, lint_config, pipeline_keys

SEED = {"train_batch_size": 64, "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1},
        "pipeline": {"pipe_parallel_size": 4, "micro_batch_size": 8, "schedule": "1F1B"}}


#: every config below trains with torch's AdamW: without an optimizer DeepSpeed fails the first step
ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}


def _keys(findings, severity=None):
    return {f.key for f in findings if severity in (None, f.severity)}


def test_the_seed_snippet_is_told_what_deepspeed_ignores_and_rejects():
    findings = lint_config(SEED, num_stages=4)
    # DeepSpeed runs past the three misplaced keys (warnings: what the job really does) ...
    assert _keys(findings, "warning") == {"pipeline.pipe_parallel_size", "pipeline.micro_batch_size",
                                          "pipeline.schedule"}
    fixes = {f.key: f.fix for f in findings}
    assert "PipelineModule(num_stages" in fixes["pipeline.pipe_parallel_size"]
    assert "train_micro_batch_size_per_gpu" in fixes["pipeline.micro_batch_size"]
    assert "4 stages" in next(f.message for f in findings if f.key == "pipeline.pipe_parallel_size")
    # ... and stops at ZeRO-1 without an optimizer
    assert _keys(findings, "error") == {"optimizer"}


def test_the_seeds_batch_values_are_derived_as_deepspeed_derives_them():
    """64 // 3 // 8 = 2 per micro-batch, then DeepSpeed's own assertion 64 != 2 × 8 × 3."""
    errors = [f for f in lint_config({"train_batch_size": 64, "gradient_accumulation_steps": 8},
                                     num_stages=4, data_parallel=3) if f.severity == "error"]
    # DeepSpeed stops at the batch sizes; the linter goes on and lists the next problem too
    assert [f.key for f in errors] == ["optimizer", "train_batch_size"]
    finding = errors[1]
    assert "64 != 2 * 8 * 3" in finding.message
    assert "multiple of 24" in finding.fix
    assert [f for f in lint_config({"train_batch_size": 48, "gradient_accumulation_steps": 8, **ADAM},
                                   num_stages=4, data_parallel=3) if f.severity == "error"] == []


@pytest.mark.parametrize("written", [(8, 2, None), (8, None, 4), (8, 2, 4), (None, 2, 4), (8, None, None),
                                     (None, 2, None), (13, 2, None), (13, None, 2), (3, 2, None)])
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_derived_batch_is_deepspeeds_derivation(written, replicas):
    from utils.jobs.configlint import parse
    from utils.jobs.configrules import derived_batch

    config = {k: v for k, v in zip(("train_batch_size", "train_micro_batch_size_per_gpu",
                                    "gradient_accumulation_steps"), written) if v is not None}
    parsed, error = parse(config, replicas)
    mine = derived_batch(*written, replicas)
    if parsed is not None:
        assert mine == (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu,
                        parsed.gradient_accumulation_steps)
    else:  # DeepSpeed's assertion: what it derived does not multiply back to the total
        assert mine[1] * mine[2] * replicas != mine[0] or mine[1] == 0, error


def test_deepspeeds_own_templates_are_clean():
    import deepspeed

    templates = glob.glob(os.path.join(os.path.dirname(deepspeed.__file__), "autotuning", "config_templates", "*.json"))
    assert templates
    for path in templates:
        with open(path) as f:  # templates the autotuner completes: no batch sizes, stage 2/3 for non-pipelines
            assert not [f for f in lint_config(json.load(f)) if "ignores it silently" in f.message], path


def test_every_key_deepspeed_reads_is_accepted():
    """Each top-level key DeepSpeed looks up, set to the value it would default to, is never
    called unknown (the vocabulary is DeepSpeed's, read at run time)."""
    read, _, _ = deepspeed_reads({"train_batch_size": 1})
    assert {"train_batch_size", "gradient_accumulation_steps", "zero_optimization", "pipeline", "optimizer",
            "scheduler", "fp16", "bf16", "activation_checkpointing"} <= read
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "steps_per_print": 10, "wall_clock_breakdown": False, "gradient_clipping": 1.0,
              "prescale_gradients": False, "zero_optimization": {"stage": 1, "overlap_comm": False},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
              "pipeline": {"activation_checkpoint_interval": 1, "pipe_partitioned": False}}
    assert lint_config(config, num_stages=2) == []


@pytest.mark.parametrize("config, key, suggestion", [
    ({"train_batch_size": 8, "gradient_acumulation_steps": 2}, "gradient_acumulation_steps",
     "gradient_accumulation_steps"),
    ({"train_batch_size": 8, "steps_per_prnt": 10}, "steps_per_prnt", "steps_per_print"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 1, "overlap_com": True}}, "overlap_com",
     "overlap_comm"),
    ({"train_batch_size": 8, "pipeline": {"activation_checkpoint_intervall": 1}},
     "pipeline.activation_checkpoint_intervall", "activation_checkpoint_interval"),
])
def test_misspelled_keys_get_a_did_you_mean(config, key, suggestion):
    findings = [f for f in lint_config(config) if f.key.endswith(key)]
    assert findings and suggestion in findings[0].fix, lint_config(config)


def test_batch_zero_and_precision_rules():
    batch = lint_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                         "gradient_accumulation_steps": 4, **ADAM}, data_parallel=1)
    assert [f.key for f in batch] == ["train_batch_size"] and "set train_batch_size to 16" in batch[0].fix
    assert lint_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 4, **ADAM}, data_parallel=2) == []
    adam = ADAM["optimizer"]
    zero = lint_config({"train_batch_size": 8, "zero_optimization": {"stage": 2}, "optimizer": adam}, num_stages=2)
    assert _keys(zero, "error") == {"zero_optimization.stage"}
    assert _keys(lint_config({"train_batch_size": 8, "zero_optimization": {"stage": "1"}, "optimizer": adam})) == set()
    both = lint_config({"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert _keys(both, "error")
    on_cpu = lint_config({"train_batch_size": 8, "fp16": {"enabled": True}, **ADAM}, device="cpu")
    assert _keys(on_cpu, "error") == {"fp16"}
    assert lint_config({"train_batch_size": 8, "fp16": {"enabled": True}, **ADAM}) == []
    assert _keys(lint_config({"train_batch_size": 8})) == {"optimizer"}  # no optimizer: the first step fails


def test_engine_rules_come_from_deepspeeds_code():
    """The pipeline section's value rules are PipelineEngine.__init__'s own assertions and
    comparisons; the optimizer and the scheduler are built with the classes DeepSpeed picks."""
    from utils.jobs.configrules import pipeline_value_rules

    rules = {(r.key, r.kind) for r in pipeline_value_rules()}
    assert {("pipe_partitioned", "isinstance"), ("grad_partitioned", "isinstance"),
            ("activation_checkpoint_interval", "order"), ("use_reentrant", "identity")} <= rules
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, **ADAM}
    typed = lint_config({**base, "pipeline": {"pipe_partitioned": "true"}}, num_stages=2)
    assert _keys(typed, "error") == {"pipeline.pipe_partitioned"} and "isinstance" in typed[0].message
    reentrant = lint_config({**base, "pipeline": {"use_reentrant": "false"}}, num_stages=2)
    assert _keys(reentrant, "warning") == {"pipeline.use_reentrant"}
    momentum = lint_config({**base, "optimizer": {"type": "Adam", "params": {"momentum": 0.9, "torch_adam": True}}})
    assert _keys(momentum, "error") == {"optimizer"} and "momentum" in momentum[0].message
    schedule = lint_config({**base, "scheduler": {"type": "WarmupLR", "params": {"warmup_max": 1e-3}}})
    assert _keys(schedule, "error") == {"scheduler"} and "warmup_max" in schedule[0].message
    clock = lint_config({**base, "wall_clock_breakdown": True}, num_stages=2)
    assert _keys(clock, "error") == {"wall_clock_breakdown"}
    assert lint_config({**base, "wall_clock_breakdown": True}, num_stages=1) == []
    few = lint_config({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, **ADAM}, num_stages=4)
    assert _keys(few) == {"gradient_accumulation_steps"} and "75%" in few[0].message


def test_an_activation_checkpointing_section_that_asks_anything_is_inert_and_its_typos_still_named():
    base = {"train_batch_size": 8, "gradient_accumulation_steps": 4, **ADAM}
    for asks in ({"cpu_checkpointing": "true"}, {"number_checkpoints": 4}, {"partition_activations": True}):
        (inert,) = lint_config({**base, "activation_checkpointing": asks}, num_stages=2)
        assert (inert.key, inert.severity) == ("activation_checkpointing", "warning")
        assert "deepspeed.checkpointing.configure(" in inert.fix
    assert lint_config({**base, "activation_checkpointing": {"cpu_checkpointing": False}}, num_stages=2) == []
    typo = lint_config({**base, "activation_checkpointing": {"partition_activation": True}}, num_stages=2)
    assert [f.key for f in typo] == ["activation_checkpointing.partition_activation"]
    assert "did you mean 'activation_checkpointing.partition_activations'?" == typo[0].fix


def test_a_curriculum_block_deepspeed_passes_on_whole_is_clean():
    from tests.lintdiff.corpus import CURRICULUM, base

    assert lint_config(base(data_efficiency=CURRICULUM), num_stages=2) == []


def test_pipeline_keys_come_from_deepspeeds_code():
    known, unused = pipeline_keys()
    assert {"activation_checkpoint_interval", "pipe_partitioned", "grad_partitioned", "use_reentrant"} <= known
    assert "stages" in unused  # in DeepSpeed's defaults, read by nothing: PipelineModule(num_stages=) decides
    stages = lint_config({"train_batch_size": 8, "pipeline": {"stages": 4}, **ADAM})
    assert lint_config({"train_batch_size": 8, "pipeline": {"stages": "auto"}, **ADAM}) == []  # DeepSpeed's default
    assert [(f.key, f.severity) for f in stages] == [("pipeline.stages", "warning")]
    assert "PipelineModule" in stages[0].fix


@pytest.mark.parametrize("section, warned", [({"enabled": False}, True), ({}, True), ({"enabled": True}, False),
                                             ({"enabled": False, "verbose": True}, True)])
def test_a_comms_logger_section_is_on_whatever_its_enabled_says(section, warned):
    from deepspeed.comm.config import DeepSpeedCommsConfig
    from deepspeed.utils.comms_logging import CommsLogger

    logger = CommsLogger()
    logger.configure(DeepSpeedCommsConfig({"comms_logger": section}))
    assert logger.enabled is True  # DeepSpeed's behaviour the rule rests on: the section's presence decides
    config = {**ADAM, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "comms_logger": section}
    found = [f for f in lint_config(config) if f.key == "comms_logger.enabled"]
    assert bool(found) == warned
    if warned:
        assert found[0].severity == "warning" and "remove the whole 'comms_logger' section" in found[0].fix
