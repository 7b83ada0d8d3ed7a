"""Helpers shared by the tests (not fixtures)."""

import psutil

#: A GPT-like model small enough that a job's work is negligible next to its start-up.
SMALL_GPT = {"model": "gpt", "micro_batch_size": 2,
             "model_options": {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}}


def processes_of(run_path) -> list[psutil.Process]:
    """Live processes whose command line names this run directory (torchrun and its ranks)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_path) in part for part in (proc.info["cmdline"] or [])):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
