"""Code that runs inside a job's processes: the rank program (`rank`), the instruction
tracer (`tracing`), schedules lowered onto DeepSpeed's engine (`lowering`), injected
faults (`faults`), and the agent that starts a CPU job's ranks from a warm fork server
(`warm_agent`). Only these modules import DeepSpeed.

From `utils.jobs` the runtime imports the spec and the run-directory contract only."""
