"""The live "step k/N, loss" line `run_job` shows while a job runs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from utils.jobs.launch import RunningJob


class ProgressLine:
    """'step k/N  loss x' as one live line: a display handle in Jupyter, stderr elsewhere."""

    def __init__(self, job: RunningJob):
        self.job = job
        self.handle = None
        for note in job.notes:
            print(f"note: {note}", file=sys.stderr)
        try:
            from IPython import get_ipython

            if get_ipython() is not None and hasattr(get_ipython(), "kernel"):
                from IPython.display import display

                self.handle = display(self._text([]), display_id=True)
        except ImportError:
            pass

    def _text(self, rows: list[dict]) -> str:
        spec = self.job.spec
        head = f"{self.job.path.name}: {spec.num_stages} stages × {spec.micro_batches} micro-batches"
        if not rows:
            return f"{head}: starting ..."
        last = rows[-1]
        return f"{head}: step {last['step'] + 1}/{spec.steps}  loss {last['loss']:.4f}  ({last['seconds']:.2f} s/step)"

    def __call__(self, rows: list[dict]) -> None:
        text = self._text(rows)
        if self.handle is not None:
            self.handle.update(text)
        else:
            print(text, file=sys.stderr)
