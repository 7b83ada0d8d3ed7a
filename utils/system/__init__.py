"""Base utilities with no knowledge of pipelines: atomic JSON files, process trees, the
project's location and the CPU set-up every rank and the profiler share.

Nothing here imports another part of `utils`, so every layer (and the grader, which must
not import torch) may use it.
"""
