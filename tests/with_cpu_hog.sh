#!/usr/bin/env bash
# Run a command while a busy-looping process takes one core for the whole run, then end it:
# the suite must pass on a slow, shared machine, not only on a quiet one (docs/suite-time.md).
#   bash tests/with_cpu_hog.sh make test          # or: make test-under-load
#   bash tests/with_cpu_hog.sh bash .ci/run       # the CI entry point under load
# HOG_CORE picks the core (default 0); the command's exit status is returned unchanged.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
core=${HOG_CORE:-0}
taskset -c "$core" sh -c 'while :; do :; done' &
hog=$!
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null' EXIT
echo "with_cpu_hog: busy loop (pid $hog) pinned to core $core while: $*" >&2
"$@"
