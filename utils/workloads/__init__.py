"""What the jobs train: the menu of model presets, checked without torch (`presets`), the
presets as DeepSpeed `LayerSpec` lists with realistic, uneven layer costs (`models`, built
from `layers`), their synthetic data, and a single-process reference (`reference`) that a
pipeline's losses must match; and the deliberately broken ``mistake:...`` presets of chapter
25 (`mistakes`). Importing the package imports none of them (nor torch)."""
