"""Helpers of the workbook 《DeepSpeed 流水线负载均衡与动态调度》.

Importing the package starts nothing and does not import DeepSpeed: jobs run in their own
processes (`run_job`), and only those import it.
"""

from .launch import JobFailed, RunningJob, run_job, start_job
from .models import PRESETS, get_model
from .runs import Run, list_runs, runs_dir
from .spec import Fault, JobSpec
from .timeline import Event, Timeline

__all__ = [
    "Event", "Fault", "JobFailed", "JobSpec", "PRESETS", "Run", "RunningJob", "Timeline",
    "get_model", "list_runs", "run_job", "runs_dir", "start_job",
]
