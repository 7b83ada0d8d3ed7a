"""The simulator against a real run: calibrate, predict, plot side by side, confirm."""

import pytest

import utils
from utils.jobs.confirm import confirm_top
from utils.jobs.spec import JOB_SCHEDULES

pytestmark = pytest.mark.integration


# Events of several milliseconds: with SMALL_GPT's sub-millisecond events, DeepSpeed's Python
# overhead between instructions and the scheduler's time slices (which the simulator leaves out)
# made up to half of a step on CI's two cores, and a single run's median step could be 1.8x
# the prediction.
MILLISECOND_GPT = {"model": "gpt", "micro_batch_size": 8,
                   "model_options": {"blocks": 2, "hidden": 128, "heads": 4, "vocab": 512, "seq_len": 64}}


@pytest.fixture(scope="module")
def measured(runs_root):
    return utils.run_job(utils.JobSpec(**MILLISECOND_GPT, num_stages=2, micro_batches=4, steps=4),
                         progress=False)


def test_prediction_of_the_same_configuration_reproduces_the_run(measured):
    """The prediction of the run's own configuration is a model of that run: the same
    instructions in the same order on every stage, each at the cost calibrated from it.
    How close its makespan comes to the measured one is printed, not asserted: that depends
    on the machine's load (CI once measured 1.8x the prediction on two shared cores);
    benchmarks/predict_accuracy.py reports it on a quiet machine."""
    predicted = utils.predict_from_timeline(measured.timeline)
    assert predicted.source == "simulated"
    costs = utils.measured_stage_costs(measured.timeline)
    m = measured.spec.micro_batches
    [step] = predicted.steps
    for stage in range(2):
        order = predicted.compute_order(stage, step)
        assert len(order) == 2 * m  # every micro-batch's forward and backward, once
        for real_step in measured.timeline.steps:  # DeepSpeed's 1F1B order, on every step
            assert measured.timeline.compute_order(stage, real_step) == order, (stage, real_step)
        busy = predicted.metrics().stage_compute[stage]
        assert busy == pytest.approx(m * (costs.forward[stage] + costs.backward[stage]), rel=1e-9)
    real = measured.timeline.metrics().makespan
    print(f"measured makespan {real * 1e3:.1f} ms, predicted {predicted.metrics().makespan * 1e3:.1f} ms "
          f"(measured / predicted = {real / predicted.metrics().makespan:.2f} on this run; machine load "
          f"and ranks sharing cores change it)")


def test_more_micro_batches_are_predicted_to_take_longer_but_bubble_less(measured):
    base, more = utils.predict_from_timeline(measured.timeline), utils.predict_from_timeline(measured.timeline, micro_batches=16)
    # timing-claim: simulated — the simulator on the costs calibrated from this run: with 2 stages
    # 1F1B at m=16 takes >= 17/5 of m=4 for any positive costs and link latency (checked on random
    # costs over four decades), and the fill/drain share falls unless one stage is many times the other
    assert more.metrics().makespan > 2 * base.metrics().makespan
    # timing-claim: simulated — the same two simulations on the calibrated costs (see above)
    assert more.metrics().bubble_ratio < base.metrics().bubble_ratio


def test_one_plotting_function_draws_both(measured):
    fig = utils.compare_timelines(measured.timeline, utils.predict_from_timeline(measured.timeline),
                                  labels=("measured", "simulated"))
    text = fig.to_html(include_plotlyjs=False)
    assert "measured" in text and "simulated" in text


def test_searched_candidates_are_confirmed_by_real_runs(measured):
    costs = utils.measured_stage_costs(measured.timeline)
    b = measured.spec.micro_batch_size
    rows = utils.search_micro_batches(8, num_stages=2, forward_per_sample=[f / b for f in costs.forward],
                                      backward_per_sample=[x / b for x in costs.backward],
                                      activation_bytes_per_sample=1.0, memory_budget=8.0, comm=costs.comm)
    [confirmation] = confirm_top(rows, measured.spec, top=1, steps=3)
    row = confirmation.row
    # The fastest feasible row DeepSpeed can run is the one confirmed (the simulator's ranking).
    # timing-claim: simulated — the rows' step times are the search's predictions, not measurements
    assert row == min((r for r in rows if r.feasible and r.schedule in JOB_SCHEDULES), key=lambda r: r.step_time)
    run = confirmation.run
    assert run.ok
    assert (run.spec.micro_batches, run.spec.micro_batch_size, run.spec.schedule) == \
        (row.micro_batches, row.micro_batch_size, row.schedule)
    # The error is the prediction against this run's own median makespan, as documented. Its
    # size depends on the load during the two runs: printed (benchmarks/predict_accuracy.py
    # holds the accuracy target).
    real = run.timeline.metrics().makespan
    assert confirmation.measured_makespan == real
    assert confirmation.error == pytest.approx((row.step_time - real) / real, rel=1e-12)
    print(f"confirmed m={row.micro_batches}: predicted {row.step_time * 1e3:.1f} ms, measured "
          f"{real * 1e3:.1f} ms, error {confirmation.error:+.0%} (this run)")
