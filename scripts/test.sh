#!/usr/bin/env bash
# The test command: installs dependencies, configures once with CMake's
# default generator, builds (Ninja), and runs the whole
# GoogleTest suite through ctest (threads, processes, emulated hosts when
# root; GPU tests skip without a GPU). Then, where the CUDA headers are, the
# device tests again on the emulated CUDA runtime (tests/cuda_emu), so the
# device code runs even without a GPU; ATTN_TEST_CUDA_EMU=0 leaves that out.
# Last, the host suite under ASan + UBSan (built with clang) and every fuzz
# harness for ATTN_FUZZ_SECONDS (30) from its seed corpus; ATTN_TEST_SANITIZE=0
# leaves both out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# A plain `cmake -S . -B dir` (the default generator, Unix Makefiles) must
# configure as well as scripts/build.sh's Ninja does (it once did not).
bash scripts/check_generators.sh --default
bash scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 600 -j "${CTEST_JOBS:-2}")

if [ "${ATTN_TEST_CUDA_EMU:-1}" != 0 ] &&
   [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime_api.h" ]; then
  EMU_DIR=${EMU_BUILD_DIR:-build-emu}
  if [ ! -f "$EMU_DIR/build.ninja" ]; then
    cmake -S . -B "$EMU_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA_EMULATION=ON \
          -DATTN_ENABLE_VERBS=OFF -DATTN_ENABLE_MPI=OFF
  fi
  # Only what the "device" tests run (CMake's attn_device_tests: the device
  # test binaries, the SIMT simulator's among them, and the perf binaries of
  # the -G smoke tests).
  cmake --build "$EMU_DIR" -j "$(nproc)" --target attn_device_tests
  (cd "$EMU_DIR" && ctest -L device --output-on-failure --timeout 600 -j "${CTEST_JOBS:-2}")
fi

if [ "${ATTN_TEST_SANITIZE:-1}" != 0 ]; then
  # Without the perf binaries and the emulated device stage: the host suite
  # is what peers' bytes reach, and the stage must stay short on 2 cores.
  SANITIZE_PERF=0 ATTN_TEST_CUDA_EMU=0 bash scripts/sanitize.sh address
  bash scripts/fuzz.sh "${ATTN_FUZZ_SECONDS:-30}"
fi
