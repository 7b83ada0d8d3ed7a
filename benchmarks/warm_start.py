"""How long a short job takes when its ranks start through torchrun's command against the
warm agent (`utils.runtime.warm_agent`: torchrun's agent, ranks forked from a fork server
that imported torch and DeepSpeed once), alternated job by job so both see the same machine.

    python benchmarks/warm_start.py [--ranks 2 4] [--repeats 3]

Each job is a real one (`utils.run_job` on the CPU): 1 step of a 2-block GPT, so its time is
almost all start-up and shutdown. Prints each job's wall time, the medians and the ratio
warm / torchrun per world size. Measured on the 2-core CPU VM (2026-12-02, 3 repeats,
nothing else running):

    ranks  torchrun  warm   warm/torchrun
        2    3.8 s   2.2 s   0.60
        4    6.0 s   2.5 s   0.42
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.jobs.launch import start_job  # noqa: E402 - after the path is set
from utils.jobs.launchers import LocalTorchrun  # noqa: E402
from utils.jobs.spec import JobSpec  # noqa: E402

SHAPE = {"model": "gpt", "micro_batch_size": 2,
         "model_options": {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}}


def one_job(ranks: int, warm: bool, directory: Path) -> float:
    """Wall seconds from start to a finished record, for one job started one way."""
    spec = JobSpec(**SHAPE, num_stages=ranks, micro_batches=2, steps=1, device="cpu")
    began = time.perf_counter()
    run = start_job(spec, directory=directory, launcher=LocalTorchrun(warm=warm)).wait()
    seconds = time.perf_counter() - began
    assert run.state == "succeeded", run.path
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        one_job(2, True, Path(tmp))  # the first job may compile DeepSpeed's comm op: not timed
        rows = []
        for ranks in args.ranks:
            times = {True: [], False: []}
            for i in range(args.repeats):
                for warm in ((False, True) if i % 2 == 0 else (True, False)):
                    times[warm].append(one_job(ranks, warm, Path(tmp)))
                    print(f"{ranks} ranks, {'warm agent' if warm else 'torchrun  '}: {times[warm][-1]:.2f} s",
                          flush=True)
            cold, warm = statistics.median(times[False]), statistics.median(times[True])
            rows.append((ranks, cold, warm))
    print("\nranks  torchrun  warm   warm/torchrun")
    for ranks, cold, warm in rows:
        print(f"{ranks:5d}  {cold:6.1f} s {warm:5.1f} s   {warm / cold:.2f}")


if __name__ == "__main__":
    main()
