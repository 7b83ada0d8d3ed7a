"""The standalone page of a run (`utils.ui.report`, what ``make demo`` writes): settings,
metrics, per-stage time and the timeline of every step, in English or Chinese."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import utils
from utils.jobs.spec import JobSpec
from utils.ui import demo
from utils.ui.report import run_page, run_settings, write_run_page


def three_steps():
    sim = utils.simulate(utils.build_schedule("1f1b", 2, 4), forward=2e-3, backward=4e-3)
    shift = max(e.end for e in sim.events) + 1e-3
    events = [dataclasses.replace(e, step=s, start=e.start + s * shift, end=e.end + s * shift)
              for s in range(3) for e in sim.events]
    return utils.Timeline(events=tuple(events), num_stages=2, num_micro_batches=4, source="measured",
                          label="demo")


def fake_run(tmp_path: Path):
    spec = JobSpec(num_stages=2, micro_batches=4, micro_batch_size=3, steps=3, schedule="gpipe",
                   name="demo")
    return SimpleNamespace(name="demo-1234", spec=spec, timeline=three_steps(), losses=[5.5, 5.1, 4.9],
                           parts=[0, 3, 8], device="cpu", state="succeeded", path=tmp_path,
                           started=100.0, finished=112.5)


def test_page_shows_settings_metrics_and_every_step(tmp_path):
    run = fake_run(tmp_path)
    settings = {r["setting"]: r["value"] for r in run_settings(run)}
    assert settings["global batch"] == "12 = 3 × 4 × 1" and settings["schedule"] == "gpipe"
    assert settings["partition"] == "parameters → boundaries [0, 3, 8]"
    assert settings["loss"] == "5.5000 → 4.9000" and settings["wall time"] == "12.5 s"
    page = run_page(run)
    for word in ("Run settings", "Metrics", "bubble_ratio", "diagnosis:", "Per-stage time", "Every step",
                 "step 0 (warm-up", "step 1", "step 2", "median over 2 step(s) [1, 2]"):
        assert word in page, word
    assert page.count("Plotly.newPlot") == 1 + 3  # breakdown + one timeline per step
    assert page.count("* plotly.js v") == 1          # the library embedded once: opens offline


def test_page_in_chinese(tmp_path):
    path = write_run_page(fake_run(tmp_path), tmp_path / "page.html", lang="zh")
    page = path.read_text(encoding="utf-8")
    for word in ("运行设置", "指标", "气泡率 bubble_ratio", "诊断：", "各阶段时间", "每一步", "预热", "调度", "计算 compute (ms)"):
        assert word in page, word
    assert "Run settings" not in page and "<html lang='zh'>" in page


def test_demo_writes_the_page_and_a_trace(tmp_path, monkeypatch, capsys):
    run = fake_run(tmp_path)
    seen = {}

    def fake_run_job(spec):
        seen["spec"] = spec
        return run
    monkeypatch.setattr(demo, "run_job", fake_run_job)
    demo.main(["--out", str(tmp_path / "out"), "--stages", "2", "--steps", "3", "--lang", "zh"])
    assert seen["spec"].num_stages == 2 and seen["spec"].steps == 3
    page = (tmp_path / "out" / "timeline.html").read_text(encoding="utf-8")
    assert "运行设置" in page and page.count("step ") >= 3
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert trace["traceEvents"]
    assert "page (settings, metrics, every step)" in capsys.readouterr().out
