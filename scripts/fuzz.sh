#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of bytes from outside (tests/fuzz):
#
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]     # default 30 s each, all harnesses
#
# Builds the harnesses as libFuzzer binaries with ASan + UBSan (clang) in
# ${FUZZ_BUILD_DIR:-build-address}, the same build scripts/sanitize.sh
# address makes, and runs each for SECONDS from its committed seed corpus
# (tests/fuzz/corpus/<name>, read only: new inputs go to a scratch corpus).
# A crash, leak, sanitizer report or timeout fails the run, and the input is
# copied to tests/fuzz/regressions/<name>/, which ctest replays from then on
# in every build. FUZZ_JOBS (default 1) runs that many harnesses at once.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS] [HARNESS...]" >&2; exit 2; }

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/install_deps.sh installs clang and libclang-rt-dev)" >&2
  exit 1
fi
dir=${FUZZ_BUILD_DIR:-build-address}
if [ ! -f "$dir/build.ninja" ] || ! grep -q '^ATTN_FUZZ:BOOL=ON' "$dir/CMakeCache.txt"; then
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATTN_SANITIZE=address,undefined -DATTN_FUZZ=ON -DATTN_BUILD_PERF=OFF \
    -DATTN_ENABLE_MPI=OFF >/dev/null
fi
cmake --build "$dir" -j "$(nproc)" --target attn_fuzzers

harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cc; do harnesses+=("$(basename "$f" .cc | sed 's/^fuzz_//')"); done
fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_one() {
  local name=$1 bin="$dir/tests/fuzz/fuzz_$1"
  local seeds="tests/fuzz/corpus/$name" regress="tests/fuzz/regressions/$name"
  [ -x "$bin" ] || { echo "fuzz: no harness $name ($bin)" >&2; return 1; }
  mkdir -p "$work/$name/corpus" "$work/$name/crash" "$regress"
  local log="$work/$name/log"
  # -timeout: one input running longer than 10 s is a hang; -rss_limit_mb
  # and -malloc_limit_mb: an input that makes the code allocate without
  # bound is a finding too.
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
       -print_final_stats=1 -artifact_prefix="$work/$name/crash/" \
       "$work/$name/corpus" "$seeds" "$regress" >"$log" 2>&1; then
    local execs
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $name: ${execs} executions in ${seconds} s, no crash"
  else
    echo "fuzz: $name: FAILED" >&2
    tail -40 "$log" >&2
    for f in "$work/$name/crash"/*; do
      [ -f "$f" ] || continue
      cp "$f" "$regress/"
      echo "fuzz: $name: input kept as $regress/$(basename "$f")" >&2
    done
    return 1
  fi
}

jobs=${FUZZ_JOBS:-1}
failed=0
pids=()
for name in "${harnesses[@]}"; do
  run_one "$name" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
