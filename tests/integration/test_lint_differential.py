"""Issue 36 on real ranks: DeepSpeed's verdicts on a sample of the linter's corpus, recorded
again now and compared with tests/data/lint_outcomes.json (which the unit test
tests/unit/test_lint_agreement.py checks the linter against on every config).

The sample spans the outcomes the recorder tells apart: a config that runs as written, one
that runs otherwise than written, one DeepSpeed's parser rejects, one the pipeline engine's
own assertion rejects, one that fails only in the first step (the world restarts after it),
and two data-parallel ones. A DeepSpeed or torch that behaves differently fails here with the
case and both outcomes; then re-record (``python -m tests.lintdiff.record``) and read the
agreement test's output.
"""

import json

import pytest

from tests.lintdiff.corpus import corpus
from tests.lintdiff.record import OUTCOMES, record
from tests.lintdiff.verdict import deepspeed_verdict, linter_verdict

pytestmark = pytest.mark.integration

SAMPLE = (
    "workbook/default",
    "mutate/misspelt/gradient_acumulation_steps=8",
    "batch/dp1-total-micro-not-divisible",
    "mutate/pipeline.pipe_partitioned='true'",
    "mutate/wall_clock_breakdown=true",
    "mutate/optimizer.params.momentum=0.9",
    "mutate/pipeline.use_reentrant='false'",
    "mutate/curriculum-block",
    "batch/dp2-total-steps-not-divisible",
    "mutate/dp2/zero_optimization.stage='1'",
)
#: facts that depend on the machine's arithmetic, compared loosely
LOOSE = ("loss",)


def test_deepspeed_still_does_what_the_recording_says():
    from utils.jobs.configlint import lint_config

    recorded = {c["id"]: c for c in json.loads(OUTCOMES.read_text(encoding="utf-8"))["cases"]}
    cases = [c for c in corpus() if c.id in SAMPLE]
    assert len(cases) == len(SAMPLE)
    now = record(cases)
    for case in cases:
        before, after = recorded[case.id]["outcome"], now[case.id]
        assert after["phase"] == before["phase"], (case.id, before, after)
        if after["phase"] != "done":
            assert (after["error"]["type"], after["error"]["where"]) == (before["error"]["type"],
                                                                        before["error"]["where"]), case.id
        else:
            for fact, value in before["facts"].items():
                if fact in LOOSE:
                    assert after["facts"][fact] == pytest.approx(value, rel=1e-4), (case.id, fact)
                else:
                    assert after["facts"][fact] == value, (case.id, fact, value, after["facts"][fact])
        verdict, why = deepspeed_verdict({**case.as_dict(), "outcome": after})
        findings = lint_config(case.config, num_stages=case.num_stages, data_parallel=case.data_parallel,
                               device="cpu")
        assert linter_verdict(findings) == verdict, (case.id, why, findings)
