"""utils.ui.decisions: every rule of both dynamic policies, produced by the real planning
functions on hand-built costs, reads in Chinese with its own figures, and the tables show
"—" where a look had nothing and label where a migration cost came from."""

from __future__ import annotations

import re

import pytest

from utils.planning.microbatching import (MICRO_BATCH_OUTCOMES, MicroBatchDecision, MicroBatchPolicy,
                                          choose_micro_batches)
from utils.planning.rebalance import OUTCOMES, Decision, LayerCosts, Rebalance, decide
from utils.ui.decisions import decision_rows, decision_table, outcome_text, reason_text

MS = 1e-3
EQUAL = ([1 * MS] * 8, [2 * MS] * 8)
SKEWED, EVEN = [0, 2, 8], [0, 4, 8]


def _look(boundaries, *, steps=3, remaining=100, migration=0.0, source="assumed", policy=None):
    obs = [LayerCosts(s, *EQUAL) for s in range(steps)]
    return decide(obs, step=steps, boundaries=boundaries, policy=policy or Rebalance(), schedule="1f1b",
                  num_micro_batches=4, step_seconds=[1.0] * steps, remaining_steps=remaining,
                  migration_seconds=migration, migration_source=source)


def rebalance_cases() -> dict[str, Decision]:
    return {"too-few-measurements": _look(SKEWED, steps=1),
            "already-balanced": _look(EVEN),
            "below-min-gain": _look(SKEWED, policy=Rebalance(min_gain=0.9)),
            "no-payback": _look(SKEWED, remaining=1, migration=100.0, source="estimated"),
            "move": _look(SKEWED, migration=0.2, source="measured")}


S, P = 16, 2


def _costs(m):
    n = S // m
    return ([1.0 + n] * P, [2.0 + 2 * n] * P)


def _choose(current, *, memory=S, min_gain=0.0, measured=1.0):
    return choose_micro_batches(step=4, samples=S, num_stages=P, schedule="1f1b", current=current,
                                observed={4: _costs(4), 8: _costs(8)}, measured_step_seconds=measured,
                                policy=MicroBatchPolicy(memory_samples=memory, min_gain=min_gain),
                                overhead_samples=1.0)


def micro_batch_cases() -> dict[str, MicroBatchDecision]:
    best = _choose(8).chosen
    other = 8 if best != 8 else 4
    return {"too-few-measurements": MicroBatchDecision.too_few_measurements(4, 8),
            "already-fastest": _choose(best),
            "below-min-gain": _choose(other, min_gain=0.99),
            "change": _choose(other),
            "change-forced": _choose(2, memory=8)}  # 2 keeps all 16 samples in flight


def test_every_rule_is_produced_and_named():
    assert [d.outcome for d in rebalance_cases().values()] == list(OUTCOMES)
    assert {d.outcome for d in micro_batch_cases().values()} == set(MICRO_BATCH_OUTCOMES)
    assert "no longer fits the memory budget" in micro_batch_cases()["change-forced"].reason


@pytest.mark.parametrize("case", [*rebalance_cases().items(), *micro_batch_cases().items()], ids=lambda c: c)
def test_every_reason_reads_in_chinese_with_its_figures(case):
    _, decision = case
    zh = reason_text(decision, "zh")
    assert zh != decision.reason, decision.reason  # a sentence the table knows
    # No English words left, only identifiers a Chinese reader finds in code (min_gain, ms, s).
    assert not set(re.findall(r"[A-Za-z_]+", zh)) - {"min_gain", "ms", "s"}, zh
    # Every figure of the English reason is in the Chinese one.
    figures = re.findall(r"-?\d[\d.]*%?|\[[\d, ]*\]", decision.reason)
    assert figures and all(f in zh for f in figures), (figures, zh)
    assert reason_text(decision, "en") == decision.reason
    assert outcome_text(decision, "zh") != outcome_text(decision, "en")


def test_an_unknown_reason_stays_english():
    decision = MicroBatchDecision(4, 8, 8, {}, 0.0, "a sentence from a newer planning layer")
    assert reason_text(decision, "zh") == decision.reason


def test_rebalance_rows_show_dashes_and_label_the_migration_cost():
    cases = rebalance_cases()
    rows = decision_rows(list(cases.values()), "zh")
    by_outcome = dict(zip(cases, rows))
    few = by_outcome["too-few-measurements"]
    assert few["候选切分"] == few["预测步时 (ms)"] == few["每步节省 (ms)"] == "—"
    balanced = by_outcome["already-balanced"]
    assert balanced["候选切分"] == str(EVEN) and balanced["预测步时 (ms)"] == "—"
    assert by_outcome["move"]["迁移代价 (ms)"] == "200.0 (实测)"
    assert by_outcome["no-payback"]["迁移代价 (ms)"] == "100000.0 (估计)"
    assert by_outcome["below-min-gain"]["迁移代价 (ms)"].endswith("(假设)")
    assert [r["决定"] for r in rows] == ["测量不够", "已经均衡", "收益低于 min_gain", "不回本", "迁移"]
    assert by_outcome["move"]["预测步时 (ms)"] != "—"
    english = decision_rows([cases["move"]], "en")[0]
    assert english["migration cost (ms)"] == "200.0 (measured)" and english["decision"] == "move"


def test_micro_batch_rows_show_dashes():
    rows = decision_rows(list(micro_batch_cases().values()), "zh")
    assert rows[0]["实测步时 (ms)"] == rows[0]["预测最快的微批数"] == "—"
    assert all(r["实测步时 (ms)"] == "1000.0" for r in rows[1:])


def test_a_record_made_before_the_outcome_was_kept_still_reads():
    for outcome, decision in rebalance_cases().items():
        old = {k: v for k, v in decision.to_dict().items() if k not in ("outcome", "migration_source")}
        again = Decision.from_dict(old)
        assert again.outcome == outcome and again.migration_source is None
        assert decision_rows([again], "en")[0]["migration cost (ms)"] == f"{decision.migration_seconds * 1e3:.1f}"


def test_the_table_is_html_and_refuses_a_mixed_log():
    html = decision_table(list(rebalance_cases().values()), lang="zh")._repr_html_()
    assert html.startswith("<table>") and "不回本" in html and "—" in html
    assert "没有记录" in decision_table([], lang="zh").html
    with pytest.raises(TypeError, match="all be Decision"):
        decision_rows([*rebalance_cases().values(), *micro_batch_cases().values()])


def test_decide_refuses_an_unknown_migration_source():
    with pytest.raises(ValueError, match="migration_source must be one of"):
        _look(SKEWED, source="guessed")
