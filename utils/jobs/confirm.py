"""Confirm what the what-if search predicts by running its best configurations for real.

The search (`utils.planning.whatif.search_micro_batches`) is a model; this module is where
it meets real DeepSpeed jobs, which is why it lives with the jobs and not with planning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from utils.jobs.launch import run_job
from utils.jobs.spec import JobSpec
from utils.planning.whatif import SearchRow


@dataclass(frozen=True)
class Confirmation:
    """A searched configuration next to the real job that ran it."""

    row: SearchRow
    run: object
    """The `utils.Run` of the real job."""
    measured_makespan: float
    """Median pipeline-phase makespan over the run's steps but step 0 (seconds)."""

    @property
    def error(self) -> float:
        """(predicted − measured) / measured makespan."""
        return (self.row.step_time - self.measured_makespan) / self.measured_makespan


def confirm_top(rows: Sequence[SearchRow], spec: JobSpec, *, top: int = 3, steps: int = 4) -> list[Confirmation]:
    """Run the `top` fastest feasible configurations as real jobs.

    `spec` (a `utils.JobSpec`) gives everything but the micro-batch count, its size and the
    schedule, which come from each row; each schedule runs on its catalogue runtime (DeepSpeed
    for 1F1B and GPipe, torch's pipelining for the others: `JobSpec.runtime`), so `spec` must
    not ask the torch runtime for what only DeepSpeed does when such a row is among the `top`.
    """
    runnable = sorted((r for r in rows if r.feasible),
                      key=lambda r: r.step_time)[:top]
    confirmed = []
    for row in runnable:
        run = run_job(replace(spec, micro_batches=row.micro_batches, micro_batch_size=row.micro_batch_size,
                              schedule=row.schedule, steps=steps), progress=False)
        confirmed.append(Confirmation(row, run, run.timeline.metrics().makespan))
    return confirmed
