"""`LayerProfile`: the measured per-layer cost of a model preset, and what it implies."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from utils.analysis.tables import html_table, text_table

PROFILE_VERSION = 3
"""Bump when the measurement method changes, so older cached profiles are not reused."""


@dataclass(frozen=True)
class LayerProfile:
    """Measured cost of every layer of a model preset, in seconds per micro-batch.

    Per-layer lists are indexed by layer (the indices of ``PipelineModule``'s layer list).
    The last layer's forward and backward include the loss.
    """

    model: str
    """Preset name."""
    options: dict[str, Any]
    """The preset's resolved sizes (defaults merged with overrides)."""
    micro_batch_size: int
    device: str
    """``"cpu"`` or ``"cuda"``."""
    device_name: str
    """The CPU model or GPU name, so a profile says where it was taken."""
    threads: int | None
    """torch intra-op threads during the measurement (None: left as found, on GPU)."""
    concurrency: int
    """Processes that measured at once, each with `threads` threads (CPU; 1 on GPU). The
    samples of all of them are pooled."""
    torch_version: str
    warmup: int
    repeats: int
    seed: int
    layer_names: list[str]
    forward: list[float]
    """Median forward seconds per layer."""
    backward: list[float]
    """Median backward seconds per layer."""
    forward_iqr: list[float]
    """Interquartile range of the forward samples (seconds): how noisy the median is."""
    backward_iqr: list[float]
    forward_samples: list[list[float]]
    """Every kept forward sample (after warm-up), per layer."""
    backward_samples: list[list[float]]
    param_bytes: list[int]
    """Bytes of each layer's parameters."""
    activation_bytes: list[int]
    """Bytes of each layer's output for one micro-batch (for the last layer: its logits)."""
    measured_at: float
    """Unix time of the measurement."""
    core_share: float | None = None
    """CPU only: process CPU time over (wall time × threads) across the kept measurements.
    About 1.0 when the profile had its cores to itself; 0.6 means it got 60 % of them, the
    rest going to other processes, so its times are inflated by waiting for a core — and a
    job on the same busy machine is inflated by whatever the load is *then*. None on GPU."""
    cached: bool = field(default=False, compare=False)
    """True when this object was read from the cache rather than measured just now."""

    # --- derived -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def total(self) -> list[float]:
        """Forward + backward seconds per layer and micro-batch: the cost to partition on."""
        return [f + b for f, b in zip(self.forward, self.backward)]

    def balanced(self, num_stages: int) -> list[int]:
        """The boundaries with the fastest possible slowest stage under this profile."""
        from utils.planning.partitioning import partition_layers

        return partition_layers(self.total, num_stages, method="balanced")

    def compare_partitions(self, num_stages: int) -> list[dict[str, Any]]:
        """Uniform, DeepSpeed's parameter balance and the profile's exact balance side by
        side: boundaries, predicted per-stage cost (ms per micro-batch) and the bottleneck."""
        from utils.planning.partitioning import partition_layers, stage_costs

        params = [b // 4 for b in self.param_bytes]  # any scale works: only ratios matter
        rows = []
        for method in ("uniform", "parameters", "balanced"):
            parts = partition_layers(self.total, num_stages, method=method,
                              **({"params": params} if method == "parameters" else {}))
            costs = stage_costs(self.total, parts)
            rows.append({"method": method, "parts": parts,
                         "stage_ms": [round(c * 1e3, 2) for c in costs],
                         "bottleneck_ms": round(max(costs) * 1e3, 2),
                         "slowest_stage": costs.index(max(costs))})
        return rows

    # --- display -------------------------------------------------------------------------------
    def table(self) -> list[dict[str, Any]]:
        """One row per layer: times in ms (median and IQR), share of the total, sizes."""
        grand = sum(self.total) or 1.0
        rows = []
        for i in range(self.num_layers):
            name = self.layer_names[i] + (" + loss" if i == self.num_layers - 1 else "")
            rows.append({"layer": i, "name": name,
                         "forward_ms": round(self.forward[i] * 1e3, 3),
                         "forward_iqr_ms": round(self.forward_iqr[i] * 1e3, 3),
                         "backward_ms": round(self.backward[i] * 1e3, 3),
                         "backward_iqr_ms": round(self.backward_iqr[i] * 1e3, 3),
                         "total_ms": round(self.total[i] * 1e3, 3),
                         "share": round(self.total[i] / grand, 4),
                         "param_MiB": round(self.param_bytes[i] / 2**20, 3),
                         "activation_MiB": round(self.activation_bytes[i] / 2**20, 3)})
        return rows

    def _head(self) -> str:
        threads = "" if self.threads is None else f", {self.threads} thread(s)"
        if self.concurrency > 1:
            threads += f" in each of {self.concurrency} processes measuring at once"
        if self.core_share is not None:
            threads += f" getting {self.core_share:.0%} of their core time"
        options = ", ".join(f"{k}={v}" for k, v in self.options.items())
        source = "cached" if self.cached else "measured"
        return (f"layer profile of {self.model!r} ({options}), micro-batch {self.micro_batch_size}, "
                f"{self.device} [{self.device_name}]{threads}; median of {self.repeats} after "
                f"{self.warmup} warm-up, {source} {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.measured_at))}")

    def __str__(self) -> str:
        return "\n".join([self._head(), text_table(self.table()),
                          f"total per micro-batch: {sum(self.total) * 1e3:.3f} ms "
                          "(the last layer includes the loss)"])

    def _repr_html_(self) -> str:
        rows = self.table()
        for r in rows:
            r["share"] = f"{r['share']:.1%}"
        return (f"<div><b>{html.escape(self._head())}</b>{html_table(rows)}<p>total per micro-batch: "
                f"{sum(self.total) * 1e3:.3f} ms; the last layer includes the loss; "
                "IQR = spread of the middle half of the repeats.</p></div>")

    # --- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, cached: bool = False) -> LayerProfile:
        known = {f.name for f in fields(cls)} - {"cached"}
        missing = known - set(data) - {"core_share"}
        if missing:
            raise ValueError(f"not a layer profile: missing {sorted(missing)}")
        return cls(**{k: data[k] for k in known if k in data}, cached=cached)
