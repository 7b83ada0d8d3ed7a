"""JobSpec checks: every mistake is caught before launch with a message saying what to change."""

import json

import pytest

from utils import Fault, JobSpec

SMALL = {"model_options": {"blocks": 2}}  # 4 layers: embedding, 2 blocks, head


@pytest.mark.parametrize("fields, message", [
    ({"num_stages": 5}, r"num_stages=5 but model 'gpt' has only 4 layers.*num_stages <= 4"),
    ({"micro_batches": 0}, r"micro_batches must be at least 1, got 0"),
    ({"micro_batch_size": -1}, r"micro_batch_size must be at least 1, got -1"),
    ({"num_stages": 2, "micro_batches": 3, "train_batch_size": 16},
     r"train_batch_size=16 but .* = 12; DeepSpeed asserts they are equal. Change micro_batches to 4"),
    ({"partition": "profile-ish"}, r"unknown partition 'profile-ish'"),
    ({"num_stages": 2, "partition": [0, 4]}, r"have 2 entries; 2 stages need 3 boundaries"),
    ({"num_stages": 2, "partition": [0, 2, 5]}, r"must end at 4 \(the layer count\)"),
    ({"num_stages": 2, "partition": [1, 2, 4]}, r"must start at 0"),
    ({"num_stages": 3, "partition": [0, 2, 2, 4]}, r"not strictly increasing: stage 1 would own no layers"),
    # Before, floats passed the check and every rank truncated them: [0, 2.5, 4] ran as [0, 2, 4].
    ({"num_stages": 2, "partition": [0, 2.5, 4]}, r"partition: boundary \[1\] = 2.5 is not an integer"),
    ({"schedule": "pipedream"}, r"unknown schedule 'pipedream'; choose one of gpipe, 1f1b, interleaved-1f1b"),
    ({"device": "tpu"}, r"unknown device"),
    ({"timeout": 0}, r"timeout must be a positive, finite number"),
    # Before: "cannot convert float NaN to integer", after the run directory was created.
    ({"timeout": float("inf")}, r"timeout must be a positive, finite number .*got inf"),
    # The process-group timeout (seconds, torch's timedelta): before launch, not as a rank's error.
    ({"pg_timeout": 0}, r"pg_timeout must be a positive, finite number \(seconds one send, receive or collective"),
    ({"pg_timeout": float("nan")}, r"pg_timeout must be a positive, finite number .*got nan"),
    ({"pg_timeout": 0.5}, r"pg_timeout=0.5 s is too short: the ranks also connect to each other under it"),
    # Before, lr and seed were not checked and every rank failed 12-16 s later.
    ({"lr": -1}, r"lr must be a positive, finite number \(a learning rate such as 3e-3\)"),
    ({"seed": -1}, r"seed must be at least 0"),
    ({"partition": [0, "4", 4]}, r"partition: boundary \[1\] = '4' is not an integer layer index"),
    ({"fault": Fault(stage=3)}, r"fault stage 3 is outside 0..1"),
    ({"fault": Fault(instruction="jump")}, r"unknown fault instruction"),
])
def test_bad_specs_are_explained(fields, message):
    with pytest.raises(ValueError, match=message):
        JobSpec(**{**SMALL, **fields}).check()


@pytest.mark.parametrize("name", ["num_stages", "micro_batches", "micro_batch_size", "steps", "data_parallel"])
@pytest.mark.parametrize("value", [True, 2.0])
def test_counts_are_integers_not_booleans_or_floats(name, value):
    # Before, True passed as a count (bool is an int to Python) and 2.0 reached DeepSpeed.
    with pytest.raises(TypeError, match=f"{name} must be an integer"):
        JobSpec(**{**SMALL, name: value}).check()


@pytest.mark.parametrize("fields, message", [
    ({"timeout": None}, r"timeout must be a number \(seconds the whole job may take, such as 600\), got None"),
    ({"timeout": "60"}, r"timeout must be a number .* got '60'"),
    ({"lr": "fast"}, r"lr must be a number \(a learning rate such as 3e-3\), got 'fast'"),
    ({"seed": None}, r"seed must be an integer, got None"),
    ({"pg_timeout": "5"}, r"pg_timeout must be a number \(seconds one send, receive or collective may wait"),
    ({"train_batch_size": 16.0}, r"train_batch_size must be an integer"),
    ({"name": 3}, r"name must be a string"),
    ({"model": None}, r"model must be a preset name"),
    ({"fault": "raise"}, r"fault must be a utils.Fault"),
])
def test_wrong_types_name_the_field(fields, message):
    # Before, these gave bare TypeErrors from deep inside ("'<' not supported ...") or none at all.
    with pytest.raises(TypeError, match=message):
        JobSpec(**{**SMALL, **fields}).check()


def test_numpy_integers_are_integers():
    np = pytest.importorskip("numpy")
    spec = JobSpec(num_stages=np.int64(2), micro_batches=np.int32(4), partition=np.array([0, 2, 4]),
                   seed=np.int64(7), **SMALL)
    spec.check()  # before: "num_stages must be a positive integer, got 2"
    assert type(spec.num_stages) is int and spec.partition == (0, 2, 4) and type(spec.partition[1]) is int
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec


def test_a_bad_spec_starts_nothing(tmp_path):
    from utils import run_job

    # Before, [0, 2.5, 8] ran as [0, 2, 8] while spec.json recorded 2.5.
    with pytest.raises(ValueError, match=r"partition: boundary \[1\] = 2.5"):
        run_job(JobSpec(num_stages=2, partition=[0, 2.5, 8]), directory=tmp_path, progress=False)
    with pytest.raises(ValueError, match="timeout"):
        run_job(JobSpec(timeout=float("inf")), directory=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_unknown_preset_and_option():
    with pytest.raises(ValueError, match=r"unknown model preset 'bert'; choose one of"):
        JobSpec(model="bert").check()
    with pytest.raises(ValueError, match=r"has no option\(s\) \['layers'\]"):
        JobSpec(model_options={"layers": 3}).check()
    with pytest.raises(ValueError, match=r"hidden \(128\) must be divisible by heads \(3\)"):
        JobSpec(model_options={"heads": 3}).check()  # before any rank fails building a block


def test_spec_round_trips_through_json():
    spec = JobSpec(num_stages=3, partition=[0, 2, 5, 8], fault=Fault(kind="hang", stage=1),
                   model_options={"blocks": 6})
    import json

    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    # A list and a tuple of the same boundaries are the same spec (find_run relies on it).
    assert JobSpec(partition=[0, 3, 8]) == JobSpec(partition=(0, 3, 8))
    assert JobSpec(partition=[0, 3, 8]).partition == (0, 3, 8)
    with pytest.raises(ValueError, match="unknown JobSpec field"):
        JobSpec.from_dict({"pipe_parallel_size": 4})


def test_for_this_machine_fits_the_model_to_the_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert JobSpec.for_this_machine(num_stages=2).model == "gpt-large"
    on_cpu = JobSpec.for_this_machine(num_stages=2, device="cpu")
    assert (on_cpu.model, on_cpu.device) == ("gpt", "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert (JobSpec.for_this_machine(num_stages=2).model, JobSpec.for_this_machine(num_stages=2).device) == ("gpt", "cpu")
    assert JobSpec.for_this_machine(num_stages=2, model="mlp").model == "mlp"


# --- what a batch mismatch suggests (issue 16, point 4) ------------------------------------------
def _suggested_specs(spec):
    """Every spec the error message proposes, read back from the message itself."""
    import re
    from dataclasses import replace

    with pytest.raises(ValueError) as caught:
        spec.check()
    message = str(caught.value)
    advice = message.partition("DeepSpeed asserts they are equal. ")[2]
    assert advice, message
    # Only whole numbers: a fractional value ("micro_batches to 7.5") cannot be typed into a spec.
    assert not re.search(r"\d\.\d", advice), message
    specs = []
    for option in re.split(r", or |; or ", advice.removeprefix("Change it: ").removeprefix("Change ")):
        if option.startswith("drop train_batch_size"):
            specs.append(replace(spec, train_batch_size=None))
            continue
        first = re.fullmatch(r"(\w+) to (\d+)(?: with (.*))?", option)
        assert first, f"unreadable suggestion {option!r} in: {message}"
        changes = {first[1]: int(first[2])}
        for extra in filter(None, (first[3] or "").split(" and ")):
            name, _, value = extra.partition("=")
            changes[name] = int(value)
        specs.append(replace(spec, **changes))
    return message, specs


def test_the_chapter_1_mismatch_suggests_whole_counts_that_pass():
    # Chapter 1 shows this spec being refused; before, the message said "Change micro_batches to 7.5".
    spec = JobSpec(num_stages=4, micro_batch_size=8, micro_batches=8, train_batch_size=60)
    message, specs = _suggested_specs(spec)
    assert "7.5" not in message
    assert "train_batch_size to 56 with micro_batches=7" in message
    assert "micro_batch_size to 6 with micro_batches=10" in message
    assert "micro_batch_size to 10 with micro_batches=6" in message
    assert message.endswith("or drop train_batch_size (it is then derived)")
    for suggested in specs:
        suggested.check()  # every suggestion is a spec that runs
    kept = [s for s in specs if s.train_batch_size == 60]
    assert {(s.micro_batch_size, s.micro_batches) for s in kept} == {(6, 10), (10, 6)}


@pytest.mark.parametrize("data_parallel", [1, 2, 3])
def test_every_batch_suggestion_is_valid(data_parallel):
    """Over a grid of mismatches: each suggestion, applied as written, passes check(), and
    the nearest fix that keeps the intended batch is offered whenever one exists."""
    from utils.jobs.spec import batch_fixes

    for target in range(1, 41):
        for size in range(1, 7):
            for count in range(1, 7):
                spec = JobSpec(**SMALL, num_stages=1, data_parallel=data_parallel, micro_batch_size=size,
                               micro_batches=count, train_batch_size=target)
                if target == spec.global_batch:
                    assert batch_fixes(spec) == []
                    continue
                _, specs = _suggested_specs(spec)
                assert len(specs) == len(batch_fixes(spec)) >= 2
                for suggested in specs:
                    suggested.check()
                keeps_batch = [s for s in specs if s.train_batch_size == target]
                if target % data_parallel == 0:  # some micro-batch size and count give the batch
                    assert keeps_batch, (target, size, count, data_parallel)
                if target % (size * data_parallel) == 0:  # the count alone fixes it: offered first
                    assert specs[0] == JobSpec(**{**spec.to_dict(), "micro_batches": target // (size * data_parallel)})


def test_the_process_group_timeout_reaches_deepspeed_in_seconds():
    from datetime import timedelta

    from utils.runtime.pgjoin import pg_timeout

    JobSpec(**SMALL, pg_timeout=5).check()
    assert JobSpec().pg_timeout is None and pg_timeout(JobSpec()) is None   # default: DEEPSPEED_TIMEOUT, unchanged
    assert pg_timeout(JobSpec(pg_timeout=2.5)) == timedelta(seconds=2.5)
    spec = JobSpec(**SMALL, pg_timeout=5)
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    assert JobSpec.from_dict({k: v for k, v in JobSpec().to_dict().items() if k != "pg_timeout"}) == JobSpec()


def test_a_rank_passes_the_timeout_to_deepspeed_only_when_set(monkeypatch):
    import deepspeed

    from utils.runtime.pgjoin import join_process_group

    calls = []
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kwargs: calls.append(kwargs))
    join_process_group("cpu", JobSpec(pg_timeout=5))
    join_process_group("cpu", JobSpec())
    assert [c.get("timeout") and c["timeout"].total_seconds() for c in calls] == [5.0, None]
    assert [c["dist_backend"] for c in calls] == ["gloo", "gloo"]
