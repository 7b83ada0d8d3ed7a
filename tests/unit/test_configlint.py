"""`lint_config` on the seed's snippet, DeepSpeed's own config templates and misspellings."""

import glob
import json
import os

import pytest

from utils.jobs.configlint import deepspeed_reads, lint_config, pipeline_keys

SEED = {"train_batch_size": 64, "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1},
        "pipeline": {"pipe_parallel_size": 4, "micro_batch_size": 8, "schedule": "1F1B"}}


def _keys(findings, severity=None):
    return {f.key for f in findings if severity in (None, f.severity)}


def test_the_seed_snippet_is_told_what_deepspeed_ignores():
    findings = lint_config(SEED, num_stages=4)
    assert _keys(findings, "error") == {"pipeline.pipe_parallel_size", "pipeline.micro_batch_size",
                                        "pipeline.schedule"}
    fixes = {f.key: f.fix for f in findings}
    assert "PipelineModule(num_stages" in fixes["pipeline.pipe_parallel_size"]
    assert "train_micro_batch_size_per_gpu" in fixes["pipeline.micro_batch_size"]


def test_deepspeeds_own_templates_are_clean():
    import deepspeed

    templates = glob.glob(os.path.join(os.path.dirname(deepspeed.__file__), "autotuning", "config_templates", "*.json"))
    assert templates
    for path in templates:
        with open(path) as f:
            assert lint_config(json.load(f)) == [], path


def test_every_key_deepspeed_reads_is_accepted():
    """Each top-level key DeepSpeed looks up, set to the value it would default to, is never
    called unknown (the vocabulary is DeepSpeed's, read at run time)."""
    read, _, _ = deepspeed_reads({"train_batch_size": 1})
    assert {"train_batch_size", "gradient_accumulation_steps", "zero_optimization", "pipeline", "optimizer",
            "scheduler", "fp16", "bf16", "activation_checkpointing"} <= read
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "steps_per_print": 10, "wall_clock_breakdown": False, "gradient_clipping": 1.0,
              "prescale_gradients": False, "zero_optimization": {"stage": 1, "overlap_comm": True},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
              "pipeline": {"activation_checkpoint_interval": 1, "pipe_partitioned": True}}
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
                         "gradient_accumulation_steps": 4}, data_parallel=1)
    assert [f.key for f in batch] == ["train_batch_size"] and "to 16" in batch[0].fix and "to 8" in batch[0].fix
    assert lint_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 4}, data_parallel=2) == []
    zero = lint_config({"train_batch_size": 8, "zero_optimization": {"stage": 2}}, num_stages=2)
    assert "zero_optimization.stage" in _keys(zero, "error")
    assert "zero_optimization.stage" not in _keys(lint_config({"train_batch_size": 8,
                                                               "zero_optimization": {"stage": 2}}))
    both = lint_config({"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert "fp16" in _keys(both, "error")


def test_pipeline_keys_come_from_deepspeeds_code():
    known, unused = pipeline_keys()
    assert {"activation_checkpoint_interval", "pipe_partitioned", "grad_partitioned", "use_reentrant"} <= known
    assert "stages" in unused  # in DeepSpeed's defaults, read by nothing: PipelineModule(num_stages=) decides
    stages = lint_config({"train_batch_size": 8, "pipeline": {"stages": 4}})
    assert [f.key for f in stages] == ["pipeline.stages"] and "PipelineModule" in stages[0].fix
