"""Where the project lives on disk (the folder that holds the `utils` package)."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the working directory of every launched job and kernel, and the
entry that makes ``import utils`` work in their processes."""
