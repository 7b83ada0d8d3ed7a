"""`diagnose(run)`: what went wrong with a pipeline job, where, why, and what to change.

It reads the run's record only (`Run`: the ranks' error records, status slots, logs, the
stacks the launcher collected at a hang, the timeline, the memory), so it works on a run
that just ended and on one recorded months ago:

- a **failed** run: the rank that failed first (the others usually fail *because* of it:
  their neighbour went away), its stage, the instruction, step and micro-batch it was in,
  and the cause and fix from the known DeepSpeed errors (`utils.jobs.errors`);
- a **hung** run (stopped by its timeout): the wait-for chain between ranks — who waits in
  which receive or collective for whom — down to the rank that holds everybody up, with what
  its stack says it is doing (or the cycle, when ranks wait for each other);
- a **successful** run: stragglers, imbalance, the causes of the bubble and the memory per
  stage, from the timeline (`utils.analysis.slowness`).

A record cut short or damaged (`Run.record_problems`) is a ``partial-record`` finding: the
first of a successful run (every figure after it rests on part of the run), after the cause
of a failed or hung one.

The result is a `Diagnosis` (`utils.analysis.diagnosis`): readable in a notebook, with stable
codes and locations for a test or a grader. A fault the spec injected (`JobSpec.fault`) is
named in a finding of its own, last; ``reveal_fault=False`` leaves it out (for a lab whose
students must find it from the evidence).
"""

from __future__ import annotations

import contextlib
import re
import signal
from pathlib import Path

from utils.analysis.diagnosis import Diagnosis, Symptom, Where
from utils.analysis.report import PARTIAL
from utils.analysis.slowness import FillAndDrain, performance_symptoms
from utils.jobs.errors import engine_instruction_of, explain, timed_out
from utils.jobs.exitreport import recorded_exit_report
from utils.jobs.failure import first_failure
from utils.jobs.records import RankEnd, SlotStatus
from utils.jobs.runs import Run
from utils.jobs.stacks import ThreadStack, engine_instruction, main_stack, on_nccl, parse_stacks, stack_summary
from utils.planning.catalogue import schedule_info

__all__ = ["diagnose", "waits_for"]

_COLLECTIVES = ("recv", "send", "all_reduce", "broadcast", "barrier", "all_gather", "reduce_scatter", "wait",
                "broadcast_object_list", "all_gather_object")
_COMM_WAITS = {"recv_act": -1, "send_grad": -1, "recv_grad": +1, "send_act": +1}
_FAULT_WORDS = {
    "raise": "raises a RuntimeError", "hang": "sleeps forever", "exit": "exits (code 3)",
    "killed": "is killed by SIGKILL", "slow": "runs its forwards and backwards {factor:g}× as long",
    "mismatch": "sends a tensor of the wrong {tensor}", "memory": "may allocate only {cap:g} MB more",
    "exhausted": "has an empty data loader", "collective": "enters an all_reduce no other rank joins",
}


def diagnose(run: Run | str | Path, *, reveal_fault: bool = True) -> Diagnosis:
    """The `Diagnosis` of `run` (a `Run` or its directory); see the module docstring."""
    if not isinstance(run, Run):
        run = Run.load(run)
    if run.state == "running":
        raise ValueError(f"{run.name} is still running: diagnose it once it ended (or stop it)")
    if run.state == "succeeded":
        kind, headline, findings = "ok", *_succeeded(run)
    elif run.state == "timeout" and not _too_slow(run):
        kind, headline, findings = "hung", *_hung(run)
    else:
        kind, headline, findings = "failed", *_failed(run)
    if run.plan.get("device") == "cuda" and kind != "ok":  # NCCL: a hang seen from the host; the flight recorder
        findings = on_nccl(findings, run.run_dir, hung=kind == "hung")
    if run.record_problems and kind == "ok":  # every figure of a successful run rests on the record
        findings.insert(0, _partial(run))
        headline = f"{PARTIAL}; {headline}"
    elif run.record_problems:
        findings.append(_partial(run))
    if reveal_fault and run.spec.fault is not None and "injected-fault" not in [f.code for f in findings]:
        findings.append(_injected(run))
    return Diagnosis(kind=kind, run=run.name, headline=headline, findings=tuple(findings))


# --- status slots ----------------------------------------------------------------------------------
def _status(slot: SlotStatus | None) -> dict:
    """A status slot (`utils.jobs.records.SlotStatus`) as the ``step``, ``instruction`` (or
    ``"finished"``, ``"repartition"`` ..., None before training), ``micro_batch`` and ``time``
    the chains below read."""
    if slot is None:
        return {"step": None, "instruction": None, "micro_batch": None, "time": None}
    return {"step": slot.step, "instruction": slot.doing, "micro_batch": slot.micro_batch, "time": slot.time}


def _too_slow(run: Run) -> bool:
    """The watch ended the job by its timeout while it still made progress (`Failure` ``"too-slow"``)."""
    return run.failure is not None and run.failure.kind == "too-slow"


def waits_for(rank: int, instruction: str | None, *, num_stages: int, data_parallel: int,
              in_collective: bool = False) -> list[int]:
    """The ranks `rank` waits for while it is in `instruction` (DeepSpeed's stage-major
    layout: rank = stage × data_parallel + replica): its previous stage for ``recv_act`` and
    ``send_grad``, its next for ``recv_grad`` and ``send_act``, the other replicas of its
    stage for ``reduce_grads``, every other rank for anything else spent in a collective
    (`in_collective`: its stack says so); none when it computes."""
    stage, replica = divmod(rank, data_parallel)
    if instruction in _COMM_WAITS:
        other = stage + _COMM_WAITS[instruction]
        return [other * data_parallel + replica] if 0 <= other < num_stages else []
    if instruction == "reduce_grads" and data_parallel > 1:
        return [stage * data_parallel + r for r in range(data_parallel) if r != replica]
    if in_collective:
        return [r for r in range(num_stages * data_parallel) if r != rank]
    return []


# --- failed ------------------------------------------------------------------------------------------
def _failed(run: Run) -> tuple[str, list[Symptom]]:
    if run.state in ("stopped", "incomplete"):
        why = {"stopped": "it was stopped before it ended", "incomplete": "its launcher vanished before it ended" if run.plan.get(
            "launcher") != "script" else "the script (no launcher watched it: no exit codes, no stacks) is still running, or was killed"}
        return why[run.state], [Symptom(
            code=run.state, severity="info", what=f"the job did not fail: {why[run.state]}",
            evidence={"error": (run.error or "")[:240]}, cause=run.error or why[run.state],
            fix="run it again (and leave it to its end)")]
    if _too_slow(run):
        return "too slow for its timeout", [Symptom(
            code="too-slow", severity="error", what="the job was still making progress when its timeout ended it",
            evidence={"report": run.error.splitlines()[0]}, cause=run.error.splitlines()[0],
            fix="raise JobSpec.timeout, or run fewer or cheaper steps")]
    rd = run.run_dir
    errors = [e for r in run.ranks if isinstance(e := rd.error(r), dict)]
    # The same decision the launcher's watch made, on the facts it recorded (`first_failure`).
    died = [run.failure.died] if run.failure is not None and run.failure.died is not None else []
    first = first_failure(errors, died)
    explained = list(first.explained) if first is not None else []
    findings: list[Symptom] = []
    if first is not None and first.error is not None:
        findings.append(_from_error(run, first.error, first.explanation, also=list(first.also)))
    elif first is not None:
        findings.append(_from_death(run, first.died))
    else:
        said = (run.error or "no error was recorded").splitlines()[0]
        findings.append(Symptom(code="unknown", what=said, evidence={"error": said},
                                cause="no rank left an error record, and the launcher's report names no rank",
                                fix=f"read launcher.log and the ranks' logs in {run.path}"))
    primary = findings[0]
    if primary.code == "collective-timeout" and primary.where.rank is not None:
        return _timed_out(run, primary, explained)
    if primary.where.rank is not None:
        consequence = _consequences(run, primary, explained)
        if consequence is not None:
            findings.append(consequence)
    return f"rank {primary.where.rank} (stage {primary.where.stage}) failed first: {primary.what}", findings


_HOW = {"lost-connection": "lost its connection to it", "stopped": "was stopped by the launcher before it noticed"}


def _timed_out(run: Run, victim: Symptom, explained: list[tuple[dict, object]]) -> tuple[str, list[Symptom]]:
    """A rank timed out waiting: those it waited for, silent and unfinished, are suspects (`errors.timed_out`)."""
    spec, w, rd = run.spec, victim.where, run.run_dir
    gave_up = min(e["time"] for e, _ in explained if e["rank"] == w.rank)
    suspects = {}
    for r in waits_for(w.rank, w.instruction, num_stages=spec.num_stages, data_parallel=spec.data_parallel,
                       in_collective=w.instruction not in _COMM_WAITS):
        slot = rd.slot(r)
        if (status := _status(slot))["time"] and not rd.error_file(r).exists() and not rd.result_file(r).exists():
            suspects[r] = {"where": _where_of(spec, r, status), "doing": slot.describe(),
                           "for_s": round(gave_up - status["time"], 1)}
    head, findings = timed_out(victim, suspects)
    also = _consequences(run, victim, explained, exclude=set(suspects))
    return head, findings + ([also] if also else [])


def _consequences(run: Run, primary: Symptom, explained: list[tuple[dict, object]], exclude=()) -> Symptom | None:
    """One ``peer-lost`` finding for every rank that ended only because `primary`'s rank failed
    first, whichever way the race between them went (None when there is none):

    - ``lost-connection``: it noticed: its error record is a lost connection (a consequence);
    - ``stopped``: the launcher stopped it (SIGTERM) before it noticed, and it left no error
      record. Told by the launcher's report (exit code -15, or its log line closing the rank's
      pid: `utils.jobs.exitreport.ExitReport.stopped_by_launcher`), or, where the report says
      nothing of it (elastic's function context lists failures only: the warm agent), by its
      record: no error, no result, no exit code of its own, after the first failure's record.

    Its status slot says what it was doing when it ended. A rank with an exit code of its own
    and no error record died by itself: not a consequence, not listed."""
    rd, first = run.run_dir, primary.where.rank
    report = recorded_exit_report(rd)
    co_causes = {first, *primary.evidence.get("same_error_on_ranks", ()), *exclude}
    recorded = {e["rank"]: (e, x) for e, x in explained}
    how, told_by, doing = {}, {}, {}
    for rank in run.ranks:
        if rank in co_causes or rd.result_file(rank).exists():
            continue
        if rank in recorded:
            error, x = recorded[rank]
            if x is None or not x.consequence:
                continue  # a cause of its own: the primary finding names it (same_error_on_ranks)
            how[rank] = "lost-connection"
            told_by[rank] = f"its error record: {error.get('type')}: {str(error.get('message', ''))[:120]}"
        elif report.stopped_by_launcher(rank):
            how[rank] = "stopped"
            told_by[rank] = ("the launcher's report: exit code -15 (SIGTERM)" if rank in report.exit_codes else
                             "the launcher's log: it closed the rank's process with SIGTERM")
        elif rank not in report.exit_codes:
            how[rank] = "stopped"
            told_by[rank] = (f"no error record, no result and no exit code of its own: it ended after rank "
                             f"{first}'s failure, without noticing it")
        else:
            continue
        slot = rd.slot(rank)
        doing[rank] = slot.describe() if slot is not None else "nothing recorded (still setting up)"
    if not how:
        return None
    ranks = sorted(how)
    if all(h == "lost-connection" for h in how.values()):
        what = f"rank(s) {ranks} failed only because rank {first} went away (their connection to it closed)"
    else:
        what = (f"rank(s) {ranks} ended only because rank {first} failed first: "
                + "; ".join(f"rank {r} {_HOW[how[r]]} (in: {doing[r]})" for r in ranks))
    return Symptom(code="peer-lost", severity="info", what=what,
                   where=_where(run, ranks[0]) if len(ranks) == 1 else Where(),
                   evidence={"ranks": ranks, "how": {r: how[r] for r in ranks},
                             "told_by": {r: told_by[r] for r in ranks}, "doing": {r: doing[r] for r in ranks}},
                   cause="a consequence of the first failure, not a second problem: a rank that loses its neighbour "
                         "either notices (its send or receive fails) or is stopped by the launcher first, whichever "
                         "comes first on this machine",
                   fix="nothing of their own")


def _where(run: Run, rank: int, traceback_text: str = "") -> Where:
    status = _status(run.run_dir.slot(rank))
    traced = engine_instruction_of(traceback_text) if traceback_text else None
    stage = run.spec.stage_of_rank(rank)
    if traced == "setup" or (status["instruction"] is None and traced is None):
        return Where(rank=rank, stage=stage, instruction="setup")
    instruction = traced or status["instruction"]
    same = status["instruction"] == instruction
    return Where(rank=rank, stage=stage, instruction=instruction, step=status["step"],
                 micro_batch=status["micro_batch"] if same else None)


def _from_error(run: Run, error: dict, explanation, *, also: list[int]) -> Symptom:
    rank = int(error["rank"])
    where = _where(run, rank, error.get("traceback", ""))
    line = f"{error.get('type')}: {error.get('message')}".strip()
    evidence = {"error": line.splitlines()[0] if line else "", "steps_done": len(run.progress(rank))}
    if also:
        evidence["same_error_on_ranks"] = sorted({rank, *also})
    if explanation is None:
        return Symptom(code="unrecognised-error", what=f"rank {rank} raised {line.splitlines()[0][:200]}",
                       where=where, evidence=evidence,
                       cause="not one of the known pipeline errors: read the end of its traceback",
                       fix=f"see error-rank{rank}.json / rank{rank}.log in {run.path}")
    if explanation.code == "out-of-memory":
        limit = re.search(r"limit (\d+) MB", run.log(rank))
        if limit:
            evidence["memory_limit_mb"] = int(limit.group(1))
    cause = explanation.cause + _sender(run, where, explanation.code)
    return Symptom(code=explanation.code, what=f"rank {rank} raised {line.splitlines()[0][:200]}", where=where,
                   evidence={**evidence, "matched": explanation.matched}, cause=cause, fix=explanation.fix)


def _from_death(run: Run, died: RankEnd) -> Symptom:
    rank = died.rank
    where = _where(run, rank)
    signal_name, code = died.signal, died.exit_code
    if not signal_name and code is None:
        # The job's error was written before the launcher's summary named the exit code (its
        # agent slow to report, on a busy machine); the summary it wrote later is in its log.
        reported = recorded_exit_report(run.run_dir).exit_codes.get(rank)
        if reported is not None and reported < 0:
            with contextlib.suppress(ValueError):
                signal_name = signal.Signals(-reported).name
        code = None if signal_name else reported
    how = (f"was killed by {signal_name}" if signal_name else
           f"died with exit code {code}" if code is not None else "died, with no exit code reported")
    log_tail = run.log(rank, tail=60)
    explanation = explain(log_tail)
    evidence = {"exit": how, "steps_done": len(run.progress(rank))}
    if explanation is not None and not explanation.consequence and explanation.code != "injected-fault":
        return Symptom(code=explanation.code, what=f"rank {rank} {how}: {explanation.matched[:160]}", where=where,
                       evidence={**evidence, "matched": explanation.matched},
                       cause=explanation.cause + _sender(run, where, explanation.code), fix=explanation.fix)
    if signal_name == "SIGKILL":
        return Symptom(code="killed", what=f"rank {rank} was killed by SIGKILL, with no Python error", where=where,
                       evidence=evidence,
                       cause="something outside the process killed it: most often the kernel's out-of-memory killer "
                             "(the machine ran out of memory; `dmesg` says so), else a kill -9 or a job scheduler",
                       fix="lower the memory the job needs (see the out-of-memory fixes) or find what killed it")
    return Symptom(code="exited", what=f"rank {rank} {how}, with no Python error", where=where, evidence=evidence,
                   cause="the process ended without raising: os._exit or sys.exit inside a library, or a C/C++ abort "
                         "(its log ends with the reason)",
                   fix=f"read the end of rank{rank}.log in {run.path}")


def _sender(run: Run, where: Where, code: str) -> str:
    """For a tensor that arrived wrong: which neighbour sent it (the next stage for a
    gradient, the previous one for an activation)."""
    if code not in ("tensor-mismatch", "dtype-mismatch", "shape-mismatch") or where.rank is None:
        return ""
    sender = waits_for(where.rank, "recv_grad" if where.instruction == "recv_grad" else "recv_act",
                       num_stages=run.spec.num_stages, data_parallel=run.spec.data_parallel)
    return f". It came from rank {sender[0]} (stage {run.spec.stage_of_rank(sender[0])})" if sender else ""


# --- hung ------------------------------------------------------------------------------------------
def _hung(run: Run) -> tuple[str, list[Symptom]]:
    rd, spec = run.run_dir, run.spec
    stopped = set(run.failure.stopped_ranks) if run.failure is not None else set()
    ended = run.finished or 0.0
    state: dict[int, dict] = {}
    for rank in run.ranks:
        status = _status(rd.slot(rank))
        stack = main_stack(parse_stacks(rd.stacks(rank)))
        instruction = (engine_instruction(stack.frames) if stack else None) or status["instruction"]
        collective = bool(stack) and any("distributed" in f.file and f.function in _COLLECTIVES
                                         for f in stack.frames[:6])
        done = rd.result_file(rank).exists()
        waits = [] if done or rank in stopped or status["instruction"] is None else waits_for(
            rank, instruction, num_stages=spec.num_stages, data_parallel=spec.data_parallel, in_collective=collective)
        state[rank] = {**status, "instruction": instruction, "stack": stack, "waits": waits, "done": done,
                       "collective": collective and instruction not in _COMM_WAITS,
                       "for_s": round(ended - status["time"], 1) if status["time"] and ended else None}
    chains, culprits, cycle = _chains(state)
    findings: list[Symptom] = []
    if cycle:
        text = " → ".join(f"rank {r} ({state[r]['instruction']}{', in a collective' if state[r]['collective'] else ''})"
                          for r in cycle + cycle[:1])
        alone = [r for r in cycle if state[r]["collective"]]
        findings.append(Symptom(
            code="deadlock", what=f"ranks {sorted(cycle)} wait for each other: {text}",
            where=_where_of(spec, (alone or cycle)[0], state[(alone or cycle)[0]]),
            evidence={"cycle": cycle, "chains": chains, "in_collective": alone},
            cause=(f"rank(s) {alone} wait in a collective (its stack: "
                   f"{stack_summary(state[alone[0]]['stack'].frames)}) that the ranks waiting for them never enter: "
                   "a collective called on some ranks only" if alone else
                   "each of them waits to receive from another that waits too: their send/recv orders disagree"),
            fix=("call every collective on every rank of its group, in the same order (a metric reduced on rank 0 "
                 "only, a barrier inside `if rank == 0:`)" if alone else
                 "make every send meet its receive in the same order on both ranks (utils.runtime.lowering orders "
                 "the workbook's schedules so)")))
    for rank in culprits:
        findings.append(_stuck(run, rank, state, rank in stopped, chains))
    for rank, info in state.items():
        if info["waits"]:
            others = ", ".join(f"rank {r}" for r in info["waits"][:4]) + (" …" if len(info["waits"]) > 4 else "")
            findings.append(Symptom(
                code="waiting", severity="info", what=f"rank {rank} waits in {info['instruction']} for {others}",
                where=_where_of(spec, rank, info),
                evidence={"for_s": info["for_s"], "stack": stack_summary(info["stack"].frames) if info["stack"] else
                          "no stack"},
                cause="a consequence: it cannot go on until the rank(s) it waits for do", fix="nothing of its own"))
    if not findings:
        findings.append(Symptom(code="hang", what="the job stopped making progress, and no rank says why",
                                evidence={"report": (run.error or "")[:240]}, cause="unknown",
                                fix=f"read the ranks' logs and stacks in {run.path}"))
    head = findings[0]
    return (f"{head.what}" + (f"; chain: {chains[0]}" if chains else "")), findings


def _where_of(spec, rank: int, info: dict) -> Where:
    return Where(rank=rank, stage=spec.stage_of_rank(rank), instruction=info["instruction"] or "setup",
                 step=info["step"], micro_batch=info["micro_batch"])


def _chains(state: dict[int, dict]) -> tuple[list[str], list[int], list[int]]:
    """The wait-for chains from every rank nobody waits for, the ranks that hold everybody
    up (unfinished, waiting for no one), and a cycle if the waits form one."""
    waited_on = {r for info in state.values() for r in info["waits"]}
    culprits = [r for r, info in state.items() if not info["waits"] and not info["done"]]
    chains, cycle = [], []
    for start in [r for r in state if r not in waited_on and state[r]["waits"]] or \
            [r for r in state if state[r]["waits"]][:1]:
        path = [start]
        while state[path[-1]]["waits"]:
            nxt = state[path[-1]]["waits"][0]
            if nxt in path:
                cycle = path[path.index(nxt):]
                break
            path.append(nxt)
        chains.append(" → ".join(f"rank {r} ({state[r]['instruction'] or 'not started'})" for r in path))
    return chains, culprits, cycle


def _stuck(run: Run, rank: int, state: dict[int, dict], stopped: bool, chains: list[str]) -> Symptom:
    info = state[rank]
    stack = info["stack"]
    summary = stack_summary(stack.frames) if stack else "no stack (it did not answer)"
    where = _where_of(run.spec, rank, info)
    evidence = {"for_s": info["for_s"], "stack": summary, "steps_done": len(run.progress(rank)), "chains": chains}
    waiting = sorted(r for r, other in state.items() if rank in other["waits"])
    who = f"rank(s) {waiting} wait for it" if waiting else "no other rank waits for it"
    if stopped:
        cause, fix = ("its process is stopped (SIGSTOP, a debugger, ^Z): it cannot run, and its neighbours wait in "
                      "their receives", "continue it (kill -CONT) or find who stopped it")
    elif info["instruction"] is None:
        cause, fix = ("it never reached training: still importing and building its engine, or waiting for a JIT "
                      "build lock (the job's error names one if so)", "read its log; remove a stale build lock")
    elif _in_injected_hang(stack):
        cause, fix = (f"an injected hang: its stack shows utils/runtime/faults.py sleeping at the start of "
                      f"{info['instruction']} (JobSpec.fault kind='hang')", "run the spec without the fault")
    else:
        cause, fix = (f"it never finished {info['instruction']}: its stack ({summary}) shows where it is stuck, an "
                      "endless loop or a blocking call in that stage's code", f"read stacks-rank{rank}.txt; fix the "
                      "code it is stuck in, and keep a timeout on jobs")
    took = f" for {info['for_s']:.0f} s" if info["for_s"] else ""
    return Symptom(code="hang", what=f"rank {rank} (stage {where.stage}) is stuck in {info['instruction'] or 'setup'}"
                                     f"{took}; {who}",
                   where=where, evidence=evidence, cause=cause, fix=fix)


def _in_injected_hang(stack: ThreadStack | None) -> bool:
    return bool(stack) and any(f.file.endswith("runtime/faults.py") for f in stack.frames[:3])


# --- succeeded ------------------------------------------------------------------------------------
def _succeeded(run: Run) -> tuple[str, list[Symptom]]:
    spec = run.spec
    one_chunk = spec.model_chunks == 1  # several chunks per rank: a rank's layers are not one piece of `parts`
    parts = run.parts if len(run.partitions) == 1 and one_chunk else None  # peers by layers while it holds
    names = list(spec.shape.layer_names) if parts else None
    info = schedule_info(spec.schedule)
    baseline = FillAndDrain(formula=info.bubble, ratio=info.bubble_ratio(
        spec.num_stages, spec.micro_batches, spec.model_chunks)) if info.bubble_ratio is not None else None
    try:
        findings = performance_symptoms(run.timeline, predicted_stage_costs=run.predicted_stage_costs if one_chunk
                                        else None, step_memory=run.step_memory, fill_and_drain=baseline,
                                        stage_layers=[names[a:b] for a, b in zip(parts, parts[1:])] if parts else None)
    except ValueError:  # a record cut short may leave a step without compute: its partial-record finding says so
        if not run.partial:
            raise
        findings = []
    times = run.step_times
    done = f"{len(run.losses)} steps, {sum(times[1:]) / max(1, len(times) - 1):.3g} s/step after the first" \
        if len(times) > 1 else f"{len(run.losses)} step(s)"
    worst = next((f for f in findings if f.severity == "warning"), None)
    return done + (f"; {worst.what}" if worst else "; no straggler, balanced stages"), findings


# --- a partial record ------------------------------------------------------------------------------
def _partial(run: Run) -> Symptom:
    """The ``partial-record`` finding: which files of the record are cut short or damaged."""
    problems = run.record_problems
    ranks = {p.rank for p in problems}
    causes = []
    if any(p.kind != "damaged" for p in problems):
        causes.append("files were cut short after their ranks wrote them (a disk that filled up, a copy or a "
                      "move cut short, an edit by hand); what is there is read")
    if any(p.kind == "damaged" for p in problems):
        causes.append("lines were damaged after they were written (garbage bytes: a faulty disk, an edit by "
                      "hand); they are skipped, the rest of each file is read")
    return Symptom(code="partial-record", severity="warning",
                   what=f"{PARTIAL}: {len(problems)} problem(s) in {len({p.path for p in problems})} file(s) "
                        f"of its record",
                   where=Where(rank=next(iter(ranks)) if len(ranks) == 1 else None),
                   evidence={"problems": [str(p) for p in problems], "run": str(run.path)},
                   cause="; ".join(causes),
                   fix="run the job again (run_job(run.spec)) for figures that rest on the whole run")


# --- the injected fault ---------------------------------------------------------------------------
def _injected(run: Run) -> Symptom:
    fault, spec = run.spec.fault, run.spec
    rank = fault.stage * spec.data_parallel + fault.replica
    words = _FAULT_WORDS[fault.kind].format(factor=fault.slowdown, tensor=fault.tensor or "shape",
                                            cap=fault.cap_mb or 0)
    at = ("" if fault.kind in ("slow", "memory") else
          f" in {'send_act' if fault.instruction == 'forward' else 'send_grad'} (its first micro-batch)"
          if fault.kind == "mismatch" else " at its first load" if fault.kind == "exhausted" else
          f" at the start of {fault.instruction}")
    kind = "from" if fault.kind in ("slow", "memory") else "in"
    return Symptom(code="injected-fault", severity="info",
                   what=f"the spec injected this: rank {rank} (stage {fault.stage}) {words}{at} {kind} step {fault.step}",
                   where=Where(rank=rank, stage=fault.stage,
                               instruction=None if fault.kind in ("slow", "memory") else
                               "load" if fault.kind == "exhausted" else fault.instruction,
                               step=fault.step),
                   evidence={"fault": {k: v for k, v in vars(fault).items() if v is not None
                                       and not (k == "instruction" and fault.kind in ("slow", "memory", "exhausted"))}},
                   cause="JobSpec.fault, on purpose", fix="run the spec with fault=None")
