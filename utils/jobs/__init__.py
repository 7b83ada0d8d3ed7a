"""Jobs, seen from the notebook's process: the spec (`spec`), what it means on this machine
(`plan`), the DeepSpeed config (`config`), the run-directory contract (`rundir`), starting
and watching ranks (`launchers`, `launch`), finished runs (`runs`) and confirming a search
with real runs (`confirm`)."""
