"""Which training steps represent the steady pipeline: the one rule for leaving out step 0."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["steady_steps"]


def steady_steps(steps: Iterable[int], *, skip_first: bool = True) -> list[int]:
    """`steps` without step 0, unless step 0 is the only step (or `skip_first` is False).

    The first training step pays one-off costs that say nothing about the steady pipeline:
    allocator growth, JIT/kernel builds, connection setup, the first-send meta exchange
    of DeepSpeed's point-to-point channel (shapes and dtypes go across once) and cold
    caches. Statistics, calibrations and default views therefore use the later steps, and
    fall back to step 0 only when a timeline holds nothing else.

    Only the step numbered 0 is dropped, not whichever step comes first: a timeline that
    starts at step 3 keeps step 3. Order is kept; an empty input gives an empty list.
    """
    steps = list(steps)
    if not skip_first:
        return steps
    later = [s for s in steps if s != 0]
    return later or steps
