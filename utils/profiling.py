"""Per-layer cost of a model preset, measured on the device a job will use.

`profile_layers` runs every layer of a preset on its own, forward and backward, the way a
pipeline stage runs it, and returns a `LayerProfile`: per-layer forward and backward time
(median and spread over repeats), parameter bytes and output-activation bytes. Its
``total`` (forward + backward per layer, seconds per micro-batch) is what
``partition(costs, p, method="balanced")`` needs to find the boundaries whose slowest stage
is as fast as possible — the partition DeepSpeed's ``partition_method="profile"`` promises
but does not implement (it raises NotImplementedError in 0.19.8).

What is measured, and why it matches a real stage:

- Same conditions as a job rank: the same device, the same micro-batch size and, on CPU,
  the same torch thread count a rank gets (`rank_threads`, as `utils.launch` sets
  ``OMP_NUM_THREADS``) and the same allocator settings (`keep_freed_memory`, which stays
  in effect in this process afterwards). Layers are seeded like
  ``PipelineModule(seed_layers=True)`` and fed a real batch: layer ``i`` gets layer
  ``i - 1``'s output on it.
- Forward: the layer call. Backward: ``torch.autograd.backward(out, grad)`` with a random
  gradient of the output's shape, the input requiring grad as a received activation does
  (so the input gradient, which a stage sends back, is computed too). Parameter gradients
  accumulate across repeats, as they do across the micro-batches of a step.
- The loss belongs to the last layer: DeepSpeed computes ``loss_fn`` on the last stage
  inside its forward instruction and backpropagates from the loss in its backward one, so
  the last layer's forward includes ``loss_fn`` and its backward is ``loss.backward()``.
- Round-robin: each repeat runs every layer once before the next repeat, so a burst of
  machine noise (other processes on a shared machine) hits all layers alike instead of
  inflating one; the first `warmup` rounds are dropped and the median of the rest is kept,
  with the interquartile range as the spread.
- On GPU each measurement is bracketed by CUDA events and synchronised (fine here: this is
  a profiling pass, not the traced run, where that would perturb the pipeline).
- Contention (CPU): the ranks of a CPU job share the machine's cores, caches and memory
  bandwidth. ``concurrency=k`` measures with `k` processes at once, each running the
  round-robin from a different layer (so a block is timed next to the head, as stage 0 runs
  next to the last stage), in lockstep round by round, and pools their samples;
  `profile_for_job` uses the job's world size. It matters most when ranks outnumber cores:
  on a 2-core VM, 4 processes at once measured the head + loss at 41–45 ms against
  22–27 ms alone, as the kernel time-slices it, while a 5–7 ms block mostly ran within one
  time slice and hardly changed. 2 processes on the same 2 cores measured the same as 1,
  within that machine's drift, in 5 interleaved pairs.

Profiles are cached as JSON per (preset, options, micro-batch size, device, threads,
concurrency, torch version, warm-up, repeats, seed) in `cache_dir()`; ``cache=False``
measures again.

What a profile still cannot see: DeepSpeed's own per-instruction work (input clone, hooks,
loss scaling), communication, and a machine whose speed changes between the profile and
the run (a shared VM's neighbours). `utils.launch` records the prediction next to the
measured run, so the gap can be checked rather than assumed.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cpu_setup import keep_freed_memory, rank_threads

if TYPE_CHECKING:
    from .spec import JobSpec

__all__ = ["LayerProfile", "cache_dir", "cached_profile", "launch_profile", "partition_record",
           "profile_for_job", "profile_layers"]

#: Bump when the measurement method changes, so older cached profiles are not reused.
PROFILE_VERSION = 3
DEFAULT_SEED = 1234
"""`JobSpec.seed`'s default: layers and data are seeded like a job with it."""
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 15
"""Enough rounds to span about a second on the default ``gpt`` preset on CPU: a shared
machine's speed drifts over seconds, and a job's steps average over that drift too."""
BARRIER_TIMEOUT_S = 300.0
"""How long a concurrent measuring process waits for the others at the end of a round
before giving up (one round of the largest CPU preset takes well under a second)."""


# --- the result ----------------------------------------------------------------------------
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

    def stage_costs(self, parts: Sequence[int]) -> list[float]:
        """Predicted forward + backward seconds of each stage for one micro-batch."""
        from .partition import stage_costs

        return stage_costs(self.total, parts)

    def balanced(self, num_stages: int) -> list[int]:
        """The boundaries with the fastest possible slowest stage under this profile."""
        from .partition import partition

        return partition(self.total, num_stages, method="balanced")

    def compare_partitions(self, num_stages: int) -> list[dict[str, Any]]:
        """Uniform, DeepSpeed's parameter balance and the profile's exact balance side by
        side: boundaries, predicted per-stage cost (ms per micro-batch) and the bottleneck."""
        from .partition import partition

        params = [b // 4 for b in self.param_bytes]  # any scale works: only ratios matter
        rows = []
        for method in ("uniform", "parameters", "balanced"):
            parts = partition(self.total, num_stages, method=method,
                              **({"params": params} if method == "parameters" else {}))
            costs = self.stage_costs(parts)
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
        rows = self.table()
        cols = list(rows[0])
        widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
        lines = [self._head(), "  ".join(c.rjust(widths[c]) for c in cols)]
        lines += ["  ".join(str(r[c]).rjust(widths[c]) for c in cols) for r in rows]
        lines.append(f"total per micro-batch: {sum(self.total) * 1e3:.3f} ms "
                     "(the last layer includes the loss)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = self.table()
        for r in rows:
            r["share"] = f"{r['share']:.1%}"
        head = "".join(f"<th style='text-align:right'>{html.escape(k)}</th>" for k in rows[0])
        body = "".join("<tr>" + "".join(f"<td style='text-align:right'>{html.escape(str(v))}</td>"
                                        for v in r.values()) + "</tr>" for r in rows)
        return (f"<div><b>{html.escape(self._head())}</b><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table><p>total per micro-batch: "
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


# --- where and with how many threads ---------------------------------------------------------
def cache_dir() -> Path:
    """``$WORKBOOK_CACHE`` if set, else ``~/.cache/ds-pipeline-workbook``."""
    configured = os.environ.get("WORKBOOK_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "ds-pipeline-workbook"


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no GPU is visible; use device='cpu'")
    return device


def _device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(torch.cuda.current_device())
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


# --- measuring -----------------------------------------------------------------------------
def profile_layers(model: str = "gpt", *, model_options: Mapping[str, int] | None = None,
                   micro_batch_size: int = 4, device: str = "auto", threads: int | None = None,
                   concurrency: int = 1, warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS,
                   seed: int = DEFAULT_SEED,
                   cache: bool = True, measure: bool = True) -> LayerProfile | None:
    """Measure every layer of preset `model` on `device`, forward and backward.

    Args:
        model, model_options: the preset and its size overrides, as in `JobSpec`.
        micro_batch_size: samples per micro-batch; costs scale with it, so profile with the
            job's.
        device: ``"auto"`` (CUDA if visible, else CPU), ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads while measuring. On CPU None means 1, what each rank
            of a job gets when ranks >= cores; `profile_for_job` passes the job's count. On
            GPU None leaves the setting alone. Restored afterwards either way.
        concurrency: CPU only: measure in this many processes at once (each with `threads`
            threads) and pool their samples, so the costs include the contention of a job
            whose ranks share this machine; `profile_for_job` passes the job's world size.
            1 measures in this process.
        warmup: rounds run first and dropped (allocator growth, cold caches).
        repeats: rounds kept; the median is reported, the IQR as the spread.
        seed: seeds the layers (``seed + index``, as ``seed_layers=True`` does) and the batch.
        cache: reuse a cached profile with the same key if there is one, and store a new
            one; False always measures (and refreshes the cache).
        measure: False returns the cached profile, or None where there is none, and never
            measures.

    Returns:
        A `LayerProfile` (None only with ``measure=False`` and nothing cached);
        ``profile.total`` is the per-layer cost to partition on.
    """
    from .models import get_model

    for name, value, low in (("micro_batch_size", micro_batch_size, 1), ("warmup", warmup, 0),
                             ("repeats", repeats, 1), ("concurrency", concurrency, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    resolved = get_model(model, model_options)
    device = _resolve_device(device)
    if threads is None and device == "cpu":
        threads = 1
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if concurrency > 1 and device != "cpu":
        raise ValueError(f"concurrency={concurrency} applies to CPU profiles only: each rank of a "
                         "GPU job has a device of its own, so profile it with concurrency=1")
    key = _key(model, resolved.options, micro_batch_size=micro_batch_size, device=device,
               threads=threads, concurrency=concurrency, warmup=warmup, repeats=repeats, seed=seed)
    path = _cache_path(key)
    if cache:
        found = _read_cache(path, key)
        if found is not None:
            return found
    if not measure:
        return None
    profile = _measure(resolved, key) if concurrency == 1 else _measure_concurrently(resolved, key)
    _write_cache(path, key, profile)
    return profile


def profile_for_job(spec: JobSpec, *, cache: bool = True, measure: bool = True) -> LayerProfile | None:
    """The profile that matches job `spec`: its model, micro-batch size, device, seed and,
    on CPU, the thread count each of its ranks gets and as many processes measuring at once
    as it has ranks (`profile_layers` for the arguments)."""
    return profile_layers(spec.model, model_options=spec.model_options, cache=cache, measure=measure,
                          **_job_args(spec))


def cached_profile(spec: JobSpec) -> LayerProfile | None:
    """`profile_for_job(spec)` if it is already cached, else None; never measures (and never
    fails for a GPU job looked up on a machine without one)."""
    import torch

    if spec.resolved_device() == "cuda" and not torch.cuda.is_available():
        return None
    return profile_for_job(spec, measure=False)


def _job_args(spec: JobSpec) -> dict[str, Any]:
    device = spec.resolved_device()
    cpu = device == "cpu"
    return {"micro_batch_size": spec.micro_batch_size, "device": device, "seed": spec.seed,
            "threads": rank_threads(spec.world_size) if cpu else None,
            "concurrency": spec.world_size if cpu else 1}


def _key(model: str, options: Mapping[str, Any], *, micro_batch_size: int, device: str,
         threads: int | None, concurrency: int, warmup: int, repeats: int, seed: int) -> dict[str, Any]:
    """What a cached profile must match to be reused."""
    import torch

    return {"version": PROFILE_VERSION, "model": model, "options": dict(sorted(options.items())),
            "micro_batch_size": micro_batch_size, "device": device, "device_name": _device_name(device),
            "threads": threads, "concurrency": concurrency, "torch": torch.__version__,
            "warmup": warmup, "repeats": repeats, "seed": seed}


def launch_profile(spec: JobSpec) -> LayerProfile | None:
    """The layer profile a launch of `spec` uses: for ``partition="profile"`` the one that
    chooses its boundaries (measured if not cached); for other methods the cached one if
    there is one — a run is never delayed to measure a profile it does not need."""
    return profile_for_job(spec) if spec.partition == "profile" else cached_profile(spec)


def partition_record(spec: JobSpec, parts: Sequence[int], profile: LayerProfile | None) -> dict[str, Any]:
    """What ``partition.json`` of a run holds: the boundaries, how they were chosen, and the
    predicted forward + backward seconds per micro-batch of each stage from `profile`
    (`launch_profile(spec)`; None records no prediction)."""
    method = spec.partition if isinstance(spec.partition, str) else "explicit"
    return {
        "parts": [int(b) for b in parts],
        "method": method,
        "predicted_stage_costs": profile.stage_costs(parts) if profile else None,
        "layer_costs": profile.total if profile else None,
        "profile": None if profile is None else {
            "device": profile.device, "device_name": profile.device_name, "threads": profile.threads,
            "concurrency": profile.concurrency,
            "micro_batch_size": profile.micro_batch_size, "repeats": profile.repeats,
            "measured_at": profile.measured_at},
    }


class _Timer:
    """Seconds of one piece of work: host clock on CPU, CUDA events (then a synchronize) on GPU."""

    def __init__(self, device: str):
        import torch

        self.cuda = device == "cuda"
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

        self.cpu_seconds = 0.0
        """CPU time of this process inside the timed intervals (CPU device only)."""

    def start(self) -> None:
        if self.cuda:
            self.begin.record()
        else:
            self.c0 = time.process_time()
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1e3  # elapsed_time is in ms
        wall = time.perf_counter() - self.t0
        self.cpu_seconds += time.process_time() - self.c0
        return wall


def _measure(model, key: Mapping[str, Any], *, first_layer: int = 0, barrier=None) -> LayerProfile:
    """Measure every layer of `model` in this process (see the module docstring).

    `first_layer`: where each round-robin round starts (concurrent processes start at
    different layers). `barrier`: waited on after every round, so that concurrent processes
    run their rounds side by side."""
    import random

    import numpy
    import torch

    from .models import batches

    device, threads, seed = key["device"], key["threads"], key["seed"]
    warmup, repeats = key["warmup"], key["repeats"]
    previous_threads = torch.get_num_threads()
    python_rng, numpy_rng = random.getstate(), numpy.random.get_state()  # seed_layer reseeds them
    rng_devices = [torch.cuda.current_device()] if device == "cuda" else []
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        if device == "cpu":
            keep_freed_memory()
        with torch.random.fork_rng(devices=rng_devices):  # leave the caller's RNG untouched
            layers = list(model.build_sequential(seed=seed).to(device).train())  # seeded as a job's
            inputs, labels = next(batches(model, seed=seed, micro_batch_size=key["micro_batch_size"]))
            inputs, labels = inputs.to(device), labels.to(device)
            # The input each layer sees in the job: the previous layer's output on a real batch.
            xs, x = [], inputs
            with torch.no_grad():
                for layer in layers:
                    xs.append(x)
                    x = layer(x)
            outputs = xs[1:] + [x]
            generator = torch.Generator(device=device).manual_seed(seed)
            grads = [torch.randn(o.shape, generator=generator, device=device, dtype=o.dtype)
                     for o in outputs[:-1]]
            fwd = [[] for _ in layers]
            bwd = [[] for _ in layers]
            timer = _Timer(device)
            last = len(layers) - 1
            order = [(first_layer + k) % len(layers) for k in range(len(layers))]
            if device == "cuda":
                torch.cuda.synchronize()
            for round_ in range(warmup + repeats):
                if round_ == warmup:
                    timer.cpu_seconds = 0.0  # count the kept rounds only
                for i in order:
                    layer = layers[i]
                    inp = xs[i].detach()
                    if i > 0 and inp.is_floating_point():
                        inp.requires_grad_(True)  # a received activation requires grad
                    timer.start()
                    out = layer(inp)
                    if i == last:
                        out = model.loss_fn(out, labels)
                    f = timer.stop()
                    timer.start()
                    torch.autograd.backward(out, None if i == last else grads[i])
                    b = timer.stop()
                    del out, inp
                    if round_ >= warmup:
                        fwd[i].append(f)
                        bwd[i].append(b)
                if barrier is not None:
                    barrier.wait(BARRIER_TIMEOUT_S)
            return LayerProfile(
                model=key["model"], options=dict(key["options"]),
                micro_batch_size=key["micro_batch_size"], device=device,
                device_name=key["device_name"], threads=threads,
                concurrency=key["concurrency"], torch_version=key["torch"],
                warmup=warmup, repeats=repeats, seed=seed,
                layer_names=model.layer_names,
                **_timings(fwd, bwd),
                param_bytes=[sum(p.numel() * p.element_size() for p in layer.parameters())
                             for layer in layers],
                activation_bytes=[o.numel() * o.element_size() for o in outputs],
                measured_at=time.time(),
                core_share=None if device == "cuda" else
                timer.cpu_seconds / (sum(map(sum, fwd)) + sum(map(sum, bwd))) / (threads or 1))
    finally:
        torch.set_num_threads(previous_threads)
        random.setstate(python_rng)
        numpy.random.set_state(numpy_rng)


def _timings(fwd: list[list[float]], bwd: list[list[float]]) -> dict[str, list]:
    """The `LayerProfile` timing fields from per-layer forward and backward samples."""
    from .metrics import Spread

    fs, bs = [Spread.of(x) for x in fwd], [Spread.of(x) for x in bwd]
    return {"forward": [x.median for x in fs], "backward": [x.median for x in bs],
            "forward_iqr": [x.iqr for x in fs], "backward_iqr": [x.iqr for x in bs],
            "forward_samples": fwd, "backward_samples": bwd}


def _measure_concurrently(model, key: Mapping[str, Any]) -> LayerProfile:
    """`_measure` in ``key["concurrency"]`` fresh processes at once, their samples pooled.

    Process `k` starts its rounds at layer ``k * layers // concurrency`` and all wait for
    each other after every round, so that while one times a block another runs the head,
    as the stages of a job do. A process that fails ends the others (the barrier is
    broken) and its traceback is raised here; none is left running."""
    import multiprocessing
    import queue

    n = key["concurrency"]
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch state
    barrier = context.Barrier(n)
    results = context.Queue()
    workers = [context.Process(target=_measure_in_worker, daemon=True, name=f"profile-{k}",
                               args=(k, model.preset, model.options, dict(key),
                                     k * model.num_layers // n, barrier, results)) for k in range(n)]
    profiles: dict[int, dict[str, Any]] = {}
    try:
        for worker in workers:
            worker.start()
        while len(profiles) < n:
            try:
                k, outcome, payload = results.get(timeout=1.0)
            except queue.Empty:
                ended = [w for i, w in enumerate(workers) if i not in profiles and w.exitcode is not None]
                if not ended:
                    continue
                try:  # its report may still be on its way through the pipe
                    k, outcome, payload = results.get(timeout=5.0)
                except queue.Empty:
                    raise RuntimeError(f"profiling process {ended[0].name} exited with code "
                                       f"{ended[0].exitcode} without reporting") from None
            if outcome == "error":
                raise RuntimeError(f"profiling process {k} of {n} failed:\n{_root_cause(payload, results)}")
            profiles[k] = payload
    finally:
        if len(profiles) < n:  # failed or interrupted: release and stop the others now
            barrier.abort()
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()
    parts = [LayerProfile.from_dict(profiles[k]) for k in range(n)]
    fwd = [[t for p in parts for t in p.forward_samples[i]] for i in range(model.num_layers)]
    bwd = [[t for p in parts for t in p.backward_samples[i]] for i in range(model.num_layers)]
    return replace(parts[0], **_timings(fwd, bwd), measured_at=max(p.measured_at for p in parts),
                   core_share=sum(p.core_share for p in parts) / n)


def _root_cause(first: str, results) -> str:
    """The traceback to show for a failed concurrent profile: the first report that is not
    merely a peer's broken barrier (a process that fails breaks the barrier for the others,
    whose reports may arrive first)."""
    import queue

    if "BrokenBarrierError" not in first:
        return first
    deadline = time.monotonic() + 5.0
    while (left := deadline - time.monotonic()) > 0:
        try:
            _, outcome, payload = results.get(timeout=left)
        except queue.Empty:
            break
        if outcome == "error" and "BrokenBarrierError" not in payload:
            return payload
    return first


def _measure_in_worker(index: int, preset: str, options: Mapping[str, Any], key: Mapping[str, Any],
                       first_layer: int, barrier, results) -> None:
    """Body of process `index` of `_measure_concurrently`: measure, then report through
    `results` as ``(index, "ok", profile dict)`` or ``(index, "error", traceback)``."""
    import traceback

    try:
        from .models import get_model

        profile = _measure(get_model(preset, options), key, first_layer=first_layer, barrier=barrier)
        results.put((index, "ok", profile.to_dict()))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        barrier.abort()
        results.put((index, "error", traceback.format_exc()))


# --- the cache -----------------------------------------------------------------------------
def _cache_path(key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"{key['model']}-{digest}.json"


_written: dict[Path, LayerProfile] = {}
"""Profiles this process measured, by cache file: the fallback when the file cannot be
written or read, so a notebook on a read-only home does not measure the same profile again
for every run."""


def _read_cache(path: Path, key: Mapping[str, Any]) -> LayerProfile | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") == json.loads(json.dumps(key)):
            return LayerProfile.from_dict(data["profile"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable
    if path in _written:
        return replace(_written[path], cached=True)
    return None


def _write_cache(path: Path, key: Mapping[str, Any], profile: LayerProfile) -> None:
    _written[path] = profile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        from .runs import write_json

        write_json(path, {"key": key, "profile": profile.to_dict()})
    except OSError as exc:
        import warnings

        warnings.warn(f"could not cache the layer profile in {path.parent} ({exc}); "
                      "set WORKBOOK_CACHE to a writable folder", stacklevel=3)
