"""Planning without processes: schedules as data (`schedules`), the discrete-event simulator
(`simulator`, a model and never a measurement), stage boundaries from per-layer costs
(`partitioning`) and what-if prediction from a measured timeline (`whatif`).

Planning builds on `utils.timeline` and `utils.analysis` only: it never imports jobs,
runtime or ui, so everything here runs in a plain Python process."""
