"""Every schedule of the catalogue as a real job on torch's runtime (2 CPU ranks, gloo): the
same `run_job`, run directory, `Run`, timeline, metrics, what-if calibration, `diagnose` and
run panel as a DeepSpeed job; the traced order is the catalogue's schedule; the losses are
the same training as DeepSpeed's, and where they differ the difference is DeepSpeed's
gradient clipping, reproduced exactly."""

from __future__ import annotations

import pytest

from utils import Fault, JobFailed, JobSpec, run_job
from utils.jobs.diagnose import diagnose
from utils.planning.catalogue import SCHEDULE_NAMES, schedule_info
from utils.planning.whatif import predict_from_timeline
from utils.system.procs import job_processes
from utils.timeline import COMPUTE_KINDS
from utils.ui.plots import compare_timelines
from utils.workloads.reference import train_sequential

pytestmark = pytest.mark.integration

BASE = dict(model="mlp", model_options={"blocks": 8, "hidden": 64}, num_stages=2, micro_batches=4,
            micro_batch_size=8, steps=3, device="cpu", timeout=180)
KINDS = {"never": {"forward", "backward"}, "always": {"forward", "backward_input", "backward_weight"},
         "partly": {"forward", "backward", "backward_input", "backward_weight"}}


@pytest.fixture(scope="module")
def torch_runs(runs_root):
    """One job per schedule, all on torch's runtime (1f1b and gpipe asked for explicitly)."""
    return {name: run_job(JobSpec(**BASE, schedule=name, runtime="torch", name=f"torch-{name}"), progress=False)
            for name in SCHEDULE_NAMES}


def test_every_schedule_runs_as_a_job_and_its_timeline_is_the_schedule(torch_runs):
    m, steps = BASE["micro_batches"], BASE["steps"]
    for name, run in torch_runs.items():
        assert run.ok and job_processes(run.path) == [], name
        schedule = run.schedule
        assert (schedule.name, schedule.chunks) == (name, schedule_info(name).default_chunks)
        timeline = run.timeline
        assert timeline.source == "measured" and timeline.steps == list(range(steps))
        assert timeline.meta["runtime"] == "torch" and timeline.meta["placement"] == schedule.placement
        assert len(run.parts) == run.spec.virtual_stages + 1
        for rank in range(2):
            for step in range(steps):
                events = timeline.select(step=step, stage=rank, kinds=COMPUTE_KINDS)
                # one event per compute action of the schedule, in the schedule's order
                assert run.actions(rank, step) == [str(a) for a in schedule.actions[rank]], (name, rank, step)
                assert {e.kind for e in events} == KINDS[schedule_info(name).split_backward], name
        # ranks overlap in time: a pipeline, not two runs one after the other
        step1 = timeline.for_step(1)
        ends = [max(e.end for e in step1.select(stage=r)) for r in range(2)]
        starts = [min(e.start for e in step1.select(stage=r)) for r in range(2)]
        # timing-claim: construction — data dependencies on one machine-wide monotonic clock: rank 1's first
        # action needs rank 0's first forward and rank 0's last a gradient from rank 1, however slow either runs
        assert starts[1] < ends[0] and starts[0] < ends[1]
        metrics = timeline.metrics()
        # timing-claim: construction — idle over stage time: rank 1 waits for rank 0's first forward and rank 0
        # for rank 1's last gradient (so some idle), and every rank computes (so not all idle)
        assert 0 < metrics.bubble_ratio < 1 and len(run.losses) == steps
        assert set(run.peak_memory) == {0, 1}
        assert diagnose(run).kind == "ok", name


def test_every_schedule_trains_the_same_model_the_same_way(torch_runs):
    """One seeded model and data stream, one optimizer: every torch schedule computes the same
    losses, those of the sequential model with the whole gradient clipped to norm 1.0."""
    expected = train_sequential(JobSpec(**BASE), clip="global")
    assert expected[-1] < expected[0]  # it trains
    for name, run in torch_runs.items():
        assert run.losses == pytest.approx(expected, rel=1e-5, abs=1e-6), name


def test_torch_and_deepspeed_runs_of_one_spec_agree_and_where_they_differ_it_is_deepspeeds_clipping(torch_runs):
    """DeepSpeed 0.19.8 clips every stage's gradient by the norm of the *first stage's* alone
    (``clip_grad_norm_`` counts only model-parallel rank 0's parameters, and PipelineModule flags
    none as model-parallel); the torch runtime clips by the whole model's norm. With the norm
    below 1.0 nothing is clipped and the two runtimes give the same losses."""
    deepspeed = run_job(JobSpec(**BASE, schedule="1f1b", runtime="deepspeed"), progress=False)
    first_stage = deepspeed.parts[1]
    assert deepspeed.losses == pytest.approx(train_sequential(JobSpec(**BASE), clip=first_stage), rel=1e-5, abs=1e-6)
    assert deepspeed.losses[0] == pytest.approx(torch_runs["1f1b"].losses[0], rel=1e-6)  # same weights, same data
    quiet = dict(BASE, lr=1e-4, model="gpt", model_options={"blocks": 2, "hidden": 32, "heads": 2, "vocab": 128,
                                                            "seq_len": 8})
    runs = [run_job(JobSpec(**quiet, schedule="1f1b", runtime=r), progress=False) for r in ("deepspeed", "torch")]
    assert runs[0].losses == pytest.approx(runs[1].losses, rel=1e-5, abs=1e-6)
    assert runs[0].losses == pytest.approx(train_sequential(JobSpec(**quiet)), rel=1e-5, abs=1e-6)  # nothing clipped
    # One panel: the DeepSpeed 1F1B run beside the torch interleaved run of the same model.
    figure = compare_timelines(deepspeed.timeline, torch_runs["interleaved-1f1b"].timeline,
                               labels=("DeepSpeed 1F1B", "torch interleaved 1F1B"))
    assert len(figure.data) > 0


def test_the_what_if_calibration_reads_every_placement(torch_runs):
    """The simulator, calibrated on a run, replays the run's own order (the V schedules too)."""
    for name in ("interleaved-1f1b", "zb-h1", "dualpipev", "zbv"):
        measured = torch_runs[name].timeline
        predicted = predict_from_timeline(measured)
        [step] = predicted.steps
        for rank in range(2):
            order = [(e.kind, e.micro_batch, e.chunk) for e in predicted.select(step=step, stage=rank,
                                                                                  kinds=COMPUTE_KINDS)]
            assert order == [(e.kind, e.micro_batch, e.chunk)
                             for e in measured.select(step=1, stage=rank, kinds=COMPUTE_KINDS)], (name, rank)
        print(f"{name}: measured / predicted makespan = "
              f"{measured.metrics().makespan / predicted.metrics().makespan:.2f} (this run)")


def test_a_fault_in_a_torch_job_is_diagnosed_like_a_deepspeed_one(runs_root):
    spec = JobSpec(**BASE, schedule="zbv", fault=Fault(kind="raise", stage=1, step=1, instruction="backward_input"))
    with pytest.raises(JobFailed) as caught:
        run_job(spec, progress=False)
    run = caught.value.run
    assert job_processes(run.path) == []
    d = diagnose(run)
    assert d.kind == "failed" and d.primary.code == "injected-fault", d
    where = d.primary.where
    assert (where.rank, where.stage, where.instruction, where.step, where.micro_batch) == (1, 1, "backward_input", 1, 0)


def test_the_run_panel_lists_every_schedule_and_runs_a_torch_one(runs_root):
    from utils.ui.widgets import RunPanel

    panel = RunPanel(JobSpec(**BASE, schedule="1f1b"))
    assert list(panel.schedule.options) == list(SCHEDULE_NAMES)  # the menu is the catalogue
    panel.schedule.value = "zbv"
    panel.run_button.click()
    assert panel.wait(300) == "succeeded", panel.error
    run = panel.history[0]
    assert run.spec.schedule == "zbv" and run.spec.resolved_runtime == "torch" and job_processes(run.path) == []
    assert "zbv@torch" in panel.history_label(0) and "zbv@torch" in panel.result_title.value
    bars = [t for t in panel.figure.data if t.type == "bar"]
    assert {t.name for t in bars} >= {"forward", "backward_input", "backward_weight"}
    assert "bubble_ratio" in panel.metrics.value and "diagnosis" in panel.diagnosis.value
