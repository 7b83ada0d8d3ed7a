"""`lint_config` against DeepSpeed's own verdicts, recorded on real ranks (seconds, no ranks).

tests/data/lint_outcomes.json holds what ``deepspeed.initialize`` of a real PipelineModule and
one ``train_batch()`` did with each config of the corpus (tests/lintdiff/); re-record it with
``.venv/bin/python -m tests.lintdiff.record`` after a DeepSpeed or torch upgrade, or after the
corpus changes. tests/integration/test_lint_differential.py re-records a sample to notice when
DeepSpeed's behaviour moves away from the file.
"""

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.lintdiff.corpus import corpus
from tests.lintdiff.record import OUTCOMES
from tests.lintdiff.verdict import KNOWN_DISAGREEMENTS, judge_all, summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data():
    return json.loads(OUTCOMES.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def judged(data):
    return judge_all(data)


def test_the_recording_is_of_this_corpus_and_these_versions(data):
    assert data["recorded_with"] == f"deepspeed {version('deepspeed')}, torch {version('torch')}", (
        "re-record: .venv/bin/python -m tests.lintdiff.record")
    recorded = {c["id"]: c for c in data["cases"]}
    for case in corpus():
        assert case.id in recorded, f"{case.id} is not recorded: re-record (python -m tests.lintdiff.record)"
        assert recorded[case.id]["config"] == case.config and recorded[case.id]["intent"] == case.intent, case.id
    assert len(data["cases"]) >= 300


def test_the_linter_agrees_with_deepspeed(judged):
    rows = [(case["id"], j) for case, j in judged if not j.agree]
    for case_id, j in rows:
        print(f"{case_id}: DeepSpeed {j.deepspeed}, linter {j.linter} — {'; '.join(j.why) or 'ran as written'}"
              f"\n    why: {KNOWN_DISAGREEMENTS.get(case_id, 'NOT EXPLAINED')}")
    print(summary(judged))
    unexplained = [case_id for case_id, _ in rows if case_id not in KNOWN_DISAGREEMENTS]
    assert not unexplained, f"disagreements without a reason in KNOWN_DISAGREEMENTS: {unexplained}"
    stale = sorted(set(KNOWN_DISAGREEMENTS) - {case_id for case_id, _ in rows})
    assert not stale, f"listed as disagreeing but agreeing now: {stale}"
    assert sum(j.agree for _, j in judged) >= 0.99 * len(judged)


def test_the_reviews_three_misses_are_errors_and_the_curriculum_block_is_clean(judged):
    by_id = {case["id"]: j for case, j in judged}
    for case_id in ("workbook/seed-snippet-dp3", "mutate/pipeline.pipe_partitioned='true'",
                    "mutate/wall_clock_breakdown=true"):
        assert by_id[case_id].deepspeed == by_id[case_id].linter == "rejects", case_id
    assert by_id["mutate/curriculum-block"].deepspeed == by_id["mutate/curriculum-block"].linter == "as-written"


def test_the_documented_agreement_is_the_measured_one(judged):
    assert summary(judged) in (ROOT / "docs" / "config-lint.md").read_text(encoding="utf-8")
