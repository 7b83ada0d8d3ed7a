"""Helpers of the workbook 《DeepSpeed 流水线负载均衡与动态调度》.

Importing the package starts nothing and does not import DeepSpeed: jobs run in their own
processes (`run_job`), and only those import it.
"""

from .launch import JobFailed, RunningJob, run_job, start_job
from .metrics import Metrics, MetricsSummary, compute_metrics
from .models import PRESETS, get_model
from .partition import LayerMemory, bottleneck, partition, stage_costs
from .profiling import LayerProfile, profile_for_job, profile_layers
from .runs import Run, find_run, list_runs, runs_dir
from .schedules import Action, Schedule, build, parse_action
from .simulate import simulate
from .spec import Fault, JobSpec
from .theory import bubble_overhead_interleaved, bubble_ratio_1f1b, bubble_ratio_gpipe, bubble_ratio_interleaved
from .timeline import Event, Timeline
from .whatif import best, predict, search_micro_batches, stage_costs_from_timeline


#: Loaded on first use, so job processes (which import this package) never pay for plotly
#: or ipywidgets.
_LAZY = {"RunPanel": "widgets", "TimelineExplorer": "widgets", "compare_timelines": "plots",
         "plot_memory": "plots", "plot_stage_breakdown": "plots", "plot_sweep": "plots",
         "plot_timeline": "plots"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'utils' has no attribute {name!r}")


__all__ = [
    "Action", "Event", "Fault", "JobFailed", "JobSpec", "LayerMemory", "Metrics", "MetricsSummary",
    "LayerProfile", "PRESETS", "Run", "RunPanel", "RunningJob", "TimelineExplorer", "Schedule", "Timeline", "best", "bottleneck", "build",
    "bubble_overhead_interleaved", "bubble_ratio_1f1b", "bubble_ratio_gpipe", "bubble_ratio_interleaved",
    "compare_timelines", "compute_metrics", "find_run", "get_model", "list_runs", "parse_action", "partition",
    "plot_memory", "plot_stage_breakdown", "plot_sweep", "plot_timeline", "predict", "profile_for_job", "profile_layers", "run_job",
    "runs_dir", "search_micro_batches", "simulate", "stage_costs", "stage_costs_from_timeline",
    "start_job",
]
