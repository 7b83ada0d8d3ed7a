"""What the jobs train: model presets as DeepSpeed `LayerSpec` lists with realistic, uneven
layer costs (`models`), their synthetic data, and a single-process reference (`reference`)
that a pipeline's losses must match."""
