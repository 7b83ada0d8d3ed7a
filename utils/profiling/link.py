"""What crosses a pipeline stage boundary, and what the link costs: both measured.

`cut_bytes` runs one micro-batch through a model and reads every layer's output: the tensor
DeepSpeed's ``SendActivation`` sends across a cut there, and (same shape and dtype) the
gradient ``SendGrad`` sends back. `measure_link` times blocking point-to-point messages
between two real processes (gloo on CPU, NCCL on two GPUs) and fits ``latency + bytes /
bandwidth`` (alpha-beta), so a cut's bytes become seconds a partitioner can weigh
(`utils.partition_layers(..., link_cost=...)`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from utils.system.paths import PROJECT_ROOT
from utils.system.procs import end_process_tree


@dataclass(frozen=True)
class Cut:
    """The tensors crossing the cut between layer `after` and layer ``after + 1``; `nbytes`
    per micro-batch forward (activation), and as much again backward (its gradient)."""

    after: int
    sender: str
    receiver: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    nbytes: int


def measure_cuts(layers: Sequence, inputs) -> list[Cut]:
    """Run `inputs` through `layers` (no grad); a `Cut` for every output but the last."""
    import torch

    cuts, x = [], inputs
    with torch.no_grad():
        for i, layer in enumerate(layers[:-1]):
            x = layer(x)
            ts = tuple(x) if isinstance(x, (tuple, list)) else (x,)
            cuts.append(Cut(i, type(layer).__name__, type(layers[i + 1]).__name__,
                            tuple(tuple(t.shape) for t in ts), tuple(str(t.dtype).removeprefix("torch.") for t in ts),
                            sum(t.numel() * t.element_size() for t in ts)))
    return cuts


def cut_bytes(model, micro_batch_size: int, *, seq_len: int | None = None, seed: int = 0,
              dtype=None, device: str = "cpu") -> list[Cut]:
    """Every possible boundary of a `utils.get_model(...)` model for one micro-batch
    (`seq_len` tokens, None: the preset's; weights cast to `dtype`, None: fp32), run on
    `device`. Measured on a real batch rather than computed, so an unexpected output (a
    tuple, another width) shows. The caller's CPU random state is left as it was."""
    import random

    import numpy
    import torch

    py_state, np_state = random.getstate(), numpy.random.get_state()  # build_sequential reseeds them
    try:
        with torch.random.fork_rng(devices=[]):
            with torch.device(device):
                layers = list(model.build_sequential(seed=seed))
            inputs = model.make_batch(torch.Generator().manual_seed(seed), micro_batch_size, seq_len)[0].to(device)
            if dtype is not None:
                layers = [layer.to(dtype) for layer in layers]
                inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
            return measure_cuts(layers, inputs)
    finally:
        random.setstate(py_state)
        numpy.random.set_state(np_state)


@dataclass(frozen=True)
class LinkFit:
    """The alpha-beta model: ``seconds(n) = latency_s + n / bandwidth`` (bytes/s)."""

    latency_s: float
    bandwidth: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth


@dataclass(frozen=True)
class LinkMeasurement:
    """One-way seconds per message size (every sample) and the alpha-beta fit."""

    sizes: tuple[int, ...]
    samples: tuple[tuple[float, ...], ...]
    fit: LinkFit
    """Fitted to `fastest`: a shared machine only ever adds time to a message."""
    backend: str

    @property
    def seconds(self) -> list[float]:
        """Median one-way time per size: what a message typically took here."""
        return [statistics.median(x) for x in self.samples]

    @property
    def fastest(self) -> list[float]:
        """Shortest one-way time per size: the link itself, least disturbed."""
        return [min(x) for x in self.samples]

    def relative_error(self, fit: LinkFit | None = None) -> list[float]:
        """``fit / fastest - 1`` per size (default: this fit): where the line holds."""
        return [(fit or self.fit).seconds(n) / t - 1 for n, t in zip(self.sizes, self.fastest)]


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> LinkFit:
    """Least squares on the relative error, so every size counts alike across decades of
    sizes; a negative latency is clamped to 0 (the line then goes through the origin)."""
    import numpy

    x, t = numpy.asarray(sizes, float), numpy.asarray(seconds, float)
    (alpha, beta), *_ = numpy.linalg.lstsq(numpy.stack([1 / t, x / t], axis=1), numpy.ones_like(t), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, (x / t).sum() / ((x / t) ** 2).sum()
    if beta <= 0:
        raise ValueError(f"time does not grow with size ({list(seconds)}): no bandwidth to fit")
    return LinkFit(float(alpha), float(1 / beta))


def measure_link(sizes_bytes: Iterable[int], *, repeats: int = 9, warmup: int = 2, device: str = "cpu",
                 timeout: float = 60.0) -> LinkMeasurement:
    """Ping-pong each size between two fresh processes on 127.0.0.1 with blocking
    ``send``/``recv``, as DeepSpeed's pipeline does: one-way time = half a round trip, median
    of `repeats` after `warmup`. Both processes are ended on return, on error and after
    `timeout` seconds (TimeoutError)."""
    sizes = [int(n) for n in sizes_bytes]
    if not sizes or min(sizes) < 1 or repeats < 1 or warmup < 0 or device not in ("cpu", "cuda"):
        raise ValueError(f"need sizes >= 1 byte, repeats >= 1, warmup >= 0 and device 'cpu' or 'cuda'; "
                         f"got {sizes}, {repeats}, {warmup}, {device!r}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    deadline, procs = time.monotonic() + timeout, []
    with tempfile.TemporaryDirectory(prefix="link-") as tmp:
        logs, result = [Path(tmp, f"rank{r}.log") for r in range(2)], Path(tmp, "samples.json")
        args = [str(port), device, str(repeats), str(warmup), str(timeout), ",".join(map(str, sizes)), str(result)]
        try:
            for r in range(2):
                with open(logs[r], "wb") as log:
                    procs.append(subprocess.Popen([sys.executable, "-m", __name__, str(r), *args], cwd=PROJECT_ROOT,
                                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))
            while not all(p.poll() == 0 for p in procs):
                failed = next((r for r, p in enumerate(procs) if p.returncode), None)
                if failed is not None:
                    raise RuntimeError(f"link benchmark process {failed} failed:\n"
                                       + logs[failed].read_text(errors="replace")[-3000:])
                if time.monotonic() > deadline:
                    raise TimeoutError(f"link benchmark did not finish within {timeout:.0f} s")
                time.sleep(0.02)
            samples = json.loads(result.read_text())
        finally:
            for p in procs:
                if p.poll() is None:
                    end_process_tree(p.pid, grace=1.0)
                p.wait()
    return LinkMeasurement(tuple(sizes), tuple(map(tuple, samples)), fit_alpha_beta(sizes, [min(x) for x in samples]),
                           "nccl" if device == "cuda" else "gloo")


def _ping_pong(rank: int, port: int, device: str, repeats: int, warmup: int, timeout: float,
               sizes: list[int]) -> list[list[float]]:
    """One benchmark process: one-way seconds per size (rank 0's timing is the one kept)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2, timeout=timedelta(seconds=timeout))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ops, samples = (dist.send, dist.recv) if rank == 0 else (dist.recv, dist.send), []
    for size in sizes:
        buf, times = torch.zeros(size, dtype=torch.uint8, device=device), []
        for i in range(warmup + repeats):
            sync()
            t0 = time.perf_counter()
            for op in ops:
                op(buf, 1 - rank)
            sync()
            times += [(time.perf_counter() - t0) / 2] if i >= warmup else []
        samples.append(times)
    dist.barrier()
    return samples


if __name__ == "__main__":  # python -m utils.profiling.link RANK PORT DEVICE REPEATS WARMUP TIMEOUT SIZES OUT
    try:
        _a = sys.argv[1:9]
        _samples = _ping_pong(int(_a[0]), int(_a[1]), _a[2], int(_a[3]), int(_a[4]), float(_a[5]),
                              [int(x) for x in _a[6].split(",")])
        if _a[0] == "0":
            Path(_a[7]).write_text(json.dumps(_samples))
    except BaseException:  # noqa: BLE001 - the parent shows this process's log
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # skip process-group teardown, which can hang on gloo
