"""`JobSpec`: everything that defines one pipeline training job, as plain typed data.

A spec is plain data (it is saved as ``spec.json`` in the run directory and read back by
every rank), so a job can be reproduced from its record alone. `JobSpec.check()` is the one
place a spec is validated: it turns every mistake DeepSpeed would only report from inside
N processes — or silently ignore — into one clear error in the notebook, before any
process starts. What a spec *means* on this machine (device, boundaries, profile) is
decided by `utils.jobs.plan.plan_job`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, get_args

from utils import validation
from utils.jobs.fault import Fault, check_fault
from utils.jobs.hosts import LauncherName, check_nodes
from utils.jobs.spec_checks import (LossNormalisation, OptimizerCarry, Precision, RepartitionMode, check_batching,
                                    check_config, check_dynamic, count as _count,
                                    is_sequence as _is_sequence)
from utils.jobs.spec_runtime import RuntimeChoice, check_runtime
from utils.planning.catalogue import SCHEDULE_NAMES, schedule_info
from utils.planning.microbatching import Batching, MicroBatchOrder, MicroBatchPolicy
from utils.planning.rebalance import Rebalance
from utils.system.devices import Device
from utils.workloads.presets import model_shape

if TYPE_CHECKING:
    from utils.jobs.configlint import Finding

JOB_SCHEDULES: tuple[str, ...] = SCHEDULE_NAMES
"""Schedules a job runs: every schedule of the catalogue (`utils.planning.catalogue`), each on the
runtimes its record names (`JobSpec.runtime`)."""
JobSchedule = Literal[JOB_SCHEDULES]  # type: ignore[valid-type]
PartitionMethod = Literal["uniform", "parameters", "profile"]
"""Partition methods by name: DeepSpeed's ``uniform`` and ``parameters``, and ``profile``
(measured per-layer cost, exact balance), which DeepSpeed names but does not implement.
DeepSpeed's ``type:REGEX`` is left out on purpose (see `utils.jobs.plan.plan_boundaries`)."""

PARTITION_METHODS: tuple[str, ...] = get_args(PartitionMethod)
DEVICES: tuple[str, ...] = get_args(Device)
@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One real pipeline job: model, parallelism, batch, schedule (and the runtime that runs it) and limits."""

    model: str = "gpt"
    """Model preset (see `utils.workloads.models.PRESETS`): ``"gpt"``, ``"gpt-large"``, ``"mlp"``,
    ``"seed-case"``; or your own model as an import path ``"package.module:function"``: the
    function takes `model_options` as keyword arguments and returns a `utils.ModelDef` (layers,
    loss, data; `utils.workloads.custom`)."""
    model_options: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of the preset's sizes, e.g. ``{"blocks": 10, "vocab": 16384}``; for your own
    model, the keyword arguments of its function (JSON values: they are saved with the run)."""
    num_stages: int = 2
    """Pipeline stages (PipelineModule ``num_stages``)."""
    data_parallel: int = 1
    """Data-parallel replicas of the whole pipeline; processes = num_stages × data_parallel."""
    micro_batches: int = 4
    """Micro-batches per step (DeepSpeed's ``gradient_accumulation_steps``)."""
    micro_batch_size: int = 4
    """Samples per micro-batch (``train_micro_batch_size_per_gpu``)."""
    train_batch_size: int | None = None
    """Optional: the global batch you intend. If given it must equal micro_batch_size ×
    micro_batches × data_parallel, which DeepSpeed asserts; None derives it."""
    partition: PartitionMethod | Sequence[int] = "parameters"
    """``"uniform"`` (layer count), ``"parameters"`` (DeepSpeed's default), ``"profile"``
    (measure every layer's forward + backward time on the job's device, then the exact
    min-max balance; see `utils.profiling.profile`), or explicit boundaries ``[0, b1, ..., n_layers]``
    (stage s runs layers b_s .. b_{s+1}-1); a list is kept as a tuple, so two specs with
    the same boundaries are equal however they were written."""
    schedule: JobSchedule = "1f1b"
    """A schedule of the catalogue (`utils.planning.catalogue`): ``"1f1b"`` (DeepSpeed's
    TrainSchedule), ``"gpipe"`` (all forwards, then all backwards), ``"interleaved-1f1b"``,
    ``"zb-h1"``, ``"dualpipev"``, ``"zbv"``; `runtime` says which runtime runs it."""
    chunks: int | None = None
    """Model chunks per rank (virtual stages = num_stages × chunks): None takes the schedule's
    default (2 for ``interleaved-1f1b`` and the V schedules, else 1); ``interleaved-1f1b``
    takes any count >= 2, the others only their own."""
    runtime: RuntimeChoice = "auto"
    """What runs the ranks: ``"deepspeed"`` (DeepSpeed's `PipelineEngine`, ``"1f1b"`` and
    ``"gpipe"``), ``"torch"`` (``torch.distributed.pipelining``, every schedule), or ``"auto"``:
    the schedule's first runtime in the catalogue, DeepSpeed where it can (`resolved_runtime`)."""
    steps: int = 3
    """Training steps (``train_batch`` calls)."""
    seed: int = 1234
    """Seeds the layers (``seed_layers=True``, ``base_seed``) and the data."""
    lr: float = 3e-3
    """Adam(W) learning rate."""
    lr_warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0 to `lr` (DeepSpeed's ``WarmupLR``
    scheduler); 0: no scheduler, a constant `lr`."""
    device: Device = "auto"
    """``"auto"``: CUDA + NCCL when there is a GPU for every rank, else CPU + gloo; or
    ``"cpu"`` / ``"cuda"`` (see `utils.system.devices.resolve_device`)."""
    timeout: float = 300.0
    """Seconds the whole job may take; a hung job is stopped and reported after this."""
    pg_timeout: float | None = None
    """Seconds one send, receive or collective on the job's default process group may wait before
    it raises (``deepspeed.init_distributed(timeout=...)``; `utils.runtime.pgjoin`). None: DeepSpeed's
    ``DEEPSPEED_TIMEOUT`` (whole minutes), which the launcher sets longer than `timeout`."""
    name: str = ""
    """A short label for the run directory and plots."""
    fault: Fault | None = None
    """Inject a failure (teaching and tests); None for a normal run."""

    # --- where the ranks run: nodes and the launcher (`utils.jobs.hosts`) --------------------------
    hosts: Sequence[str] = ()
    """Nodes to spread the ranks over, world_size / len(hosts) each: real hosts, or loopback
    addresses (``["127.0.0.1", "127.0.0.2"]``: two nodes on this machine). Empty: this
    machine alone (``torchrun --standalone``)."""
    hostfile: str | None = None
    """Instead of hosts: the path of a DeepSpeed hostfile (one ``HOST slots=N`` per line)."""
    launcher: LauncherName = "torchrun"
    """``"torchrun"``: one torchrun agent per node, meeting in a c10d rendezvous on node 0;
    ``"deepspeed"``: DeepSpeed's runner (``deepspeed --hostfile``), which reaches other hosts
    through pdsh and ssh."""
    join_timeout: float = 60.0
    """Seconds every node has to join the job (torchrun's rendezvous ``join_timeout``, at most
    `timeout`: `join_limit`); a node that never joins ends the job with an error naming it."""

    # --- configuration: precision, ZeRO, activation checkpointing, raw DeepSpeed keys ------------
    precision: Precision = "fp32"
    """``"fp32"``; ``"bf16"`` (DeepSpeed's ``bf16`` section: bf16 weights and activations, fp32
    master weights in the optimizer); ``"fp16"`` (``fp16`` with dynamic loss scaling; DeepSpeed
    supports it on CUDA only)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (``zero_optimization.stage``). Pipelines accept 0 and 1 (optimizer
    state sharded over the data-parallel replicas); DeepSpeed rejects 2 and 3 with pipeline
    parallelism."""
    activation_checkpoint_interval: int = 0
    """``PipelineModule(activation_checkpoint_interval=k)``: keep only every k-th layer's input
    during the forward and recompute the rest in the backward; 0: keep every activation."""
    deepspeed_config: Mapping[str, Any] = field(default_factory=dict)
    """Extra DeepSpeed config keys, merged over the config the spec generates (section by
    section), e.g. ``{"gradient_clipping": 0.0}``. The merged config is linted before launch
    (`utils.jobs.configlint.lint_config`): errors stop the job, warnings become notes."""
    strict: bool = True
    """False launches even when the linter finds errors, so that a chapter can show DeepSpeed's
    own error message (the job then fails inside its ranks)."""

    # --- the dynamic half: what changes while the job runs -------------------------------------
    repartition_at: Mapping[int, Sequence[int]] = field(default_factory=dict)
    """Forced re-partitions (teaching and tests): ``{step: boundaries}`` moves the running job
    to `boundaries` before training step `step` (1 <= step < steps)."""
    repartition_mode: RepartitionMode = "live"
    """``"live"``: the ranks stay up, rebuild their engines and send every moved layer's
    parameters and optimizer state to its new rank. ``"restart"``: the baseline: a DeepSpeed
    checkpoint, the ranks exit, a new launch at the new boundaries loads the weights and
    remaps the optimizer state layer by layer (which DeepSpeed's own loader cannot do)."""
    repartition_optimizer: OptimizerCarry = "remap"
    """``"remap"``: each layer's Adam moments and step count go with it. ``"drop"``: moved
    and kept layers alike start from fresh optimizer state after a re-partition, as when a
    checkpoint is loaded without its optimizer: there to show what carrying it is worth.
    ``"deepspeed"`` (restart mode only): DeepSpeed's own ``load_checkpoint`` loads each stage's
    saved optimizer state into the stage of the same number, pairing its flat list by
    position: a size error where a stage's parameter count changed, another layer's moments
    without a word where it did not (the pitfall `remap` avoids)."""
    rebalance: Rebalance | None = None
    """Let the job re-partition itself: measure per-layer cost while it trains and move to the
    exact min-max partition when the predicted saving pays for the move (see
    `utils.planning.rebalance.Rebalance`); live mode only."""
    freeze_at: Mapping[int, int] = field(default_factory=dict)
    """Progressive layer freezing: ``{step: n}`` freezes the first `n` layers from `step` on
    (no weight gradients, no optimizer update, no backward through a frozen prefix). `n`
    never decreases and stays below the layer count."""
    batching: Batching = "fixed"
    """How a step's samples become micro-batches (`utils.planning.microbatching`): ``"fixed"``
    (every sample `seq_len` long, no padding) or, with variable-length samples
    (`utils.workloads.varlen`), ``"pad-to-max"``, ``"sorted"``, ``"token-budget"``,
    ``"packing"`` or DeepSpeed's own dynamic batching, ``"deepspeed"`` (its sample count per
    step varies and it scales the learning rate; the others keep the global batch)."""
    lengths: Sequence[int] | None = None
    """Variable-length batching: the sample lengths to cycle through; None draws them from
    the long-tailed default (log-normal, see `utils.workloads.varlen`)."""
    token_budget: int | None = None
    """The activation-memory cap of ``"token-budget"`` and ``"packing"`` batching: the most
    padded tokens one micro-batch may hold (at least the longest sample; for packing a row, the
    model's ``seq_len``). For ``"deepspeed"`` it is DeepSpeed's ``max_tokens``, which counts
    real tokens only: its micro-batches, padded to the step's longest sample, can hold more."""
    dynamic_shape: bool = False
    """Build ``PipelineModule(dynamic_shape=True)`` even where every micro-batch of a step has
    one shape (fixed, pad-to-max, packing, deepspeed, a new count): one metadata message per
    micro-batch and boundary instead of one per shape change (``reset_activation_shape()``,
    chapter 19). Sorted and token-budget batching always need it."""
    loss_per: LossNormalisation = "token"
    """``"token"``: the loss is the mean over the real tokens of the whole batch, whatever the
    micro-batches; ``"micro-batch"``: the mean inside each micro-batch, averaged (the naive
    way, whose gradient depends on the cut; there to compare)."""
    micro_batch_order: MicroBatchOrder = "as-planned"
    """Variable-length batching: the order a step's micro-batches run in (``"as-planned"``,
    ``"longest-first"``, ``"shortest-first"``, ``"random"``; see
    `utils.planning.microbatching.reorder`): the same gradient, another fill and drain."""
    micro_batch_policy: MicroBatchPolicy | None = None
    """Let the job choose its micro-batch count under an activation-memory budget, and change
    it when the measured stage costs change (`utils.planning.microbatching.MicroBatchPolicy`);
    fixed-length batching, instead of micro_batches_at."""
    micro_batches_at: Mapping[int, int] = field(default_factory=dict)
    """``{step: m}``: from `step` on, cut the same global batch into `m` micro-batches (each
    of micro_batch_size × micro_batches / m samples)."""
    seq_len_at: Mapping[int, int] = field(default_factory=dict)
    """A sequence-length curriculum (``gpt`` presets): ``{step: tokens}`` trains on samples of
    `tokens` tokens from `step` on (at most the preset's ``seq_len``; before the first entry
    the preset's ``seq_len``)."""

    def __post_init__(self) -> None:
        # numpy integers (from a sweep) are fine counts: stored as int so the spec is JSON.
        for name in _INTEGER_FIELDS:
            object.__setattr__(self, name, _plain_int(getattr(self, name)))
        if not isinstance(self.partition, str) and hasattr(self.partition, "__iter__"):  # list, array
            object.__setattr__(self, "partition", tuple(_plain_int(b) for b in self.partition))
        if isinstance(self.hosts, list):
            object.__setattr__(self, "hosts", tuple(self.hosts))
        if isinstance(self.model_options, Mapping):
            object.__setattr__(self, "model_options", {k: _plain_int(v) for k, v in self.model_options.items()})
        # Step-keyed maps come back from JSON with string keys; boundaries as tuples (comparable).
        if _is_sequence(self.lengths):
            object.__setattr__(self, "lengths", tuple(_plain_int(x) for x in self.lengths))
        for name in ("repartition_at", "freeze_at", "seq_len_at", "micro_batches_at"):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, {_step_key(k): _plain_int(v) if name != "repartition_at" else
                                                (tuple(_plain_int(b) for b in v) if _is_sequence(v) else v)
                                                for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))})

    # --- derived -------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.num_stages * self.data_parallel

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.micro_batches * self.data_parallel

    @property
    def resolved_runtime(self) -> str:
        """``"deepspeed"`` or ``"torch"``: `runtime`, with ``"auto"`` resolved from the catalogue."""
        return schedule_info(self.schedule).runtimes[0] if self.runtime == "auto" else self.runtime

    @property
    def model_chunks(self) -> int:
        """Model chunks per rank the schedule runs (`chunks`, or the catalogue's default)."""
        return schedule_info(self.schedule).chunks_for(self.chunks)

    @property
    def virtual_stages(self) -> int:
        """Pieces the model is cut into: num_stages × model_chunks (the partition's stage count)."""
        return self.num_stages * self.model_chunks

    @property
    def join_limit(self) -> int:
        """Whole seconds the nodes have to join: `join_timeout`, at most `timeout` (torchrun
        reads an integer)."""
        return max(1, math.ceil(min(self.join_timeout, self.timeout)))

    def stage_of_rank(self, rank: int) -> int:
        """DeepSpeed's stage-major layout: rank = stage × data_parallel + replica."""
        return rank // self.data_parallel

    @classmethod
    def for_this_machine(cls, **fields) -> JobSpec:
        """A spec sized for where it runs, from one code path: with a GPU for each of its
        num_stages × data_parallel ranks the GPU-sized ``gpt-large`` on CUDA, else the
        CPU-sized ``gpt`` on CPU. Fields given explicitly always win, and an explicit
        ``device`` also picks the model that fits it."""
        from utils.system.devices import resolve_device

        device = resolve_device(fields.get("device", "auto"), ranks=cls(**fields).world_size)
        defaults = {"model": "gpt-large" if device == "cuda" else "gpt"}
        return cls(**{**defaults, **fields, "device": device})

    # --- checking ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ValueError (TypeError for a value of the wrong type), naming the field and
        saying what to change, for anything DeepSpeed would reject, silently ignore or hang
        on. Every field is checked here, before any process starts."""
        for name in _COUNT_FIELDS:
            _count(name, getattr(self, name))
        if not isinstance(self.model, str):
            raise TypeError(f"model must be a preset name such as 'gpt' or an import path 'package.module:function', "
                            f"got {self.model!r}")
        if not isinstance(self.model_options, Mapping) or not all(isinstance(k, str) for k in self.model_options):
            raise TypeError(f"model_options must be a dict of option name -> value, got {self.model_options!r}")
        n = self.shape.num_layers
        check_runtime(self, n)  # schedule, chunks, runtime, and what the runtime cannot do
        if self.virtual_stages > n:
            pieces = (f"num_stages={self.num_stages}" if self.model_chunks == 1 else
                      f"num_stages × chunks = {self.num_stages} × {self.model_chunks} = {self.virtual_stages} "
                      "virtual stages")
            raise ValueError(f"{pieces} but model {self.model!r} has only {n} layers: every stage needs at least "
                             f"one layer; use num_stages <= {n // self.model_chunks} or more blocks "
                             f"(model_options={{'blocks': ...}})")
        if self.train_batch_size is not None:
            _count("train_batch_size", self.train_batch_size)
            if self.train_batch_size != self.global_batch:
                raise ValueError(
                    f"train_batch_size={self.train_batch_size} but micro_batch_size × micro_batches × "
                    f"data_parallel = {self.micro_batch_size} × {self.micro_batches} × {self.data_parallel} = "
                    f"{self.global_batch}; DeepSpeed asserts they are equal. {_say_fixes(self, batch_fixes(self))}")
        if isinstance(self.partition, str):
            if self.partition not in PARTITION_METHODS:
                raise ValueError(f"unknown partition {self.partition!r}; use one of {PARTITION_METHODS} "
                                 "or explicit boundaries [0, b1, ..., n_layers]")
        else:
            try:
                validation.boundaries(self.partition, n_layers=n, num_stages=self.virtual_stages)
            except ValueError as exc:
                where = "" if self.model_chunks == 1 else f" (one piece per virtual stage: {self.virtual_stages})"
                raise ValueError(f"partition{where}: {exc}") from None
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; choose one of {DEVICES}")
        _positive_number("lr", self.lr, "a learning rate such as 3e-3")
        _positive_number("timeout", self.timeout, "seconds the whole job may take, such as 600")
        if self.pg_timeout is not None:
            _positive_number("pg_timeout", self.pg_timeout, "seconds one send, receive or collective may wait, "
                             "such as 60; None for DeepSpeed's DEEPSPEED_TIMEOUT")
            if self.pg_timeout < 1:
                raise ValueError(f"pg_timeout={self.pg_timeout!r} s is too short: the ranks also connect to each "
                                 "other under it when the process group is created; give at least 1 s")
        _count("seed", self.seed, minimum=0)
        _count("lr_warmup_steps", self.lr_warmup_steps, minimum=0)
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {self.name!r}")
        check_dynamic(self, n)
        check_batching(self)
        check_config(self)
        if self.fault is not None:
            check_fault(self)
        check_nodes(self)

    def lint(self, *, device: str | None = None) -> list[Finding]:
        """`lint_config`'s findings on the DeepSpeed config this spec runs with
        (`utils.jobs.config.deepspeed_config`, `deepspeed_config` merged in), on `device`
        (``"cpu"``/``"cuda"``; default: the spec's own `device`, or none when it is ``"auto"``)."""
        from utils.jobs.config import deepspeed_config
        from utils.jobs.configlint import lint_config

        device = device or (self.device if self.device != "auto" else None)
        return lint_config(deepspeed_config(self), data_parallel=self.data_parallel, num_stages=self.num_stages,
                           device=device)

    @property
    def shape(self):
        """What `model` with `model_options` resolves to (`utils.workloads.presets.ModelShape`:
        layers, layer names, sequence length, the options spelled out in full), computed
        without torch; ValueError for an unknown preset or option, saying what to change."""
        return model_shape(self.model, self.model_options)

    # --- persistence --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not isinstance(self.partition, str):
            data["partition"] = list(self.partition)
        data["repartition_at"] = {step: list(b) for step, b in self.repartition_at.items()}
        data["hosts"] = list(self.hosts)
        if self.lengths is not None:
            data["lengths"] = list(self.lengths)
        if self.rebalance is not None:
            data["rebalance"] = self.rebalance.to_dict()
        if self.micro_batch_policy is not None:
            data["micro_batch_policy"] = self.micro_batch_policy.to_dict()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown JobSpec field(s) {sorted(unknown)}")
        data = dict(data)
        if data.get("fault") is not None:
            data["fault"] = Fault(**data["fault"])
        if data.get("rebalance") is not None:
            data["rebalance"] = Rebalance.from_dict(data["rebalance"])
        if data.get("micro_batch_policy") is not None:
            data["micro_batch_policy"] = MicroBatchPolicy.from_dict(data["micro_batch_policy"])
        return cls(**data)


def batch_fixes(spec: JobSpec, *, most: int = 4) -> list[dict[str, int | None]]:
    """Changes that make `spec`'s batch fields agree (``train_batch_size`` = micro_batch_size ×
    micro_batches × data_parallel), nearest first, each a dict of fields to set.

    Only whole, valid counts are offered, because the error message hands them to a learner
    as is: "change micro_batches to 7.5" cannot be typed into a spec. In order: the
    micro-batch count that fits the intended batch; else the micro-batch size that fits it
    with the same count; else the nearest batches the current micro-batch size reaches, and
    the micro-batch sizes nearest the current one that divide the batch (with their count).
    Dropping ``train_batch_size`` (``None``: derive it) always works and comes last. At most
    `most` changes besides that one. An empty list when the fields already agree.
    """
    target, size, count, replicas = (spec.train_batch_size, spec.micro_batch_size, spec.micro_batches,
                                     spec.data_parallel)
    if target is None or target == spec.global_batch:
        return []
    fixes: list[dict[str, int | None]] = []
    unit = size * replicas  # samples one micro-batch adds to the global batch
    if target % unit == 0:
        fixes.append({"micro_batches": target // unit})
    elif target % (count * replicas) == 0:
        fixes.append({"micro_batch_size": target // (count * replicas)})
    if not fixes:
        below = target // unit * unit
        for batch in (below, below + unit):
            if batch >= unit:  # at least one micro-batch
                fixes.append({"train_batch_size": batch, "micro_batches": batch // unit})
        if target % replicas == 0:
            per_replica = target // replicas
            sizes = sorted((d for d in range(1, per_replica + 1) if per_replica % d == 0 and d != size),
                           key=lambda d: (abs(d - size), d))
            fixes += [{"micro_batch_size": d, "micro_batches": per_replica // d} for d in sizes[:2]]
    fixes = [{k: v for k, v in fix.items() if getattr(spec, k) != v} for fix in fixes[:most]]
    return [fix for fix in fixes if fix] + [{"train_batch_size": None}]


def _say_fixes(spec: JobSpec, fixes: list[dict[str, int | None]]) -> str:
    """`batch_fixes` as one sentence: "Change micro_batches to 4, or drop train_batch_size"."""
    said = []
    for fix in fixes:
        if fix == {"train_batch_size": None}:
            said.append("drop train_batch_size (it is then derived)")
            continue
        (first, value), *rest = fix.items()
        also = " and ".join(f"{k}={v}" for k, v in rest)
        said.append(f"{first} to {value}" + (f" with {also}" if also else ""))
    *options, last = said
    if not options:
        return f"Change it: {last}"
    return "Change " + ", or ".join(options) + f"; or {last}"


_COUNT_FIELDS = ("num_stages", "data_parallel", "micro_batches", "micro_batch_size", "steps")
_INTEGER_FIELDS = (*_COUNT_FIELDS, "train_batch_size", "chunks", "seed", "lr_warmup_steps", "zero_stage",
                   "activation_checkpoint_interval")


def _plain_int(value):
    """A numpy integer as a Python int; anything else unchanged (the check judges it)."""
    if not isinstance(value, (bool, int, float, str)) and hasattr(value, "__index__"):
        return value.__index__()
    return value


def _step_key(key):
    """A step as an int: ``"3"`` (a JSON object key) and numpy integers become 3; anything
    else stays as it is for `check` to reject."""
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return _plain_int(key)


def _positive_number(name: str, value, example: str) -> None:
    """A finite number > 0: the learning rate, the timeout."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number ({example}), got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number ({example}), got {value!r}")
