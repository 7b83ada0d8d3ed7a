"""Layer profiling: shape of the result, the cache, and how partition="profile" uses it.

Measurements here run a tiny preset in this process (a fraction of a second); no job starts.
"""

import json
import multiprocessing
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import utils.profiling.profile as profiling
from utils import JobSpec, Run, get_model, partition_layers, stage_costs
import utils.jobs.plan as planning
import utils.system.cpu as cpu
from utils.jobs.plan import plan_job, profile_for_job
from utils.profiling.measure import measure_concurrently
from utils.profiling.profile import LayerProfile, profile_layers

TINY = {"blocks": 2, "hidden": 32, "heads": 2, "vocab": 128, "seq_len": 8}
FAST = {"model_options": TINY, "micro_batch_size": 2, "device": "cpu", "warmup": 1, "repeats": 3}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets an empty cache of its own (and an empty in-process memo)."""
    monkeypatch.setenv("WORKBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(profiling, "_written", {})
    return tmp_path / "cache"


@pytest.fixture
def measurements(monkeypatch):
    """Counts real measurements (calls of the measuring function)."""
    calls = []
    for name in ("measure_layers", "measure_concurrently"):
        real = getattr(profiling, name)

        def counting(*args, _real=real, **kwargs):
            calls.append(time.time())
            return _real(*args, **kwargs)

        monkeypatch.setattr(profiling, name, counting)
    return calls


def test_profile_of_a_tiny_preset(measurements):
    profile = profile_layers("gpt", **FAST)
    model = get_model("gpt", TINY)
    n = model.num_layers
    assert profile.num_layers == n == 4 and len(measurements) == 1
    assert profile.layer_names == ["Embedding", "Block", "Block", "LMHead"]
    for values in (profile.forward, profile.backward, profile.total, profile.forward_iqr,
                   profile.backward_iqr, profile.param_bytes, profile.activation_bytes):
        assert len(values) == n
    assert all(t > 0 for t in profile.forward + profile.backward)
    assert profile.total == [f + b for f, b in zip(profile.forward, profile.backward)]
    assert all(len(s) == 3 for s in profile.forward_samples + profile.backward_samples)
    assert all(q >= 0 for q in profile.forward_iqr + profile.backward_iqr)
    assert profile.param_bytes == [4 * c for c in model.param_counts()]  # fp32
    hidden_bytes = 2 * 8 * 32 * 4  # micro-batch × seq_len × hidden × fp32
    assert profile.activation_bytes == [hidden_bytes] * 3 + [2 * 8 * 128 * 4]  # logits last
    assert profile.threads == 1 and profile.device == "cpu" and not profile.cached
    assert 0 < profile.core_share <= 1.5  # CPU time over wall time: at most about one core


def test_profiling_leaves_threads_and_rng_as_found():
    threads = torch.get_num_threads()
    state = torch.random.get_rng_state()
    profile_layers("gpt", **{**FAST, "threads": 2}, cache=False)
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), state)


def test_cache_hit_returns_equal_values_without_measuring(measurements, private_cache):
    first = profile_layers("gpt", **FAST)
    second = profile_layers("gpt", **FAST)
    assert len(measurements) == 1  # the second call did not measure
    assert second.cached and not first.cached
    assert second == first and second.total == first.total
    assert second.measured_at == first.measured_at
    assert len(list((private_cache / "profiles").glob("gpt-*.json"))) == 1


def test_cache_false_measures_again(measurements):
    first = profile_layers("gpt", **FAST)
    again = profile_layers("gpt", **FAST, cache=False)
    assert len(measurements) == 2 and not again.cached
    assert again.measured_at > first.measured_at
    assert profile_layers("gpt", **FAST).measured_at == again.measured_at  # it refreshed the cache


def test_concurrent_processes_pool_their_samples(measurements):
    """Two processes measure at once; the profile holds both sets of samples and their medians."""
    from utils.analysis.summary import Spread

    profile = profile_layers("gpt", **FAST, concurrency=2)
    assert profile.concurrency == 2 and len(measurements) == 1
    assert all(len(s) == 2 * FAST["repeats"] for s in profile.forward_samples + profile.backward_samples)
    assert profile.forward == [Spread.of(s).median for s in profile.forward_samples]
    assert profile.backward == [Spread.of(s).median for s in profile.backward_samples]
    assert 0 < profile.core_share <= 1.5 and "2 processes measuring at once" in str(profile)
    assert multiprocessing.active_children() == []
    assert profile_layers("gpt", **FAST, concurrency=2).cached  # cached under its own key
    assert profile_layers("gpt", **FAST).concurrency == 1 and len(measurements) == 2


def test_a_failing_profiling_process_is_raised_and_none_is_left():
    # profile_layers rejects these options before starting anything; handed straight to
    # the measuring processes, they fail in each of them instead.
    broken = SimpleNamespace(preset="gpt", options={**TINY, "heads": 3}, num_layers=4)
    key = profiling._key("gpt", broken.options, micro_batch_size=2, device="cpu", threads=1,
                         concurrency=2, warmup=1, repeats=3, seed=1234)
    with pytest.raises(RuntimeError, match=r"profiling process \d of 2 failed(.|\n)*divisible by heads"):
        measure_concurrently(broken, key)
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="divisible by heads"):
        profile_layers("gpt", **{**FAST, "model_options": broken.options}, concurrency=2)


def test_concurrency_is_for_cpu_profiles(monkeypatch):
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        profile_layers("gpt", **FAST, concurrency=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="applies to CPU profiles only"):
        profile_layers("gpt", **{**FAST, "device": "cuda"}, concurrency=2)


@pytest.mark.parametrize("change", [{"micro_batch_size": 3}, {"threads": 2}, {"repeats": 4},
                                    {"model_options": {**TINY, "blocks": 3}}, {"seed": 7}])
def test_a_different_key_measures_again(measurements, change):
    profile_layers("gpt", **FAST)
    profile_layers("gpt", **{**FAST, **change})
    assert len(measurements) == 2


def test_a_corrupt_cache_file_is_measured_again(measurements, private_cache, monkeypatch):
    profile_layers("gpt", **FAST)
    for path in (private_cache / "profiles").glob("*.json"):
        path.write_text("{not json")
    monkeypatch.setattr(profiling, "_written", {})  # as in a new process
    assert not profile_layers("gpt", **FAST).cached and len(measurements) == 2


def test_an_unwritable_cache_warns_and_the_process_reuses_its_profile(measurements, tmp_path,
                                                                       monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("WORKBOOK_CACHE", str(blocker))
    with pytest.warns(UserWarning, match="could not cache the layer profile"):
        first = profile_layers("gpt", **FAST)
    second = profile_layers("gpt", **FAST)
    assert second == first and second.cached and len(measurements) == 1


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        profile_layers("gpt", **{**FAST, "repeats": 0})
    with pytest.raises(ValueError, match="threads must be at least 1"):
        profile_layers("gpt", **{**FAST, "threads": 0})
    with pytest.raises(ValueError, match="unknown model preset"):
        profile_layers("bert")


def test_round_trip_and_display():
    profile = profile_layers("gpt", **FAST)
    again = LayerProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again == profile
    rows = profile.table()
    assert [r["layer"] for r in rows] == [0, 1, 2, 3] and rows[-1]["name"] == "LMHead + loss"
    assert sum(r["share"] for r in rows) == pytest.approx(1, abs=1e-3)
    assert "LMHead + loss" in profile._repr_html_() and "<table>" in profile._repr_html_()
    assert "total per micro-batch" in str(profile)
    with pytest.raises(ValueError, match="not a layer profile"):
        LayerProfile.from_dict({"model": "gpt"})


def _fake_profile(totals, **fields) -> LayerProfile:
    n = len(totals)
    base = dict(model="gpt", options={}, micro_batch_size=4, device="cpu", device_name="test",
                threads=1, concurrency=1, torch_version=torch.__version__, warmup=0, repeats=1, seed=1234,
                layer_names=["L"] * n, forward=[t / 3 for t in totals],
                backward=[2 * t / 3 for t in totals], forward_iqr=[0.0] * n,
                backward_iqr=[0.0] * n, forward_samples=[[t / 3] for t in totals],
                backward_samples=[[2 * t / 3] for t in totals], param_bytes=[4] * n,
                activation_bytes=[4] * n, measured_at=0.0)
    return LayerProfile(**{**base, **fields})


def test_partition_profile_balances_the_measured_costs(monkeypatch):
    costs = [0.01, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.10]  # cheap embedding, costly head
    seen = []

    def fake(spec, *, device=None, cache=True, measure=True):
        seen.append(spec)
        return _fake_profile(costs)

    monkeypatch.setattr(planning, "profile_for_job", fake)
    spec = JobSpec(num_stages=2, partition="profile", device="cpu")
    plan = plan_job(spec)
    assert list(plan.boundaries) == partition_layers(costs, 2, method="balanced") == [0, 6, 8]
    assert seen == [spec]  # one lookup serves the boundaries and the prediction
    record = plan.partition_record()
    assert record["method"] == "profile" and record["parts"] == [0, 6, 8]
    assert record["predicted_stage_costs"] == pytest.approx([0.11, 0.12])
    assert record["layer_costs"] == pytest.approx(costs)


def test_profile_for_job_uses_the_jobs_conditions(monkeypatch):
    calls = []
    monkeypatch.setattr(planning, "profile_layers", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    profile_for_job(JobSpec(num_stages=2, micro_batch_size=3, device="cpu", seed=5))
    (args, kwargs), = calls
    assert args == ("gpt",) and kwargs["micro_batch_size"] == 3 and kwargs["seed"] == 5
    assert kwargs["device"] == "cpu" and kwargs["threads"] == 2  # 4 cores // 2 ranks
    assert kwargs["concurrency"] == 2  # both ranks compute at once on this machine


def test_other_methods_predict_only_from_a_cached_profile(measurements):
    spec = JobSpec(**FAST_JOB, partition="parameters")
    plan = plan_job(spec)
    assert plan.profile is None and plan.method == "parameters"
    assert plan.partition_record()["predicted_stage_costs"] is None
    assert not measurements  # planning never measures for a method that does not need it
    profile = profile_for_job(spec)  # now it is cached
    assert plan_job(spec).profile == replace(profile, cached=True)
    explicit = plan_job(JobSpec(**FAST_JOB, partition=[0, 1, 4]))
    assert explicit.method == "explicit" and explicit.boundaries == (0, 1, 4)
    assert explicit.predicted_stage_costs == pytest.approx(stage_costs(profile.total, [0, 1, 4]))


FAST_JOB = {"model_options": TINY, "micro_batch_size": 2, "device": "cpu", "num_stages": 2}


@pytest.mark.parametrize("layout", ["plan.json", "partition.json (runs recorded before plan.json)"])
def test_run_reads_its_partition_record(tmp_path, layout):
    stored = {"parts": [0, 3, 4], "method": "profile", "predicted_stage_costs": [0.5, 0.25],
              "layer_costs": None, "profile": None}
    (tmp_path / "spec.json").write_text(JobSpec(**FAST_JOB).to_json())
    if layout == "plan.json":
        (tmp_path / "plan.json").write_text(json.dumps({"device": "cpu", "partition": stored}))
    else:
        (tmp_path / "partition.json").write_text(json.dumps(stored))
    run = Run.load(tmp_path)
    assert run.parts == [0, 3, 4] and run.partition_method == "profile"
    assert run.predicted_stage_costs == [0.5, 0.25]


def test_a_job_that_cannot_start_is_refused_before_it_is_profiled(measurements, tmp_path):
    from utils.jobs.launch import start_job

    gpus = torch.cuda.device_count()
    spec = JobSpec(**{**FAST_JOB, "device": "cuda", "num_stages": 2, "data_parallel": gpus + 1},
                   partition="profile")
    with pytest.raises(ValueError, match="GPUs"):
        start_job(spec, directory=tmp_path)
    assert not measurements and not list(tmp_path.iterdir())

