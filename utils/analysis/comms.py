"""DeepSpeed's comms-logger record read back per op (`comm_ops`), as each rank saved it
(`utils.runtime.commslog.raw_record`; `Run.comm_ops`).

Why a reader of its own: in DeepSpeed 0.19.8 the recorded latencies are **cumulative**.
``timed_op`` stops the op's timer and records ``timers(log_name).elapsed(reset=False)``, and a
timer that is never reset returns the sum of all its intervals so far
(``SynchronizedWallClockTimer.Timer._get_elapsed_msec``). The timer is keyed by the op's name
alone, so the running sum of, say, ``recv`` runs across every message size. Its values are
therefore increasing over all sizes of one name, which gives back the order of the ops; each
op's own time is the difference to the previous value. ``log_summary``'s averages are means of
the running sums, too large by a factor that grows with the op count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommOp:
    """One ``deepspeed.comm`` operation as DeepSpeed's comms logger timed it on one rank."""

    op: str
    """The op's log name (``send``, ``recv``, ``broadcast``, ``all_reduce``, ...)."""
    bytes: int
    """The message size DeepSpeed attributed to it (``get_msg_size_from_args``)."""
    ms: float
    """Its own duration: the cumulative record minus the previous one of the same name. On a
    CPU a host-clock interval, on a GPU CUDA events; either way from the call to its return
    after ``synchronize()``, so a receive's time includes waiting for the sender."""
    index: int
    """Its position among the ops of the same name on this rank (0 = first)."""


def comm_ops(raw: dict[str, dict[str, dict]]) -> list[CommOp]:
    """Each op's own duration from a `raw_record`, ops of one name in the order they ran."""
    found = []
    for name, by_size in raw.items():
        readings = sorted((total, int(size)) for size, row in by_size.items() for total in row["cumulative_ms"])
        previous = 0.0
        for index, (total, size) in enumerate(readings):
            found.append(CommOp(op=name, bytes=size, ms=total - previous, index=index))
            previous = total
    return found
