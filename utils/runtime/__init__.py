"""Code that runs inside a job's rank processes: the rank program (`rank`), the instruction
tracer (`tracing`), schedules lowered onto DeepSpeed's engine (`lowering`) and injected
faults (`faults`). Only these modules import DeepSpeed.

From `utils.jobs` the runtime imports the spec and the run-directory contract only."""
