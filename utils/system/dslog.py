"""Keep DeepSpeed's import-time notice out of the notebook process's output.

The notebook process imports DeepSpeed only to read its classes (the config parser the
linter asks, the pipeline topology, ``LayerSpec``). DeepSpeed's package import then prints
"Setting accelerator to CPU ..." to stdout on a machine without a GPU, which lands in the
middle of a notebook's output or of a script whose stdout another program reads. The ranks,
which do train on that accelerator, still print it into their logs.
"""

from __future__ import annotations

import logging

_NOTICE = "Setting accelerator to CPU"


class _DropAcceleratorNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _NOTICE not in record.getMessage()


def quiet_accelerator_notice() -> None:
    """Drop that one notice in this process, before DeepSpeed is imported. DeepSpeed's logger
    ("DeepSpeed") is configured at its import, but filters added to it before stay."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DropAcceleratorNotice) for f in logger.filters):
        logger.addFilter(_DropAcceleratorNotice())
