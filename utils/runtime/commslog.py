"""DeepSpeed's own communication log (``comms_logger``), saved by each rank with its result.

A ``"comms_logger"`` section in the DeepSpeed config makes ``@timed_op`` time every
``deepspeed.comm`` operation, the pipeline's point-to-point sends and receives included
(``pipe/p2p.py`` sends through ``deepspeed.comm``), into ``deepspeed.comm.comms_logger``. A
training script prints it with ``deepspeed.comm.log_summary()``; a workbook rank saves the raw
record with its result instead (`raw_record`), and `Run.comm_ops` reads it back with
`utils.analysis.comms.comm_ops`, which also says why the times need a reader of their own.
"""

from __future__ import annotations


def raw_record() -> dict[str, dict[str, dict]] | None:
    """This process's comms-logger record, JSON-ready: op name -> message size (as text) ->
    ``{"count": n, "cumulative_ms": [...]}`` as DeepSpeed keeps it. None when the logger is off."""
    from deepspeed.comm.comm import comms_logger

    if not comms_logger.enabled:
        return None
    return {name: {str(size): {"count": count, "cumulative_ms": list(latencies)}
                   for size, (count, latencies, *_bandwidths) in by_size.items()}
            for name, by_size in comms_logger.get_raw_data().items()}
