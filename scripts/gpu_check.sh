#!/usr/bin/env bash
# The GPU checks in one go, for a machine with a CUDA GPU and no package
# registry (the H200 the project is sometimes lent): build for Hopper, run
# the GPU tests and the GPU benchmarks, write every log under $OUT (or
# ./gpu-check-out).
#
#   bash scripts/gpu_check.sh --prepare      # on a machine with apt: GoogleTest's
#                                            # packages and a UCX built with CUDA
#                                            # (scripts/build_ucx_cuda.sh) into
#                                            # .device/ (git-ignored)
#   bash scripts/gpu_check.sh [STAGE...]     # on the GPU machine, carrying .device/
#
# Stages, in order when none is named: build, test, ucx, perf. `build` links
# the carried UCX (.device/ucx-cuda) when there is one, else builds without
# UCX. `test` runs the GPU tests (names with cuda, device, nccl, python), `all`
# the whole suite; `ucx` what the carried UCX reports about CUDA (ucx_info)
# and the DeviceDirect tests (device buffers straight to UCX); `perf` the GPU
# benchmarks: kernels against copy bandwidth and torch SDPA, ring attention
# and decode on one shared GPU (overlap), collectives on device buffers.
# Builds into build-gpu/ (kept between stages).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEV=$ROOT/.device
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
# The carried UCX: every stage finds its libraries (and UCX its modules,
# next to libucs) through LD_LIBRARY_PATH; the CUDA runtime its cuda modules need too.
UCX_PREFIX=
ucx_env() {
  [ -z "$UCX_PREFIX" ] && [ -f "$DEV/ucx-cuda/.complete" ] || return 0
  UCX_PREFIX=$DEV/ucx-cuda
  export LD_LIBRARY_PATH=$UCX_PREFIX/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$UCX_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
}
ucx_env

prepare() {
  mkdir -p "$DEV"
  # GoogleTest, and OpenSSL's headers with its libcrypto (required since the
  # handshakes are HMACs): extracted on the GPU machine where it lacks them.
  (cd "$DEV" && apt-get download libgtest-dev libssl-dev libssl3 >/dev/null) ||
    { echo "apt-get download failed" >&2; exit 1; }
  # Optional: without it the GPU build goes without UCX.
  bash "$ROOT/scripts/build_ucx_cuda.sh" || echo "UCX with CUDA not built; the GPU build will have no UCX" >&2
  ls -l "$DEV"
  du -sh "$DEV"
}

# The carried UCX (pkg-config or, where there is none, UCX's CMake package).
ucx_flags() {
  if [ -n "$UCX_PREFIX" ]; then echo "-DATTN_ENABLE_UCX=ON -Ducx_DIR=$UCX_PREFIX/lib/cmake/ucx"
  else echo "-DATTN_ENABLE_UCX=OFF"; fi
}

# The carried packages, unpacked once into .device/root.
extract_debs() {
  [ -f "$DEV/root/.complete" ] && return
  mkdir -p "$DEV/root"
  for deb in "$DEV"/*.deb; do
    [ -f "$deb" ] || continue
    if command -v dpkg >/dev/null; then dpkg -x "$deb" "$DEV/root"
    else (cd "$DEV/root" && ar p "$deb" data.tar.xz | tar -xJ); fi
  done
  touch "$DEV/root/.complete"
}

# GoogleTest from the carried packages when the machine lacks it.
gtest_prefix() {
  if [ -f /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] ||
     [ -f /usr/lib/cmake/GTest/GTestConfig.cmake ]; then return; fi
  extract_debs
  echo "-DCMAKE_PREFIX_PATH=$DEV/root/usr"
}

# OpenSSL's headers from the carried libssl-dev when the machine lacks
# them (Debian keeps two of them under the multiarch directory: copied next
# to the others); the machine's own libcrypto.so.3 when it has one (OpenSSL
# 3 keeps its ABI), else the carried one.
SYS_CRYPTO=/usr/lib/x86_64-linux-gnu/libcrypto.so.3
openssl_flags() {
  [ -f /usr/include/openssl/hmac.h ] && return
  extract_debs
  cp -n "$DEV"/root/usr/include/x86_64-linux-gnu/openssl/*.h "$DEV/root/usr/include/openssl/" 2>/dev/null
  local lib=$SYS_CRYPTO
  [ -f "$lib" ] || lib=$DEV/root/usr/lib/x86_64-linux-gnu/libcrypto.so.3
  echo "-DOPENSSL_INCLUDE_DIR=$DEV/root/usr/include -DOPENSSL_CRYPTO_LIBRARY=$lib"
}
# Every stage's binaries find the carried libcrypto where the machine has
# none (called at start, and after the build has unpacked it).
crypto_env() {
  local carried=$DEV/root/usr/lib/x86_64-linux-gnu
  if [ ! -f "$SYS_CRYPTO" ] && [ -f "$carried/libcrypto.so.3" ] &&
     [[ ":${LD_LIBRARY_PATH:-}:" != *":$carried:"* ]]; then
    export LD_LIBRARY_PATH=$carried${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
}
crypto_env

# NCCL from the CUDA toolkit, else from the nvidia-nccl Python wheel.
nccl_flags() {
  [ -f /usr/local/cuda/include/nccl.h ] && return
  local d
  d=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) || return
  local lib
  lib=$(ls "$d"/lib/libnccl.so* 2>/dev/null | head -1)
  [ -f "$d/include/nccl.h" ] && [ -n "$lib" ] && echo "-DNCCL_INCLUDE_DIR=$d/include -DNCCL_LIBRARY=$lib"
}

stage_build() {
  nvidia-smi >"$OUT/build.log" 2>&1
  # shellcheck disable=SC2046
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA_ARCHS=90a-real \
        -DATTN_CUDA_PTXAS_VERBOSE=ON -DATTN_ENABLE_MPI=OFF \
        $(ucx_flags) $(gtest_prefix) $(openssl_flags) $(nccl_flags) >>"$OUT/build.log" 2>&1 &&
    ninja -C "$BUILD" -j"$JOBS" >>"$OUT/build.log" 2>&1
  local rc=$?
  crypto_env
  # ptxas: registers and spills of every kernel (the hot ones must not spill).
  grep -E "Compiling entry|Used [0-9]+ registers|spill" "$OUT/build.log" >"$OUT/ptxas.log" || true
  echo "build rc=$rc"
  return $rc
}

stage_test() {
  local which=${1:-gpu}
  local filter=(-R "cuda|Cuda|CUDA|device|Device|nccl|Nccl|NCCL|python")
  [ "$which" = all ] && filter=()
  (cd "$BUILD" && ctest "${filter[@]}" -j4 --output-on-failure --timeout 600) >"$OUT/tests-$which.log" 2>&1
  local rc=$?
  tail -25 "$OUT/tests-$which.log"
  return $rc
}

# Whether the carried UCX reports CUDA memory (ucx_info), then the tests that
# hand device buffers straight to it; they skip where it does not.
stage_ucx() {
  local log=$OUT/ucx.log
  if [ -z "$UCX_PREFIX" ]; then
    echo "ucx: no .device/ucx-cuda (scripts/build_ucx_cuda.sh via --prepare); skipped" | tee "$log"
    return 0
  fi
  { cat "$UCX_PREFIX/.complete"; "$UCX_PREFIX/bin/ucx_info" -v; } >"$log" 2>&1
  "$UCX_PREFIX/bin/ucx_info" -d >"$OUT/ucx_info-d.log" 2>&1
  echo "ucx_info -d, lines with cuda:" >>"$log"
  if ! grep -i cuda "$OUT/ucx_info-d.log" >>"$log"; then
    echo "(none: UCX reports no CUDA; its module loading, which names what failed:)" >>"$log"
    UCX_LOG_LEVEL=debug "$UCX_PREFIX/bin/ucx_info" -d 2>&1 | grep -iE "module|dlopen|cuda" | head -20 >>"$log"
  fi
  # The binary itself, not ctest: its output names each skip's reason.
  timeout 900 "$BUILD/tests/test_device_direct" --gtest_filter='DeviceDirect*' >"$OUT/tests-ucx.log" 2>&1
  local rc=$?
  cat "$log"
  grep -E "^\[ +(OK|SKIPPED|FAILED|PASSED) +\]" "$OUT/tests-ucx.log" | tail -20
  grep -A1 ": Skipped$" "$OUT/tests-ucx.log" | grep -v -e ": Skipped$" -e "^--$" | sort | uniq -c
  echo "DeviceDirect rc=$rc"
  return $rc
}

stage_perf() {
  local log=$OUT/perf.log
  : >"$log"
  run() { echo "\$ $*" >>"$log"; "$@" >>"$log" 2>&1; echo "# rc=$?" >>"$log"; }
  run "$BUILD/perf/cuda_kernel_perf" -n 20 -w 3
  # MLA-shaped heads (DeepSeek 192/128) on the tensor-core kernels, and the
  # same calls with V padded to 192: what the 192/128 instantiation saves.
  for dv in 128 192; do
    run "$BUILD/perf/cuda_kernel_perf" -n 20 -w 3 -m 64 -d 192 -v $dv -q 16 -k 16 -t 8192,16384 -T 32768 -b 1,8
  done
  run "$BUILD/perf/ring_attn_perf" --device 0 -t 2 -L 8192 --miss 1,0.05 -H 16 --kv-heads 16 --head-dim 192 --head-dim-v 128 -d bf16 -n 5 -w 2 -c 1
  run python3 perf/attn/sdpa_reference.py -n 20 -w 3
  for n in 2 4; do
    run "$BUILD/perf/ring_attn_perf" --device 0 -t $n -L 32768 --miss 1,0.25,0.05 -H 32 --kv-heads 8 --head-dim 128 -d bf16 -n 5 -w 2 -c 1
  done
  run "$BUILD/perf/ring_attn_perf" --device 0 --procs 2 -L 16384 --miss 1,0.05 -H 32 --kv-heads 8 --head-dim 128 -d bf16 -n 5 -w 2 -c 1
  run "$BUILD/perf/decode_attn_perf" --device 0 -t 4 -L 131072 --batches 1,8,32 -H 32 --kv-heads 8 --head-dim 128 -d bf16 -n 10 -w 2 -c 1
  # Head-parallel against the rings without GQA, and level attention
  # against pass-KV, on the device.
  run "$BUILD/perf/ring_attn_perf" --device 0 -t 4 -L 16384 --miss 1 --modes kv,q,heads -H 32 --kv-heads 32 --head-dim 128 -d bf16 -n 5 -w 2 -c 1
  run "$BUILD/perf/level_attn_perf" --device 0 -t 4 -L 16384 -k 1,1:0.5:0.25,0.5:0.25:0.125 -H 32 --kv-heads 8 --head-dim 128 -d bf16 -n 5 -w 2 -c 1
  # DistAttention decode over device pools: lending blocks to 3 peers.
  run "$BUILD/perf/kv_attn_perf" --device 0 -t 4 -L 131072 -H 32:8:128 -d bf16 --lend 0,0.25,0.5,0.75 -n 10 -w 2
  # The same request with its blocks scattered (every 4th): paged K/V, one
  # launch per request instead of one per block.
  run "$BUILD/perf/kv_attn_perf" --device 0 -t 4 -L 131072 -H 32:8:128 -d bf16 --lend 0,0.5 -n 10 -w 2 --requests 4
  for coll in all_gather reduce_scatter alltoall sendrecv; do
    run "$BUILD/perf/${coll}_perf" --device 0 -t 4 -b 1M -e 256M -f 4 -n 20 -w 5 -c 1
  done
  run "$BUILD/perf/all_gather_perf" --device 0 --procs 4 -b 1M -e 256M -f 4 -n 20 -w 5 -c 1
  # Small all-reduces launched eagerly and as CUDA graphs (-G 1: the 200
  # calls captured, replayed once), one after the other: what a captured
  # decode step pays per collective.
  for graph in 0 1 0 1; do
    run "$BUILD/perf/all_reduce_perf" --device 0 -t 2 -G $graph -b 8 -e 64K -f 8 -n 200 -w 20 -c 1
  done
  # The staging backend (cuda_ipc off) in one piece, then pipelined:
  # collectives, and send/recv (src/device/backends/staging/staged_p2p.h).
  for chunk in 0 4194304; do
    run env ATTN_TRANSPORT=shm,tcp ATTN_DEVICE_STAGE_CHUNK=$chunk \
      "$BUILD/perf/all_reduce_perf" --device 0 --procs 2 -b 4M -e 256M -f 4 -n 20 -w 5 -c 1
    run env ATTN_TRANSPORT=shm,tcp ATTN_DEVICE_STAGE_CHUNK=$chunk \
      "$BUILD/perf/sendrecv_perf" --device 0 --procs 2 -b 4M -e 256M -f 4 -n 20 -w 5 -c 1
  done
  grep -E "^\\$|rc=|# max error|Avg bus|TFLOP|GB/s|overlap| heads | level |pass-kv |[0-9]x$" "$log" | head -160
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test ucx perf)
status=0
for s in "${stages[@]}"; do
  case $s in
    --prepare) prepare; ucx_env ;;
    build) stage_build || status=1 ;;
    test) stage_test gpu || status=1 ;;
    all) stage_test all || status=1 ;;
    ucx) stage_ucx || status=1 ;;
    perf) stage_perf ;;
    *) echo "unknown stage $s (build, test, all, ucx, perf, --prepare)" >&2; exit 2 ;;
  esac
done
exit $status
