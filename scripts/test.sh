#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole
# GoogleTest suite through ctest (threads, processes, emulated hosts when
# root; GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j "${CTEST_JOBS:-2}"
