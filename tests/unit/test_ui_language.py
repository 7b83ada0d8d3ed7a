"""The language of figures, panels and metrics tables (`utils.ui.labels`, `utils.ui.tables`):
both tables of texts complete and consistent, every diagnosis translated, the setting scoped."""

from __future__ import annotations

import dataclasses

import pytest

import utils
from utils.analysis import report
from utils.analysis.report import SCALARS, diagnose
from utils.timeline import KINDS
from utils.ui import labels
from utils.ui.tables import (METRIC_MEANINGS, METRIC_NAMES, diagnosis_text, metrics_html,
                             metrics_table, translate_diagnosis)


def test_both_languages_have_the_same_texts_and_fields():
    en, zh = labels.TEXTS["en"], labels.TEXTS["zh"]
    assert set(en) == set(zh)
    for key in en:
        assert labels.fields_of(en[key]) == labels.fields_of(zh[key]), key
        labels.text(key, "zh", **{f: "x" for f in labels.fields_of(zh[key])})  # formats


def test_every_kind_and_metric_has_a_chinese_name():
    assert set(labels.KIND_NAMES) == set(KINDS)
    assert labels.kind_label("recv_grad", "zh") == "接收梯度 recv_grad"
    assert labels.kind_label("recv_grad", "en") == "recv_grad"
    assert set(SCALARS) | {"slowest_stage"} == set(METRIC_NAMES) == set(METRIC_MEANINGS)


def test_the_setting_is_global_scoped_or_per_call(monkeypatch):
    assert labels.get_language() == "en"
    with labels.use_language("zh"):
        assert labels.text("btn.run") == "运行"
        assert labels.text("btn.run", "en") == "Run"  # an explicit language wins
    assert labels.text("btn.run") == "Run"
    try:
        labels.set_language("zh")
        assert labels.get_language() == "zh" and labels.resolve(None) == "zh"
    finally:
        labels.set_language("en")
    with pytest.raises(ValueError, match="language must be one of"):
        labels.set_language("fr")
    with pytest.raises(ValueError, match="language must be one of"):
        labels.text("btn.run", "de")
    monkeypatch.setenv("WORKBOOK_LANG", "zh")
    assert labels._from_env() == "zh"
    monkeypatch.setenv("WORKBOOK_LANG", "klingon")
    assert labels._from_env() == "en"


@pytest.mark.parametrize("inputs", [
    dict(bubble=0.43, imbalance=1.91, slowest=3, comm_share=0.2, straggler=None),
    dict(bubble=0.31, imbalance=1.0, slowest=0, comm_share=0.0, straggler=(1, 3, 1.6)),
    dict(bubble=0.28, imbalance=1.02, slowest=1, comm_share=0.15, straggler=None),
    dict(bubble=0.031, imbalance=1.02, slowest=1, comm_share=0.01, straggler=None),
    dict(bubble=0.27, imbalance=1.02, slowest=1, comm_share=0.01, straggler=None),
])
def test_every_diagnosis_is_translated_with_its_numbers(inputs):
    english = diagnose(**inputs)
    chinese = translate_diagnosis(english, "zh")
    assert chinese != english and any("\u4e00" <= c <= "\u9fff" for c in chinese)
    for word in ("bottleneck", "straggler", "overlapped", "filled", "balanced", "bubble", "stage "):
        assert word not in chinese, (word, chinese)
    numbers = [w for w in english.replace("(", " ").replace(")", " ").replace(",", " ").replace(";", " ")
               .replace(":", " ").split() if any(ch.isdigit() for ch in w)]
    for n in numbers:
        assert n.rstrip("×") in chinese, (n, chinese)
    assert translate_diagnosis(english, "en") == english


def test_an_unknown_diagnosis_stays_english():
    assert translate_diagnosis("something new happened", "zh") == "something new happened"


def test_metrics_table_in_both_languages():
    sim = utils.simulate(utils.build_schedule("1f1b", 4, 8), forward=1e-3, backward=2e-3)
    m = sim.metrics()
    en = metrics_html(m, "en")
    assert "bubble_ratio" in en and "27.3%" in en and "diagnosis:" in en and m.diagnosis in en
    zh = metrics_table(m, lang="zh")._repr_html_()
    for word in ("气泡率 bubble_ratio", "27.3%", "指标", "含义", "阶段", "计算 compute (ms)", "利用率", "诊断：",
                 diagnosis_text(m, "zh"), "模拟流水线，step 0"):
        assert word in zh, word
    assert "share of stage time" not in zh  # meanings translated too
    # a summary over steps says it is a median and which step it left out
    shift = max(e.end for e in sim.events) + 1e-3
    later = tuple(dataclasses.replace(e, step=1, start=e.start + shift, end=e.end + shift) for e in sim.events)
    two = utils.Timeline(events=sim.events + later, num_stages=4, num_micro_batches=8, source="simulated")
    summary_zh = metrics_html(two.metrics(), "zh")
    assert "中位数" in summary_zh and "去掉了带一次性开销的 step 0" in summary_zh
    assert "median over 1 step(s) [1], step 0 left out" in metrics_html(two.metrics(), "en")


def test_the_english_report_and_ours_show_the_same_rows():
    sim = utils.simulate(utils.build_schedule("gpipe", 2, 4), forward=1e-3, backward=1e-3)
    m = sim.metrics()
    ours = metrics_html(m, "en")
    for row in m.table():
        assert row["value"] in ours and row["metric"] in ours
    assert report.IMBALANCE_THRESHOLD > 1  # the diagnosis thresholds stay analysis' own
