#!/usr/bin/env bash
# The GPU check on a GPU node, in one command, from the project root:
#
#     bash benchmarks/gpu_node.sh [OUT] [gpu_check.py options, e.g. --only job,clocks]
#
# 1. If .whl/ (or $GPU_WHEELS) holds wheels (`make gpu-wheels`, run where PyPI is reachable), installs them
#    offline (--no-index --no-deps) into a private folder put first on PYTHONPATH: the
#    node's own torch is never touched. A node with the project's environment needs no .whl.
# 2. Prints the versions it will run with.
# 3. Runs benchmarks/gpu_check.py under an outer time limit (GPU_CHECK_LIMIT seconds,
#    default 480; each job inside also has its own short timeout).
# 4. Packs gpu_check.json, the log and every run's record into OUT/gpu_check.tar.gz.
#
# From a session lent the workplace's GPU machine (the `device` tool; 15 minutes in all, at
# most 10 per command), after `make gpu-wheels` here:
#
#     run(command='bash benchmarks/gpu_node.sh "$OUT"', carry=[".whl"], timeout_s=560)
#
# The exit status is gpu_check's (124 when the outer limit stopped it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check-out}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

WHEELS=${GPU_WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  SITE=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || { echo "installing $WHEELS/ failed" >&2; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

"$PY" - <<'EOF' || exit 1
import platform
from importlib.metadata import version

import deepspeed
import torch

print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"GPUs visible: {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
print(", ".join(f"{name} {version(name)}" for name in ("deepspeed", "pydantic", "pydantic-core", "hjson")),
      f"(deepspeed from {deepspeed.__file__})")
EOF

timeout -k 15 "${GPU_CHECK_LIMIT:-480}" "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
packed=()
for item in gpu_check.json gpu_check.log runs; do
  [ -e "$OUT/$item" ] && packed+=("$item")
done
tar -czf "$OUT/gpu_check.tar.gz" -C "$OUT" "${packed[@]}"
echo "gpu_check exit status $status; records in $OUT/gpu_check.tar.gz"
exit "$status"
