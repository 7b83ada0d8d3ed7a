"""What a chapter prints before it teaches anything: not DeepSpeed's import-time notice
("Setting accelerator to CPU ...", issue 42), which its package import prints on a machine
without a GPU. Every chapter that imports DeepSpeed in the notebook calls
`utils.system.dslog.quiet_accelerator_notice` first; the ranks still log the notice."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
IMPORT = re.compile(r"^(?:import deepspeed|from deepspeed)", re.M)


def _first_deepspeed_cell(path: Path) -> str | None:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and IMPORT.search(source):
            return source
    return None


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_notice_is_quieted_before_deepspeed_is_imported(path):
    source = _first_deepspeed_cell(path)
    if source is None:
        return  # this chapter never imports DeepSpeed in the notebook process
    assert "quiet_accelerator_notice()" in source[:IMPORT.search(source).start()], \
        f"{path.name}: call quiet_accelerator_notice() before the first import of deepspeed"


def test_quieted_the_import_prints_nothing():
    """The filter really drops the line: DeepSpeed imported in a fresh interpreter."""
    quiet = subprocess.run([sys.executable, "-c", "from utils.system.dslog import quiet_accelerator_notice; "
                            "quiet_accelerator_notice(); import deepspeed"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    loud = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert quiet.returncode == loud.returncode == 0, quiet.stderr[-2000:] + loud.stderr[-2000:]
    assert "Setting accelerator to CPU" in loud.stdout + loud.stderr  # what a chapter printed before
    assert "Setting accelerator to CPU" not in quiet.stdout + quiet.stderr
