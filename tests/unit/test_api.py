"""The notebook API, frozen: chapters 1–30 and the labs import these names from `utils`.

Changing the list is a decision (update the chapters, docs/architecture.md and this
snapshot together), not a side effect of moving code.
"""

import pkgutil

import pytest

import utils

FROZEN = {
    # 1. Describe and run a real job, read its record
    "JobSpec", "Fault", "JobPlan", "plan_job", "profile_for_job", "deepspeed_config", "lint_config", "Finding",
    "run_job", "start_job", "RunningJob", "JobFailed", "Run", "find_run", "list_runs", "runs_dir",
    "get_model", "PRESETS", "ModelDef", "train_sequential", "record", "Recorder", "suggest_partition", "PartitionSuggestion",
    # 2. The data model and what is measured on it
    "Event", "Timeline", "Metrics", "MetricsSummary", "compute_metrics",
    "bubble_ratio_1f1b", "bubble_ratio_gpipe", "bubble_ratio_interleaved", "bubble_overhead_interleaved",
    "bubble_ratio_estimate", "makespan_estimate",
    # 3. Planning without processes
    "Action", "Schedule", "build_schedule", "parse_action", "simulate", "rank_grid", "RankGrid",
    # 4. Balancing stages
    "LayerProfile", "profile_layers", "cut_bytes", "measure_link", "partition_layers", "stage_costs", "bottleneck", "LayerMemory",
    # 5. What if
    "measured_stage_costs", "predict_from_timeline", "search_micro_batches", "fastest_within_memory",
    "confirm_top", "tune", "Candidate", "autotune", "Tuning",
    # 6. The dynamic half
    "Rebalance", "Decision", "LayerCosts", "decide", "plan_micro_batches", "MicroBatchCost", "MicroBatchPlan",
    "MicroBatchPolicy", "MicroBatchDecision",
    # 7. Troubleshooting
    "diagnose", "Diagnosis",
    # 7b. Beyond one machine
    "Node", "parse_hostfile", "TorchrunNodes", "DeepSpeedRunner", "prepare_job", "NodeCommands",
    "boundary_links", "BoundaryLink",
    # 8. Pictures and widgets
    "plot_timeline", "compare_timelines", "plot_stage_breakdown", "plot_sweep", "plot_memory",
    "plot_partition_history", "decision_table", "plot_rank_grid",
    "RunPanel", "TimelineExplorer", "set_language", "get_language",
}


def test_the_api_is_the_frozen_list():
    assert set(utils.__all__) == FROZEN
    assert len(utils.__all__) == len(FROZEN)


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_every_name_resolves_to_its_module(name):
    value = getattr(utils, name)
    home = utils._MODULE_OF[name]
    assert getattr(value, "__module__", home) == home or name == "PRESETS"
    assert name in dir(utils)


def test_no_top_level_name_is_also_a_module_name():
    # Before, `utils.partition` and `utils.simulate` were functions that hid their modules.
    modules = {m.name for m in pkgutil.iter_modules(utils.__path__)}
    assert modules and not modules & FROZEN, modules & FROZEN


def test_old_generic_names_are_gone():
    for old in ("build", "best", "predict", "partition", "stage_costs_from_timeline"):
        with pytest.raises(AttributeError, match=f"module 'utils' has no attribute '{old}'"):
            getattr(utils, old)
