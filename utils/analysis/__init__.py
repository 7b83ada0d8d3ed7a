"""Analysis of pipeline timelines: what a measured or simulated run says.

* `metrics`: `Metrics` of one step and `compute_metrics` (bubble ratio, utilisation,
  imbalance, throughput, diagnosis).
* `summary`: `MetricsSummary` and `Spread`, the median and spread over several steps.
* `steps`: `steady_steps`, the one rule that leaves warm-up step 0 out.
* `intervals`: interval arithmetic and the transfer part of send/recv calls.
* `report`: meanings, formats and the diagnosis line that `Metrics` and `MetricsSummary`
  share; `tables`: the one list-of-dict table renderer (text and HTML).
* `theory`: closed-form bubble and makespan formulas.

The subpackage builds on `utils.timeline` only: it never imports `utils.jobs`,
`utils.runtime` or `utils.ui`. Import from the modules; this file re-exports nothing and
imports nothing.
"""
