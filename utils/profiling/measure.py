"""Timing every layer of a model: in this process, or in several processes at once.

`utils.profiling.profile.profile_layers` decides what to measure and caches it; this module
only measures (see that module's docstring for what is measured and why it matches a stage).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from utils.profiling.result import LayerProfile
from utils.system.cpu import keep_freed_memory

BARRIER_TIMEOUT_S = 300.0
"""How long a concurrent measuring process waits for the others at the end of a round
before giving up (one round of the largest CPU preset takes well under a second)."""


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


def measure_layers(model, key: Mapping[str, Any], *, first_layer: int = 0, barrier=None) -> LayerProfile:
    """Measure every layer of `model` in this process (see the module docstring).

    `first_layer`: where each round-robin round starts (concurrent processes start at
    different layers). `barrier`: waited on after every round, so that concurrent processes
    run their rounds side by side.

    On CUDA the layers, their activations and gradients (GBs for ``gpt-large``) are gone when
    `_measure_rounds` returns, but PyTorch's caching allocator keeps their memory reserved in
    this process, which is usually the notebook's, on ``cuda:0``, where rank 0 of the next job
    trains: it is handed back to the device here.
    """
    try:
        return _measure_rounds(model, key, first_layer=first_layer, barrier=barrier)
    finally:
        if key["device"] == "cuda":
            import torch

            torch.cuda.empty_cache()


def _measure_rounds(model, key: Mapping[str, Any], *, first_layer: int, barrier) -> LayerProfile:
    """`measure_layers`' measurement; every tensor it makes is local to this call."""
    import random

    import numpy
    import torch

    from utils.workloads.models import batches

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
    from utils.analysis.summary import Spread

    fs, bs = [Spread.of(x) for x in fwd], [Spread.of(x) for x in bwd]
    return {"forward": [x.median for x in fs], "backward": [x.median for x in bs],
            "forward_iqr": [x.iqr for x in fs], "backward_iqr": [x.iqr for x in bs],
            "forward_samples": fwd, "backward_samples": bwd}


def measure_concurrently(model, key: Mapping[str, Any]) -> LayerProfile:
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
        from utils.workloads.models import get_model

        profile = measure_layers(get_model(preset, options), key, first_layer=first_layer, barrier=barrier)
        results.put((index, "ok", profile.to_dict()))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        barrier.abort()
        results.put((index, "error", traceback.format_exc()))
