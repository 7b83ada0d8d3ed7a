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
  the same torch thread count a rank gets (`rank_threads`, as the job launcher sets
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
the run (a shared VM's neighbours). the job plan (`utils.jobs.plan`) records the prediction next to the
measured run, so the gap can be checked rather than assumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from utils import validation
from utils.profiling.measure import measure_concurrently, measure_layers
from utils.profiling.result import PROFILE_VERSION, LayerProfile
from utils.system.devices import resolve_device
from utils.workloads.presets import is_import_path

__all__ = ["LayerProfile", "cache_dir", "profile_layers"]

DEFAULT_SEED = 1234
"""`JobSpec.seed`'s default: layers and data are seeded like a job with it."""
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 15
"""Enough rounds to span about a second on the default ``gpt`` preset on CPU: a shared
machine's speed drifts over seconds, and a job's steps average over that drift too."""


# --- where and with how many threads ---------------------------------------------------------
def cache_dir() -> Path:
    """``$WORKBOOK_CACHE`` if set, else ``~/.cache/ds-pipeline-workbook``."""
    configured = os.environ.get("WORKBOOK_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "ds-pipeline-workbook"


def _resolve_device(device: str) -> str:
    import torch

    device = resolve_device(device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no GPU is visible; use device='cpu'")
    return device


def _device_name(device: str) -> str:
    """The model name of the device a profile is for: part of the cache key, so it is read on
    every job's launch, where a cached profile is looked up. For CUDA it comes from
    ``nvidia-smi``, not from torch: ``torch.cuda.get_device_name`` initialises CUDA and
    opens a context (hundreds of MB on the GPU) in the launching process on every launch."""
    if device == "cuda":
        return _gpu_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _gpu_name() -> str:
    """The first visible GPU's name from the driver's ``nvidia-smi`` (GPU 0 of
    ``CUDA_VISIBLE_DEVICES``, which is where a job's rank 0 and the profiler run). Only when
    there is no ``nvidia-smi`` does it ask torch, which initialises CUDA."""
    import shutil
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    smi = shutil.which("nvidia-smi")
    if smi:
        select = [f"--id={visible}"] if visible else []
        done = subprocess.run([smi, *select, "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
        names = done.stdout.strip().splitlines()
        if done.returncode == 0 and names:
            return names[0].strip()
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())


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
    from utils.workloads.models import get_model

    for name, value, low in (("micro_batch_size", micro_batch_size, 1), ("warmup", warmup, 0),
                             ("repeats", repeats, 1), ("concurrency", concurrency, 1)):
        validation.count(name, value, minimum=low)
    resolved = get_model(model, model_options)
    device = _resolve_device(device)
    if threads is None and device == "cpu":
        threads = 1
    if threads is not None:
        validation.count("threads", threads)
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
    profile = measure_layers(resolved, key) if concurrency == 1 else measure_concurrently(resolved, key)
    _write_cache(path, key, profile)
    return profile


def _key(model: str, options: Mapping[str, Any], *, micro_batch_size: int, device: str,
         threads: int | None, concurrency: int, warmup: int, repeats: int, seed: int) -> dict[str, Any]:
    """What a cached profile must match to be reused."""
    import torch

    # A learner's model (an import path) changes under the same name: its source is part of the key.
    source = {"source": _source_digest(model)} if is_import_path(model) else {}
    return {"version": PROFILE_VERSION, "model": model, "options": dict(sorted(options.items())),
            "micro_batch_size": micro_batch_size, "device": device, "device_name": _device_name(device),
            "threads": threads, "concurrency": concurrency, "torch": torch.__version__,
            "warmup": warmup, "repeats": repeats, "seed": seed, **source}


def _source_digest(model: str) -> str:
    from utils.workloads.custom import source_digest

    return source_digest(model)


# --- the cache -----------------------------------------------------------------------------
def _cache_path(key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", key["model"])  # an import path's ':' stays out of file names
    return cache_dir() / "profiles" / f"{name}-{digest}.json"


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
        from utils.system.fileio import write_json

        write_json(path, {"key": key, "profile": profile.to_dict()})
    except OSError as exc:
        import warnings

        warnings.warn(f"could not cache the layer profile in {path.parent} ({exc}); "
                      "set WORKBOOK_CACHE to a writable folder", stacklevel=3)
