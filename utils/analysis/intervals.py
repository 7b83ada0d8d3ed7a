"""Interval arithmetic on event times, and which part of a send/recv is real transfer.

An interval is ``(start, end)`` in seconds, like `Event` times. The metrics count time as a
union of intervals so that overlapping events on one rank are never counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from utils.timeline import COMM_KINDS, Event

__all__ = ["Interval", "clip_intervals", "interval_union", "replica_index",
           "transfer_intervals", "union_length"]

Interval = tuple[float, float]

#: A send on one stage and the receive it feeds: (send kind, recv kind, stage offset).
_P2P_PAIRS = (("send_act", "recv_act", +1), ("send_grad", "recv_grad", -1))


def interval_union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals, so no moment is counted twice."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def union_length(intervals: Iterable[Interval]) -> float:
    """Total time covered by the intervals (overlaps count once)."""
    return sum(b - a for a, b in interval_union(intervals))


def clip_intervals(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of `intervals` inside ``[lo, hi]``; intervals left empty are dropped."""
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def replica_index(events: list[Event]) -> dict[tuple[int, int], int]:
    """``(stage, rank) -> i``: the data-parallel replica a rank is within its stage, counting
    the stage's ranks in order, so events of neighbouring stages pair up replica by replica."""
    ranks_of: dict[int, set[int]] = {}
    for e in events:
        ranks_of.setdefault(e.stage, set()).add(e.rank)
    return {(s, r): i for s, ranks in ranks_of.items() for i, r in enumerate(sorted(ranks))}


def transfer_intervals(events: list[Event]) -> dict[int, Interval]:
    """For each send/recv whose partner is in `events`, the part of it that is transfer.

    DeepSpeed's point-to-point calls block: a recv posted before its neighbour reaches the
    matching send waits inside the call. That wait is a bubble (the neighbour is late), not
    communication, so a call counts as communication only from the moment both ends are
    inside their calls. Keys are ``id(event)``; unmatched events (e.g. a simulated timeline
    or a neighbour's missing events) are left out and count whole.
    """
    replica = replica_index(events)
    index = {(e.kind, e.stage, replica[e.stage, e.rank], e.micro_batch, e.chunk): e
             for e in events if e.kind in COMM_KINDS}
    intervals: dict[int, Interval] = {}
    for send_kind, recv_kind, offset in _P2P_PAIRS:
        for (kind, stage, rep, mb, chunk), send in index.items():
            if kind != send_kind:
                continue
            recv = index.get((recv_kind, stage + offset, rep, mb, chunk))
            if recv is None:
                continue
            both_in = max(send.start, recv.start)
            intervals[id(send)] = (min(both_in, send.end), send.end)
            intervals[id(recv)] = (min(both_in, recv.end), recv.end)
    return intervals
