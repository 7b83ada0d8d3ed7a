"""Helpers shared by the tests (not fixtures)."""

from collections.abc import Callable

from utils.timeline import Event

#: A GPT-like model small enough that a job's work is negligible next to its start-up.
SMALL_GPT = {"model": "gpt", "micro_batch_size": 2,
             "model_options": {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}}


def schedule_events(p: int, m: int, *, f: float | list[float] = 1.0,
                    b: float | list[float] = 2.0, schedule: str = "1f1b", step: int = 0,
                    offset: float = 0.0,
                    rank_of: Callable[[int], int] = lambda s: s) -> list[Event]:
    """Events of one step of GPipe or 1F1B, each action started as early as its inputs allow."""
    fwd = f if isinstance(f, list) else [f] * p
    bwd = b if isinstance(b, list) else [b] * p
    orders = []
    for s in range(p):
        if schedule == "gpipe":
            order = [("forward", i) for i in range(m)] + [("backward", i) for i in range(m)]
        else:  # 1F1B: p-s-1 warm-up forwards, then one forward / one backward, then drain
            warm = min(p - s - 1, m)
            order = [("forward", i) for i in range(warm)]
            for i in range(m):
                if warm + i < m:
                    order.append(("forward", warm + i))
                order.append(("backward", i))
        orders.append(order)
    done: dict[tuple[str, int, int], float] = {}
    free, pos, events = [0.0] * p, [0] * p, []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                if kind == "forward":
                    deps = [("forward", s - 1, i)] if s > 0 else []
                else:
                    deps = [("forward", s, i)] + ([("backward", s + 1, i)] if s < p - 1 else [])
                if any(d not in done for d in deps):
                    break
                start = max([free[s]] + [done[d] for d in deps])
                end = start + (fwd[s] if kind == "forward" else bwd[s])
                done[(kind, s, i)] = free[s] = end
                pos[s] += 1
                progressed = True
                events.append(Event(stage=s, rank=rank_of(s), step=step, kind=kind,
                                    micro_batch=i, start=offset + start, end=offset + end))
        assert progressed, "the test schedule deadlocked"
    return events
