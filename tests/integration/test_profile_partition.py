"""partition="profile" on real jobs: the ranks run the profiled boundaries, the record keeps
the prediction; and the gpt preset shows the imbalance the course is about."""

import json

import pytest

from tests.helpers import SMALL_GPT
from utils import JobSpec, partition_layers, run_job, stage_costs
from utils.jobs.plan import profile_for_job
from utils.profiling.profile import profile_layers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of this module's own, so the test sees the profile its job used."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("cache")
    mp.setenv("WORKBOOK_CACHE", str(path))
    yield path
    mp.undo()


def test_profile_partition_is_imposed_and_recorded(runs_root, cache):
    spec = JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=2, partition="profile",
                   device="cpu")
    run = run_job(spec, progress=False)
    profile = profile_for_job(spec)
    assert profile.cached  # the job's own profile, not a new measurement
    expected = partition_layers(profile.total, 2, method="balanced")
    assert run.parts == expected
    # every rank built exactly its profiled share of the layers
    assert {data["stage"]: data["layers"] for data in run.results.values()} == \
        {s: [expected[s], expected[s + 1]] for s in range(2)}
    assert run.partition_method == "profile"
    assert run.predicted_stage_costs == pytest.approx(stage_costs(profile.total, expected))
    assert len(run.losses) == 2 and run.timeline.meta["parts"] == expected

    # a parameters run of the same job predicts from the cached profile too
    other = run_job(JobSpec(**{**spec.to_dict(), "partition": "parameters", "steps": 1}), progress=False)
    assert other.partition_method == "parameters"
    assert other.predicted_stage_costs == pytest.approx(stage_costs(profile.total, other.parts))

    # On this small model the measured balance may coincide with DeepSpeed's split, so make
    # the cached profile say the head costs 10 blocks: the job must now run [0, 3, 4], a
    # split no DeepSpeed method gives here.
    (path,) = (cache / "profiles").glob("gpt-*.json")
    stored = json.loads(path.read_text())
    stored["profile"]["forward"] = [0.001, 0.001, 0.001, 0.010]
    stored["profile"]["backward"] = [0.002, 0.002, 0.002, 0.020]
    path.write_text(json.dumps(stored))
    skewed = run_job(JobSpec(**{**spec.to_dict(), "steps": 1}), progress=False)
    assert skewed.parts == [0, 3, 4] != other.parts
    assert {data["stage"]: data["layers"] for data in skewed.results.values()} == {0: [0, 3], 1: [3, 4]}
    assert skewed.predicted_stage_costs == pytest.approx([0.009, 0.030])


def test_gpt_preset_shows_the_parameter_balance_problem(cache):
    """On the default gpt, DeepSpeed's parameter balance ranks the embedding like a heavy
    layer though it costs little, and the stage with the head and the loss is the slowest."""
    profile = profile_layers("gpt", device="cpu", threads=1)
    head, embedding, blocks = profile.total[-1], profile.total[0], profile.total[1:-1]
    assert head > 2 * max(blocks) and embedding < max(blocks)
    assert profile.param_bytes[0] > 4 * profile.param_bytes[1]
    rows = {(p, r["method"]): r for p in (2, 4) for r in profile.compare_partitions(p)}
    two = rows[2, "parameters"]
    assert two["parts"] == [0, 4, 8] and two["slowest_stage"] == 1  # embedding + 3 blocks | 3 blocks + head
    assert rows[2, "balanced"]["bottleneck_ms"] < 0.85 * two["bottleneck_ms"]
    four = rows[4, "parameters"]
    assert four["slowest_stage"] == 3  # the head + loss stage
    assert rows[4, "balanced"]["bottleneck_ms"] <= four["bottleneck_ms"]
