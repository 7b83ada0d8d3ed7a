"""The schedule catalogue: one record per pipeline schedule, and the only place its facts live.

Every list of schedules in the workbook reads this module: `build_schedule` takes the order
function and the chunk rule from here, the job world which runtime runs a schedule, the torch
runner which ``torch.distributed.pipelining`` class, the what-if calibration and the tuner the
default chunks, and the chapters the bubble formula with the range where it holds. Adding a
schedule is one record plus one order function (ZB-V was added that way).

A record's facts, field by field, are in `ScheduleInfo`. The orders are plain data
(``(virtual stage, kind, micro-batch)`` tuples per rank, `utils.planning.orders` and
`utils.planning.vshaped`); nothing here starts a process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from utils.analysis import theory
from utils.planning import orders, vshaped

__all__ = ["CATALOGUE", "RUNTIMES", "Runtime", "SCHEDULE_NAMES", "ScheduleInfo", "schedule_info", "schedules_on"]

Runtime = Literal["deepspeed", "torch"]
RUNTIMES: tuple[Runtime, ...] = ("deepspeed", "torch")
"""``deepspeed``: DeepSpeed's `PipelineEngine` with the workbook's lowering of the order;
``torch``: ``torch.distributed.pipelining`` with the class in `ScheduleInfo.torch_class`."""

OrderFn = Callable[[int, int, int], tuple[tuple[orders.Op, ...], ...]]


@dataclass(frozen=True, kw_only=True)
class ScheduleInfo:
    """What the workbook knows about one schedule."""

    name: str
    """The key every API takes, e.g. ``"1f1b"`` (lower case, as `build_schedule` spells it)."""
    title: str
    """How prose and figures name it, with its source."""
    order: OrderFn
    """``order(p, m, v)`` -> every rank's ``(virtual stage, kind, micro-batch)`` tuples in run
    order; raises ValueError for a (p, m, v) the schedule cannot run, saying why."""
    default_chunks: int
    """Model chunks per rank when the caller does not say."""
    min_chunks: int
    """Fewest chunks per rank the schedule runs."""
    max_chunks: int | None
    """Most chunks per rank (None: no limit). ``min_chunks == max_chunks``: the count is fixed."""
    placement: Literal["loop", "v"]
    """How virtual stages sit on ranks: ``loop`` (stage ``k`` on rank ``k % p``) or ``v``
    (rank ``r`` holds stages ``r`` and ``2p - 1 - r``, `utils.planning.vshaped`)."""
    runtimes: tuple[Runtime, ...]
    """Runtimes that run it as a real job, the first being the default."""
    torch_class: str
    """The ``torch.distributed.pipelining`` class with the same order."""
    torch_multi_stage: bool
    """Whether that class takes a list of stages per rank (``PipelineScheduleMulti``) rather
    than one stage (``PipelineScheduleSingle``)."""
    split_backward: Literal["never", "always", "partly"]
    """Whether backwards are split into input (I) and weight (W) passes."""
    bubble: str
    """The bubble as a share of the pipeline phase, with equal stage costs (text)."""
    bubble_range: str
    """Where that formula holds."""
    bubble_ratio: Callable[[int, int, int], float] | None
    """The formula as a function of ``(p, m, v)`` under `bubble_range`'s conditions (None when
    there is no closed form: simulate instead). Checked against the simulator in
    tests/unit/test_catalogue.py."""

    @property
    def fixed_chunks(self) -> bool:
        """True when the schedule always runs `default_chunks` chunks per rank."""
        return self.min_chunks == self.max_chunks

    def chunks_for(self, requested: int | None) -> int:
        """The chunks per rank a run of this schedule uses when `requested` is asked for: the
        fixed count whatever is asked (a fixed schedule ignores the knob), else `requested` or
        the default. The range is checked by `check_chunks`."""
        if self.fixed_chunks or requested is None:
            return self.default_chunks
        return requested

    def check_chunks(self, chunks: int) -> None:
        """ValueError unless this schedule runs `chunks` model chunks per rank."""
        if self.min_chunks <= chunks and (self.max_chunks is None or chunks <= self.max_chunks):
            return
        if self.max_chunks == 1:
            raise ValueError(f"{self.name} runs one model chunk per rank (chunks=1), got chunks={chunks}; "
                             f"use one of {', '.join(n for n, i in CATALOGUE.items() if i.min_chunks > 1)} "
                             "for several")
        if self.fixed_chunks:
            raise ValueError(f"{self.name} runs exactly {self.min_chunks} model chunks per rank, got chunks={chunks}")
        raise ValueError(f"{self.name} needs chunks >= {self.min_chunks} model chunks per rank; "
                         "with one chunk per rank use '1f1b'")

    def runs_on(self, runtime: str) -> bool:
        return runtime in self.runtimes


def _one_chunk(p: int, m: int, v: int) -> float:
    return theory.bubble_ratio_1f1b(p, m)


def _zb_h1_equal(p: int, m: int, v: int) -> float:
    # F = I = W = 1: idle (p-1)·max(F+I-W, F, I) = p-1 per rank against m(F+I+W) = 3m of work.
    idle = theory.bubble_time_zb_h1(p, m, 1.0, 1.0, 1.0)
    return idle / (3 * m + idle)


def _v_equal(p: int, m: int, v: int) -> float:
    # Two chunks of F = I = W = 1 per rank: 6m units of work and p - 1 idle units, the
    # workbook's simulator's finding for both V schedules (tests/unit/test_catalogue.py checks
    # it over p <= 6 and m from the record's minimum to 4p); not a formula from the papers.
    return (p - 1) / (6 * m + p - 1)


_ENTRIES = (
    ScheduleInfo(
        name="gpipe", title="GPipe (Huang et al., 2019)", order=orders.gpipe_order,
        default_chunks=1, min_chunks=1, max_chunks=1, placement="loop", runtimes=("deepspeed", "torch"),
        torch_class="ScheduleGPipe", torch_multi_stage=False, split_backward="never",
        bubble="(p-1)/(m+p-1)", bubble_range="equal stage costs, no communication time, any m >= 1",
        bubble_ratio=_one_chunk),
    ScheduleInfo(
        name="1f1b", title="1F1B (PipeDream-Flush, Narayanan et al., 2021; DeepSpeed's TrainSchedule)",
        order=orders.one_f_one_b_order,
        default_chunks=1, min_chunks=1, max_chunks=1, placement="loop", runtimes=("deepspeed", "torch"),
        torch_class="Schedule1F1B", torch_multi_stage=False, split_backward="never",
        bubble="(p-1)/(m+p-1)", bubble_range="equal stage costs, no communication time, any m >= 1",
        bubble_ratio=_one_chunk),
    ScheduleInfo(
        name="interleaved-1f1b", title="interleaved 1F1B (Narayanan et al., 2021)",
        order=orders.interleaved_order,
        default_chunks=2, min_chunks=2, max_chunks=None, placement="loop", runtimes=("torch",),
        torch_class="ScheduleInterleaved1F1B", torch_multi_stage=True, split_backward="never",
        bubble="(p-1)/(v*m+p-1)",
        bubble_range="equal virtual-stage costs, no communication time, m >= p (for m < p the exact "
                     "value of utils.analysis.theory.bubble_overhead_interleaved)",
        bubble_ratio=theory.bubble_ratio_interleaved),
    ScheduleInfo(
        name="zb-h1", title="ZB-H1 (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024)",
        order=orders.zb_h1_order,
        default_chunks=1, min_chunks=1, max_chunks=1, placement="loop", runtimes=("torch",),
        torch_class="ScheduleInterleavedZeroBubble", torch_multi_stage=True, split_backward="always",
        bubble="(p-1)/(3m+p-1) with F = I = W; in general idle (p-1)*max(F+I-W, F, I) per rank",
        bubble_range="equal stage costs, no communication time, m >= p",
        bubble_ratio=_zb_h1_equal),
    ScheduleInfo(
        name="dualpipev", title="DualPipeV (DeepSeek's DualPipe, cut in half; DeepSpeed's DualPipeVSchedule)",
        order=lambda p, m, v: vshaped.dualpipev_order(p, m),
        default_chunks=2, min_chunks=2, max_chunks=2, placement="v", runtimes=("torch",),
        torch_class="ScheduleDualPipeV", torch_multi_stage=True, split_backward="partly",
        bubble="(p-1)/(6m+p-1) with F = I = W per virtual stage and a full backward B = I + W",
        bubble_range="equal virtual-stage costs, no communication time, forward and backward pairs "
                     "run one after the other (torch's default, not DualPipe's overlap), m >= 2p "
                     "(torch and DeepSpeed refuse fewer)",
        bubble_ratio=_v_equal),
    ScheduleInfo(
        name="zbv", title="ZB-V (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, section 6)",
        order=lambda p, m, v: vshaped.zbv_order(p, m),
        default_chunks=2, min_chunks=2, max_chunks=2, placement="v", runtimes=("torch",),
        torch_class="ScheduleZBVZeroBubble", torch_multi_stage=True, split_backward="always",
        bubble="(p-1)/(6m+p-1) with F = I = W per virtual stage",
        bubble_range="equal virtual-stage costs, no communication time, m >= 2p - 1 (torch pads "
                     "smaller m to 2p - 1 and drops the padding: a larger bubble)",
        bubble_ratio=_v_equal),
)

CATALOGUE: dict[str, ScheduleInfo] = {info.name: info for info in _ENTRIES}
"""Every schedule the workbook knows, by name, in teaching order."""
SCHEDULE_NAMES: tuple[str, ...] = tuple(CATALOGUE)


def schedule_info(name: str) -> ScheduleInfo:
    """The record of `name` (case and surrounding spaces ignored); ValueError naming the choices."""
    key = name.lower().strip() if isinstance(name, str) else name
    if key not in CATALOGUE:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    return CATALOGUE[key]


def schedules_on(runtime: Runtime) -> tuple[str, ...]:
    """Names of the schedules `runtime` runs as real jobs, in catalogue order."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    return tuple(name for name, info in CATALOGUE.items() if info.runs_on(runtime))
