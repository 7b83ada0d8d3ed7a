"""Per-layer profiling: `profile.profile_layers` (what to measure, cached), `measure` (the
timing itself, in one process or several at once), `result.LayerProfile` (the costs)."""
