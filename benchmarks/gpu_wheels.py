"""The wheels a GPU node without a package registry needs, gathered into one folder.

    python benchmarks/gpu_wheels.py [--python 3.12] [--dest .whl]        (make gpu-wheels)

The lent GPU machine's image (Python 3.12, torch 2.11 with CUDA 13) already holds torch and
DeepSpeed's other needs (numpy, psutil, msgpack, ninja, py-cpuinfo, packaging, tqdm, einops),
but not DeepSpeed, hjson or pydantic, and it reaches no registry. This runs where PyPI is
reachable and gathers:

* binary wheels of `CARRIED` for the target Python on manylinux x86_64, at the versions
  installed here (the ones the tests ran with; one version of each, since two would stop an
  install);
* DeepSpeed built here as a pure-Python wheel (``DS_BUILD_OPS=0``: no op compiled ahead; a
  CUDA job of this workbook needs none, which tests/integration/test_gpu_kit.py asserts).

On the node, ``bash benchmarks/gpu_node.sh`` installs the folder with ``--no-index --no-deps``
into a private directory put first on PYTHONPATH, so the image's torch is never touched.
"""

import argparse
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CARRIED = ("hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
"""What DeepSpeed needs beyond the image: hjson and pydantic, with pydantic's own needs
(typing-extensions too: pydantic-core wants a newer one than an image may hold)."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
"""Linux x86_64 tags pip may take: it matches each manylinux_2_N tag exactly."""

LIMIT_BYTES = 64 * 2**20
"""The device tool carries at most 64 MiB of working tree per call."""


def normalized(name: str) -> str:
    return name.lower().replace("_", "-")


def wheel_tags(path: Path) -> tuple[str, str, str, str]:
    """(distribution, python tag, abi tag, platform tag) from a wheel's file name."""
    parts = path.name[:-len(".whl")].split("-")
    return normalized(parts[0]), parts[-3], parts[-2], parts[-1]


def gather(dest: Path, python: str) -> list[Path]:
    """Fill `dest` with the wheels for Python `python` (``"3.12"``); returns their paths.
    Raises RuntimeError, saying which, when a wheel cannot be had or is not what the
    target can install."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: a stale wheel would clash
        old.unlink()
    pins = [f"{name}=={version(name)}" for name in CARRIED]
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
         *platform_args, "-d", str(dest), *pins)
    # DeepSpeed has no wheel on PyPI: build one from its sdist. No build isolation: its
    # setup.py imports torch, which must be the one here, not a second download.
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), f"deepspeed=={version('deepspeed')}",
         env={**os.environ, "DS_BUILD_OPS": "0"})
    wheels = sorted(dest.glob("*.whl"))
    check(wheels, python)
    return wheels


def check(wheels: list[Path], python: str) -> None:
    """One wheel per distribution, every one of `CARRIED` and DeepSpeed present, compiled
    wheels tagged for CPython `python` on manylinux x86_64, the whole under `LIMIT_BYTES`."""
    names = [wheel_tags(w)[0] for w in wheels]
    missing = sorted({normalized(n) for n in (*CARRIED, "deepspeed")} - set(names))
    twice = sorted({n for n in names if names.count(n) > 1})
    if missing or twice:
        raise RuntimeError(f"wheel folder: missing {missing}, more than one version of {twice}")
    cp = "cp" + python.replace(".", "")
    for wheel in wheels:
        _, py, abi, plat = wheel_tags(wheel)
        pure = (py.startswith("py3"), abi, plat) == (True, "none", "any")
        native = cp in py.split(".") and all(p.startswith("manylinux") and p.endswith("x86_64") for p in plat.split("."))
        if not (pure or native):
            raise RuntimeError(f"{wheel.name} does not install on CPython {python} / manylinux x86_64")
    size = sum(w.stat().st_size for w in wheels)
    if size > LIMIT_BYTES:
        raise RuntimeError(f"the wheels take {size / 2**20:.1f} MiB, more than the {LIMIT_BYTES // 2**20} MiB carried")


def _pip(*args: str, env: dict | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the GPU node's Python version (the device image: 3.12)")
    parser.add_argument("--dest", default=str(ROOT / ".whl"), help="the folder the device carries")
    args = parser.parse_args()
    wheels = gather(Path(args.dest), args.python)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels in {args.dest}, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
