#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs a 4-rank ring
# attention (ranks as threads, the embedded default) over a grid of KV-cache
# miss rates, every mode checked against exact double-precision attention.
# Extra arguments go to ring_attn_perf (e.g. --procs 4 for processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
exec "${BUILD_DIR:-build}/perf/ring_attn_perf" -t 4 -c 1 "$@"
