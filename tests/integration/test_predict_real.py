"""The simulator against a real run: calibrate, predict, plot side by side, confirm."""

import pytest

import utils
from utils.jobs.confirm import confirm_top

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
    predicted = utils.predict_from_timeline(measured.timeline)
    assert predicted.source == "simulated"
    real = measured.timeline.metrics().makespan
    # The same configuration: only noise and what the simulator leaves out separate them.
    assert predicted.metrics().makespan == pytest.approx(real, rel=0.35)


def test_more_micro_batches_are_predicted_to_take_longer_but_bubble_less(measured):
    base, more = utils.predict_from_timeline(measured.timeline), utils.predict_from_timeline(measured.timeline, micro_batches=16)
    assert more.metrics().makespan > 2 * base.metrics().makespan
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
    assert confirmation.run.ok
    assert confirmation.run.spec.micro_batches == confirmation.row.micro_batches
    assert confirmation.measured_makespan > 0 and abs(confirmation.error) < 3
