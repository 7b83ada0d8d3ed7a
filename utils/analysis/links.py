"""The stage boundaries of a measured run as links: how long an activation and a gradient took
to cross each one, and whether it crossed from one node to another.

Across nodes the slowest link sets the price of a cut: a partition that ignores it can put
its biggest activation on the network. `boundary_links` reads what the run measured (the
transfer part of each blocking send/recv, `utils.analysis.intervals.transfer_intervals`, so
waiting for a late neighbour is not counted), and ``timeline.meta["nodes"]`` (rank -> node,
recorded by each rank, `utils.jobs.runs.Run.nodes`) says which boundaries cross nodes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from utils.analysis.intervals import transfer_intervals
from utils.timeline import Timeline

__all__ = ["BoundaryLink", "boundary_links"]


@dataclass(frozen=True)
class BoundaryLink:
    """The cut between stage `stage` and stage ``stage + 1``, as the run measured it."""

    stage: int
    nodes: tuple[int, int] | None
    """(node of stage `stage`, node of the next stage) for the first replica; None when the
    run recorded no placement."""
    cross_node: bool
    """True when some replica's activation leaves its node at this cut."""
    activation_s: float | None
    """Median seconds an activation spent in transfer across this cut (None: no pair seen)."""
    gradient_s: float | None
    """Median seconds a gradient spent in transfer back across it."""
    transfers: int
    """Matched send/recv pairs the medians are taken over."""

    def link_cost(self, cut_bytes: Sequence[int], at_bytes: int) -> list[float]:
        """`utils.partition_layers`'s ``link_cost`` at this boundary's price: each cut's bytes
        times the seconds per byte this boundary's activation took (it carried `at_bytes`).
        A bandwidth-only line through one measured point: it holds for messages near
        `at_bytes`; much smaller ones also pay a latency it cannot see."""
        if self.activation_s is None or at_bytes <= 0:
            raise ValueError("this boundary has no measured activation transfer to price cuts with")
        return [self.activation_s * b / at_bytes for b in cut_bytes]

    def row(self) -> dict:
        """One table row (milliseconds), for a DataFrame or `utils.ui.tables`."""
        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1e3, 3)

        return {"boundary": f"{self.stage}|{self.stage + 1}", "nodes": self.nodes, "cross_node": self.cross_node,
                "activation_ms": ms(self.activation_s), "gradient_ms": ms(self.gradient_s),
                "transfers": self.transfers}


def boundary_links(timeline: Timeline, step: int | None = None) -> list[BoundaryLink]:
    """One `BoundaryLink` per stage boundary, over `step` (default: every step but the first,
    whose transfers include the process group's first connection)."""
    steps = [step] if step is not None else ([s for s in timeline.steps if s != 0] or timeline.steps)
    nodes = {int(r): int(n) for r, n in timeline.meta.get("nodes", {}).items()}
    act: dict[int, list[float]] = {}
    grad: dict[int, list[float]] = {}
    ranks: dict[int, set[int]] = {}
    for s in steps:
        events = timeline.select(step=s)
        for e in events:
            ranks.setdefault(e.stage, set()).add(e.rank)
        spans = transfer_intervals(events)
        for e in events:
            if id(e) not in spans:
                continue
            a, b = spans[id(e)]
            if e.kind == "send_act":  # stage -> stage + 1
                act.setdefault(e.stage, []).append(b - a)
            elif e.kind == "send_grad":  # stage -> stage - 1: the cut below it
                grad.setdefault(e.stage - 1, []).append(b - a)
    links = []
    for s in range(timeline.num_stages - 1):
        here, there = sorted(ranks.get(s, ())), sorted(ranks.get(s + 1, ()))
        pairs = [(nodes.get(a), nodes.get(b)) for a, b in zip(here, there)]
        known = bool(pairs) and all(a is not None and b is not None for a, b in pairs)
        links.append(BoundaryLink(
            stage=s, nodes=pairs[0] if known else None, cross_node=known and any(a != b for a, b in pairs),
            activation_s=statistics.median(act[s]) if act.get(s) else None,
            gradient_s=statistics.median(grad[s]) if grad.get(s) else None,
            transfers=len(act.get(s, ())) + len(grad.get(s, ()))))
    return links
