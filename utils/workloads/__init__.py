"""What the jobs train: model presets as DeepSpeed `LayerSpec` lists with realistic, uneven
layer costs (`models`), their synthetic data, and a single-process reference (`reference`)
that a pipeline's losses must match; and the deliberately broken ``mistake:...`` presets of
chapter 25 (`mistakes`), registered on import."""

# Imported for its effect: it registers the mistake:... presets with `models.get_model`, in
# the notebook and in every rank (a lazy import inside get_model would be an import cycle).
from utils.workloads import mistakes

__all__ = ["mistakes"]
