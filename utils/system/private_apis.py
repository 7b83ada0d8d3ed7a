"""Every private API of Python, torch, DeepSpeed and Jupyter the workbook relies on, as data.

Private here means a name with a leading underscore, or an undocumented internal of a module
(torchrun's argument parser, elastic's process context, DeepSpeed's config helpers): nothing
promises it survives an upgrade. Each entry names the module, the attribute, the version it
was checked against, what breaks without it and which workbook modules use it.
`tests/unit/test_private_apis.py` resolves every entry and fails with that text when one is
gone; the launcher checks the warm agent's standard-library ones before each CPU job (the agent
checks torch's itself, before any rank) and starts the job with torchrun's own command when one
is missing (`warm_start`, which also reads the warm start's
off switch, `WARM_START_ENV`).

Not listed: ``os._exit`` (public and documented despite its name), IPython's
``_repr_*_`` display protocol (documented), the workbook's own underscored names, and names
that only appear in comments. An entry whose `required` is False costs detail or speed when
it is gone (a hang report that cannot name the instruction), not a job.

Resolving an entry imports its module (torch and DeepSpeed ones import torch): call these
functions when a job is launched or in a test, never at import (nothing here runs then).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from dataclasses import dataclass

PYTHON = "Python 3.11"
TORCH = "torch 2.13.0"
DEEPSPEED = "deepspeed 0.19.8"
JUPYTER = "jupyter_client 8.10.0, nbclient 0.11.0, IPython 9.18.1"
WARM_AGENT = "utils.runtime.warm_agent"
WARM_START_ENV = "WORKBOOK_WARM_START"
"""The warm start's switch, read at each launch: unset or ``1`` (CPU jobs start through
`WARM_AGENT`), ``0`` (torchrun's own command)."""


@dataclass(frozen=True)
class PrivateApi:
    """One private name: ``module`` imported, then ``attribute`` looked up dot by dot."""

    module: str
    attribute: str
    """Dotted path inside `module` ("": the module itself). With `instance`, its last part is
    a name the class's own code uses (set or read on instances, or looked up by name on
    objects it is given): it exists on objects only, not on the class."""
    checked: str
    """What it was checked against, e.g. ``"torch 2.13.0"``."""
    breaks: str
    """What breaks without it."""
    used_by: tuple[str, ...]
    """The workbook modules that rely on it."""
    required: bool = True
    """False: without it the workbook still works, with less detail or speed."""
    instance: bool = False

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module

    def problem(self) -> str | None:
        """None when the name resolves here; else why not, and what that breaks."""
        try:
            resolve(self)
        except (ImportError, AttributeError) as exc:
            return (f"{self.name} (checked against {self.checked}) is gone: {type(exc).__name__}: {exc}. "
                    f"Without it: {self.breaks} (used by {', '.join(self.used_by)})")
        return None


def resolve(api: PrivateApi) -> object:
    """The object `api` names; ImportError or AttributeError when it is gone."""
    found: object = importlib.import_module(api.module)
    parts = api.attribute.split(".") if api.attribute else []
    for part in parts[:-1] if api.instance else parts:
        found = getattr(found, part)
    if api.instance:
        if not isinstance(found, type) or not _named_in_code(found, parts[-1]):
            raise AttributeError(f"no method of {getattr(found, '__name__', found)!r} uses the name {parts[-1]!r}")
    return found


def _named_in_code(cls: type, name: str) -> bool:
    """Whether code of `cls` or a base (methods, properties, nested functions) names `name`,
    as an attribute or as a string (``getattr(x, "name")``)."""
    def codes(value):
        for candidate in (value, getattr(value, "fget", None), getattr(value, "__func__", None)):
            code = getattr(candidate, "__code__", None)
            if code is not None:
                yield code

    def names(code: types.CodeType):
        yield from code.co_names
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from names(const)
            elif isinstance(const, str):
                yield const

    return any(name in names(code) for klass in cls.__mro__ for value in vars(klass).values()
               for code in codes(value))


def unavailable(used_by: str | None = None, *, required_only: bool = False,
                cheap_only: bool = False) -> list[tuple[PrivateApi, str]]:
    """The entries (used by `used_by`, if given) that do not resolve here, each with its problem.
    `cheap_only`: only those whose module is of the standard library or already imported
    (checking a torch entry imports torch: ~2 s in a process that had not)."""
    found = []
    for api in PRIVATE_APIS:
        if cheap_only and api.module.split(".")[0] in ("torch", "deepspeed") and api.module not in sys.modules:
            continue
        if (used_by is None or used_by in api.used_by) and (api.required or not required_only):
            problem = api.problem()
            if problem is not None:
                found.append((api, problem))
    return found


def warm_start(wanted: bool) -> tuple[bool, str | None]:
    """Whether a job whose launcher `wanted` the warm agent (a CPU job started by torchrun) gets
    it, and a note for the learner when it cannot: `WARM_START_ENV` is not ``0`` and every
    required private API of the agent is here. Any other value of the switch is a ValueError,
    `wanted` or not (the launcher asks before any process starts)."""
    switch = os.environ.get(WARM_START_ENV, "1")
    if switch not in ("0", "1"):
        raise ValueError(f"{WARM_START_ENV}={switch!r} is not a valid value: use 1 (the default when unset: "
                         "CPU jobs start through the warm agent) or 0 (torchrun's own command)")
    if switch == "0" or not wanted:
        return False, None
    # torch's entries are checked by the agent itself before any rank exists (`set_up`, which
    # then runs torchrun's command): importing torch here would cost each notebook that starts
    # a job about 2 s.
    gone = unavailable(WARM_AGENT, required_only=True, cheap_only=True)
    if not gone:
        return True, None
    return False, (f"this job starts with torchrun's own command, not the warm agent (slower start, same "
                   f"job): {gone[0][1]}. Update {WARM_AGENT}, or set {WARM_START_ENV}=0 to start every CPU "
                   "job this way without this note")


_ELASTIC = "torch.distributed.elastic.multiprocessing"
_PIPE_ENGINE = "deepspeed.runtime.pipe.engine"
_PIPE_MODULE = "deepspeed.runtime.pipe.module"
_PIPE_TOPOLOGY = "deepspeed.runtime.pipe.topology"
_INSTRUCTIONS = ("utils.runtime.tracing", "utils.runtime.lowering", "utils.runtime.frozen",
                 "utils.runtime.faults", "utils.runtime.layercost")

#: DeepSpeed's instruction methods, by the names stack dumps and tracebacks show
#: (`utils.jobs.stacks.ENGINE_METHODS`; the test checks the two lists agree).
EXEC_METHODS = ("_exec_load_micro_batch", "_exec_forward_pass", "_exec_backward_pass",
                "_exec_send_activations", "_exec_recv_activations", "_exec_send_grads", "_exec_recv_grads",
                "_exec_reduce_tied_grads", "_exec_reduce_grads", "_exec_optimizer_step")

PRIVATE_APIS: tuple[PrivateApi, ...] = (
    # --- the warm start of CPU jobs: multiprocessing --------------------------------------------
    PrivateApi("multiprocessing.forkserver", "ensure_running", PYTHON,
               "the fork server cannot be started before the rendezvous, while the agent imports torch: "
               "the warm agent cannot start and the launcher runs torchrun's own command", (WARM_AGENT,)),
    PrivateApi("multiprocessing.forkserver", "_forkserver._forkserver_pid", PYTHON,
               "the warm agent cannot kill and reap its fork server at the end: as an orphan it tears "
               "torch down for about a second, and the launcher's stop waits for it", (WARM_AGENT,)),
    PrivateApi("multiprocessing.util", "_exit_function", PYTHON,
               "the warm agent ends with os._exit and cannot run multiprocessing's exit handler: elastic's "
               "named semaphores pile up in /dev/shm and the fork server's socket folder stays", (WARM_AGENT,)),
    PrivateApi("multiprocessing.resource_tracker", "_resource_tracker._stop", PYTHON,
               "the warm agent cannot stop multiprocessing's resource tracker, which ignores SIGTERM and "
               "outlives the agent; the launcher waits for it", (WARM_AGENT,)),
    # --- the warm start: torchrun's internals ----------------------------------------------------
    PrivateApi("torch.distributed.run", "parse_args", TORCH,
               "the warm agent cannot read torchrun's arguments", (WARM_AGENT,)),
    PrivateApi("torch.distributed.run", "config_from_args", TORCH,
               "the warm agent cannot turn torchrun's arguments into elastic's launch config", (WARM_AGENT,)),
    PrivateApi(_ELASTIC, "MultiprocessContext", TORCH,
               "start_processes no longer finds its function-entry-point context there, so the warm "
               "agent cannot substitute one that reports every failed rank (the failure report would name "
               "only the first rank elastic's join met)", (WARM_AGENT,)),
    PrivateApi(f"{_ELASTIC}.api", "MultiprocessContext._poll", TORCH,
               "the warm agent's context overrides it to add every rank that had failed", (WARM_AGENT,)),
    PrivateApi(f"{_ELASTIC}.api", "MultiprocessContext._pc", TORCH,
               "the warm agent's context reads the ranks' exit codes from it", (WARM_AGENT,), instance=True),
    PrivateApi(f"{_ELASTIC}.api", "MultiprocessContext.error_files", TORCH,
               "the warm agent's context names each failed rank's error file from it", (WARM_AGENT,),
               instance=True),
    PrivateApi("torch._dynamo", "", TORCH,
               "nothing fails (the fork server skips a preload it cannot import), but every forked rank "
               "then imports it itself, about 1.4 s each (every torch optimizer imports it)", (WARM_AGENT,),
               required=False),
    # --- DeepSpeed's pipeline engine ------------------------------------------------------------
    PrivateApi(_PIPE_ENGINE, "PipelineEngine._INSTRUCTION_MAP", DEEPSPEED,
               "the instruction map the workbook wraps on each engine instance: the tracer, other "
               "schedules, layer freezing, injected faults and per-layer costs; every job fails "
               "building its engine", _INSTRUCTIONS),
    PrivateApi(_PIPE_ENGINE, "PipelineEngine._exec_schedule", DEEPSPEED,
               "the engine method that looks each instruction up in the instance's _INSTRUCTION_MAP, "
               "which the tracer, schedules, freezing, faults and layer costs all wrap; without it the "
               "wrapped map is never read", ("utils.runtime.tracing",)),
    PrivateApi(_PIPE_ENGINE, "PipelineEngine._train_schedule", DEEPSPEED,
               "a schedule other than DeepSpeed's 1F1B (GPipe, ...) is installed by replacing it on the "
               "engine instance; without it the engine would ignore the schedule asked for",
               ("utils.runtime.lowering",)),
    PrivateApi(_PIPE_ENGINE, "PipelineEngine.pipe_buffers", DEEPSPEED,
               "layer freezing frees the buffers DeepSpeed's own send and backward would free; a live move "
               "empties the old engine's (else the last stage's kept outputs keep that engine alive)",
               ("utils.runtime.frozen", "utils.runtime.migrate"), instance=True),
    PrivateApi(_PIPE_ENGINE, "PipelineEngine.loss", DEEPSPEED,
               "a live move drops the old last stage's loss (its graph holds the engine's backward hooks); "
               "read with getattr: without it the old engine may stay alive after a move",
               ("utils.runtime.migrate",), required=False, instance=True),
    PrivateApi(_PIPE_ENGINE, "PipelineEngine.grad_layer", DEEPSPEED,
               "layer freezing clears the received gradient DeepSpeed's RecvGrad would set",
               ("utils.runtime.frozen",), instance=True),
    PrivateApi("deepspeed.runtime.engine", "DeepSpeedEngine.clip_fp32_gradients", DEEPSPEED,
               "layer freezing replaces it so that an all-frozen stage joins the norm's collectives "
               "(else it fails on a stage with no gradient)", ("utils.runtime.frozen",)),
    *(PrivateApi(_PIPE_ENGINE, f"PipelineEngine.{name}", DEEPSPEED,
                 "hang reports and failure explanations (utils.jobs.errors reads the same table) cannot "
                 "name the pipeline instruction a rank was in: they find it by this method name in stacks "
                 "and tracebacks", ("utils.jobs.stacks",), required=False)
      for name in EXEC_METHODS),
    PrivateApi(_PIPE_ENGINE, "PipelineEngine._send_tensor_meta", DEEPSPEED,
               "a stage that returns a non-tensor is no longer explained (the error pattern matches "
               "this name in the traceback)", ("utils.jobs.errors",), required=False),
    # --- DeepSpeed's pipeline module ------------------------------------------------------------
    PrivateApi(_PIPE_MODULE, "PipelineModule._partition_layers", DEEPSPEED,
               "the rank program overrides it to impose the plan's boundaries; without it DeepSpeed "
               "partitions by its own method and the plan's partition is ignored", ("utils.runtime.assembly",)),
    PrivateApi(_PIPE_MODULE, "PipelineModule._set_bounds", DEEPSPEED,
               "the override cannot set this stage's layers: every job fails building its module",
               ("utils.runtime.assembly",)),
    PrivateApi(_PIPE_MODULE, "PipelineModule._topo", DEEPSPEED,
               "the override cannot find this rank's stage: every job fails building its module",
               ("utils.runtime.assembly",), instance=True),
    PrivateApi(_PIPE_MODULE, "PipelineModule._layer_specs", DEEPSPEED,
               "a recorded script's layers cannot be named: utils.record fails as it starts",
               ("utils.runtime.recorder",), instance=True),
    PrivateApi("deepspeed.runtime.engine", "DeepSpeedEngine._config", DEEPSPEED,
               "a recorded script's DeepSpeed config is not kept with its run (read with getattr: nothing fails)",
               ("utils.runtime.recorder",), required=False, instance=True),
    PrivateApi("deepspeed.runtime.config", "DeepSpeedConfig._param_dict", DEEPSPEED,
               "the same: the config dict a recorded script passed is not kept (read with getattr)",
               ("utils.runtime.recorder",), required=False, instance=True),
    *(PrivateApi(module, attribute, DEEPSPEED,
                 "a live move cannot find the old engine's process groups to destroy them: every live "
                 "re-partition fails", ("utils.runtime.migrate",), instance=True)
      for module, attribute in ((_PIPE_MODULE, "PipelineModule.world_group"),
                                (_PIPE_MODULE, "PipelineModule.tied_comms"),
                                *((_PIPE_TOPOLOGY, f"PipelineParallelGrid.{name}") for name in
                                  ("ds_model_proc_group", "dp_proc_group", "pp_proc_group", "slice_proc_group")))),
    PrivateApi(_PIPE_MODULE, "PipelineModule._recursive_getattr", DEEPSPEED,
               "a tied weight named by a missing attribute is no longer explained (the error pattern "
               "matches this name in the traceback)", ("utils.jobs.errors",), required=False),
    # --- DeepSpeed's accelerator and config -------------------------------------------------------
    PrivateApi("deepspeed.accelerator.real_accelerator", "ds_accelerator", DEEPSPEED,
               "a rank no longer sees the accelerator DeepSpeed already chose, so it cannot refuse one "
               "that differs from the plan's device", ("utils.runtime.rank",), required=False),
    PrivateApi("deepspeed.accelerator.cpu_accelerator", "CPU_Accelerator._name", DEEPSPEED,
               "a rank cannot compare the accelerator DeepSpeed chose with the plan's device: every CPU "
               "job fails at start", ("utils.runtime.rank",), instance=True),
    PrivateApi("deepspeed.accelerator.cuda_accelerator", "CUDA_Accelerator._name", DEEPSPEED,
               "the same on a GPU: every GPU job fails at start", ("utils.runtime.rank",), instance=True),
    PrivateApi("deepspeed.runtime.config", "get_pipeline_config", DEEPSPEED,
               "the config linter cannot list the pipeline section's keys: planning a job whose config has "
               "a pipeline section fails",
               ("utils.jobs.configlint",)),
    PrivateApi("deepspeed.runtime.engine", "DeepSpeedEngine._do_optimizer_sanity_check", DEEPSPEED,
               "the config linter cannot run DeepSpeed's own optimizer check on a parsed config: it no longer "
               "reports a model dtype / grad_accum_dtype mix DeepSpeed rejects, or ZeRO with an untested optimizer",
               ("utils.jobs.configrules",), required=False),
    PrivateApi("deepspeed.runtime.config", "DEEPSPEED_OPTIMIZERS", DEEPSPEED,
               "the config linter cannot tell DeepSpeed's own optimizer names from torch.optim's: configs "
               "naming an optimizer fail to lint", ("utils.jobs.configrules",)),
    PrivateApi("deepspeed.runtime.config_utils", "DeepSpeedConfigModel", DEEPSPEED,
               "the config linter cannot suggest the valid keys of a section DeepSpeed rejected",
               ("utils.jobs.configlint",), required=False),
    # --- the grader's notebook client and the notebook ------------------------------------------
    PrivateApi("jupyter_client.manager", "AsyncKernelManager._async_cleanup_resources", JUPYTER,
               "the grader's kernel manager overrides it to remove a sandboxed kernel's socket folder; "
               "without it that folder is left behind", ("utils.grading.kernel_manager",)),
    PrivateApi("jupyter_client.client", "KernelClient._created_context", JUPYTER,
               "the grader's kernel manager hands its client a zmq context of its own (refusing messages over "
               "Budget.message_mib) and sets it so that the client destroys it; without it the context leaks "
               "until the grading process ends", ("utils.grading.kernel_manager",)),
    PrivateApi("nbclient", "NotebookClient._update_display_id", JUPYTER,
               "the grader's client overrides it to bound an updated display; without it a submission's "
               "display updates bypass the output budget", ("utils.grading.execute",)),
    PrivateApi("IPython.core.interactiveshell", "InteractiveShell._render_traceback_", JUPYTER,
               "a job stopped with Ctrl-C or the stop button shows a whole traceback instead of one line "
               "(JobStopped defines it for IPython)", ("utils.jobs.launch",), required=False, instance=True),
    # --- torch.distributed ----------------------------------------------------------------------
    PrivateApi("torch.distributed.distributed_c10d", "_world.pg_map", TORCH,
               "a live move cannot count the process groups a rank holds (its record, and the test that "
               "moves leave none behind)", ("utils.runtime.migrate",)),
    # --- names read in stack dumps -------------------------------------------------------------
    PrivateApi("runpy", "_run_module_as_main", PYTHON,
               "a hang report picks the deepest thread instead of the one ``python -m`` started",
               ("utils.jobs.stacks",), required=False),
    PrivateApi("torch.nn", "Module._call_impl", TORCH,
               "hang reports show torch's module-call frames instead of skipping them",
               ("utils.jobs.stacks",), required=False),
    PrivateApi("torch.nn", "Module._wrapped_call_impl", TORCH,
               "hang reports show torch's module-call frames instead of skipping them",
               ("utils.jobs.stacks",), required=False),
)
