"""Helpers of the workbook 《DeepSpeed 流水线负载均衡与动态调度》: the notebook API.

Every name below is what chapters and labs use, grouped by the course arc; each is loaded
from its module on first use (PEP 562), so ``import utils`` starts nothing, imports neither
torch nor DeepSpeed, and job processes (which import this package) pay only for what they
use. The modules themselves are listed in docs/architecture.md; ``utils.<name>.__module__``
says where a name lives. tests/unit/test_api.py keeps this list from changing by accident.
"""

from __future__ import annotations

import importlib

_API: dict[str, tuple[str, ...]] = {
    # 1. Describe and run a real pipeline job (a preset or your own model), and read its record.
    "utils.jobs.spec": ("JobSpec",),
    "utils.jobs.fault": ("Fault",),
    "utils.jobs.plan": ("JobPlan", "plan_job", "profile_for_job"),
    "utils.jobs.config": ("deepspeed_config",),
    "utils.jobs.configlint": ("lint_config", "Finding"),
    "utils.jobs.launch": ("run_job", "start_job", "RunningJob", "JobFailed"),
    "utils.jobs.runs": ("Run", "find_run", "list_runs"),
    "utils.jobs.rundir": ("runs_dir",),
    "utils.workloads.models": ("get_model", "PRESETS"),
    "utils.workloads.custom": ("ModelDef",),
    "utils.workloads.reference": ("train_sequential",),
    # 2. The one data model, and what is measured on it.
    "utils.timeline": ("Event", "Timeline"),
    "utils.analysis.metrics": ("Metrics", "compute_metrics"),
    "utils.analysis.summary": ("MetricsSummary",),
    "utils.analysis.theory": ("bubble_ratio_1f1b", "bubble_ratio_gpipe", "bubble_ratio_interleaved",
                              "bubble_overhead_interleaved", "bubble_ratio_estimate", "makespan_estimate"),
    # 3. Plan without processes: schedules as data, the simulator (a model, never a measurement).
    "utils.planning.schedules": ("Action", "Schedule", "build_schedule", "parse_action"),
    "utils.planning.simulator": ("simulate",),
    "utils.planning.topology": ("rank_grid", "RankGrid"),
    # 4. Balance the stages: per-layer profiles and exact partitions.
    "utils.profiling.result": ("LayerProfile",),
    "utils.profiling.profile": ("profile_layers",),
    "utils.profiling.link": ("cut_bytes", "measure_link"),
    "utils.planning.partitioning": ("partition_layers", "stage_costs", "bottleneck", "LayerMemory"),
    # 5. What if: predictions calibrated on a measured run, searched, then confirmed for real.
    "utils.planning.whatif": ("measured_stage_costs", "predict_from_timeline", "search_micro_batches",
                              "fastest_within_memory"),
    "utils.jobs.confirm": ("confirm_top",),
    "utils.planning.tuning": ("tune", "Candidate"),
    "utils.jobs.autotune": ("autotune", "Tuning"),
    # 6. The dynamic half: a running job re-partitions itself (JobSpec(rebalance=...)).
    "utils.planning.rebalance": ("Rebalance", "Decision", "LayerCosts", "decide"),
    "utils.planning.microbatching": ("plan_micro_batches", "MicroBatchCost", "MicroBatchPlan", "MicroBatchPolicy",
                                     "MicroBatchDecision"),
    # 7. Find what is wrong with a job: failed, hung or slow.
    "utils.jobs.diagnose": ("diagnose",),
    "utils.runtime.recorder": ("record", "Recorder"),
    "utils.jobs.suggest": ("suggest_partition", "PartitionSuggestion"),
    "utils.analysis.diagnosis": ("Diagnosis",),
    # 8. Beyond one machine: nodes, launchers, the commands that run a job elsewhere.
    "utils.jobs.hosts": ("Node", "parse_hostfile"),
    "utils.jobs.multinode": ("TorchrunNodes", "DeepSpeedRunner"),
    "utils.jobs.commands": ("prepare_job", "NodeCommands"),
    "utils.analysis.links": ("boundary_links", "BoundaryLink"),
    # 9. See it: plotly figures and notebook widgets.
    "utils.ui.plots": ("plot_timeline", "compare_timelines", "plot_stage_breakdown", "plot_sweep", "plot_memory"),
    "utils.ui.rebalance_plots": ("plot_partition_history",),
    "utils.ui.decisions": ("decision_table",),
    "utils.ui.topology_plots": ("plot_rank_grid",),
    "utils.ui.widgets": ("RunPanel",),
    "utils.ui.explorer": ("TimelineExplorer",),
    "utils.ui.labels": ("set_language", "get_language"),
}

_MODULE_OF = {name: module for module, names in _API.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
