#!/usr/bin/env bash
# The test suite under a sanitizer: `bash scripts/sanitize.sh address` (ASan
# + UBSan) or `bash scripts/sanitize.sh thread` (TSan). Builds the host path
# in build-<sanitizer> (no CUDA, no UCX: their libraries are not built with
# the sanitizer) and runs ctest there; any report fails the test it came from.
# The address build uses clang where it is installed, with libFuzzer's
# coverage (ATTN_FUZZ), so scripts/fuzz.sh runs its harnesses from the same
# build. SANITIZE_PERF=0 leaves the perf binaries (and their smoke tests)
# out; ATTN_TEST_CUDA_EMU=0 the emulated device stage.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}
case "$kind" in
  address) flags=address,undefined ;;
  thread) flags=thread ;;
  *) echo "usage: $0 address|thread" >&2; exit 2 ;;
esac
bash scripts/install_deps.sh
dir=${SANITIZE_BUILD_DIR:-build-$kind}
compilers=()
extra=()
if [ "$kind" = address ] && command -v clang++ >/dev/null; then
  compilers=(CC=clang CXX=clang++)
  extra=(-DATTN_FUZZ=ON)
fi
env "${compilers[@]}" cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DATTN_SANITIZE="$flags" -DATTN_ENABLE_MPI=OFF -DATTN_BUILD_PERF="${SANITIZE_PERF:-ON}" \
      "${extra[@]}"
cmake --build "$dir" -j "$(nproc)"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1
# Thread leaks: forked rank processes inherit the record of the parent's
# threads (which do not exist in the child) and exit with _exit. Forking
# with threads: the harness forks ranks from a test process that has them.
export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 report_thread_leaks=0 die_after_fork=0"
# python_*: the interpreter would need the sanitizer runtime preloaded.
skip='^python_'
if [ "$kind" = thread ]; then
  # CountsOverflowingSizeAreRejected and RootsWorkInAForkedChild fork from
  # a threaded parent; TSan's children then meet the parent's thread ids
  # ("dup thread"), which it does not support. EveryTypeOpCountAndForm is
  # one thread of arithmetic that runs for over 15 minutes under TSan.
  skip="$skip|^ArgumentValidation.CountsOverflowingSizeAreRejected$|^Bootstrap.RootsWorkInAForkedChild$|^CpuReduce.EveryTypeOpCountAndForm$"
fi
(cd "$dir" && ctest --output-on-failure --timeout 900 -j "${CTEST_JOBS:-2}" -E "$skip")

# The device paths on the emulated CUDA runtime, as scripts/test.sh runs
# them, but without the SIMT simulator's binaries: its GPU threads are
# fibers on stacks of their own, which the sanitizers are not told about.
if [ "${ATTN_TEST_CUDA_EMU:-1}" != 0 ] &&
   [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime_api.h" ]; then
  emu="$dir-emu"
  cmake -S . -B "$emu" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_SANITIZE="$flags" \
        -DATTN_CUDA_EMULATION=ON -DATTN_ENABLE_VERBS=OFF -DATTN_ENABLE_MPI=OFF
  # The device test binaries and the -G smoke tests' perf binaries, but not
  # the SIMT simulator's (so not CMake's attn_device_tests, which has them).
  cmake --build "$emu" -j "$(nproc)" --target test_cuda_emu test_device_comm test_device_staging \
        test_device_direct test_cuda_ipc test_device_fuzz test_device_check test_device_graph \
        test_device_kv_pool test_nccl_bridge all_gather_perf reduce_scatter_perf \
        all_reduce_perf alltoall_perf broadcast_perf reduce_perf sendrecv_perf ring_attn_perf \
        decode_attn_perf level_attn_perf kv_attn_perf
  (cd "$emu" && ctest -L device --output-on-failure --timeout 900 -j "${CTEST_JOBS:-2}" \
        -E '^simt\.|^Cuda(Simt|Attention|Merge|Pack|Reduce|KernelsArgs)\.')
fi
