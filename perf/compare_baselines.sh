#!/bin/bash
# compare_baselines.sh: attncomm vs Open MPI vs Gloo, side by side.
#
# For all_gather, reduce_scatter and alltoall (float, sum; also all_reduce,
# broadcast and reduce through COLLS), NRANKS ranks as
# local processes and sizes MINB..MAXB, runs REPS times each:
#   attn-shm  our *_perf --procs N with ATTN_TRANSPORT=shm
#   attn-shm-R  the same with buffers from attnMemAlloc (--mem shareable): peers map
#             them instead of reading with CMA
#   attn-tcp  our *_perf --procs N with ATTN_TRANSPORT=tcp
#   mpi-shm   mpi_coll_bench, Open MPI ob1 + vader (shared memory)
#   mpi-tcp   mpi_coll_bench, --mca pml ob1 --mca btl tcp,self
#   gloo-tcp  gloo_coll_bench --procs N, Gloo TCP transport on 127.0.0.1
#   (not run by default: attn-threads, our *_perf -t N, default transport;
#    attn-shm-4k, attn-shm with ATTN_SHM_HUGEPAGES=0: CMA from 4 KiB pages)
# Every program uses the same sizes, timing (--timing median: median over
# iterations of the max over ranks) and columns; the table holds the median
# busbw over reps.
# Repetitions are the outer loop so background load hits all configs alike.
#
# Usage: compare_baselines.sh [OUT.md]
# Env:   BUILD_DIR (default: ../build-perf or ../build next to this script)
#        REPS=3 NRANKS=4 MINB=1M MAXB=64M ITERS=20 WARMUP=5 CHECK=1
#        CONFIGS="attn-shm attn-shm-R attn-tcp mpi-shm mpi-tcp gloo-tcp"
#        COLLS="all_gather reduce_scatter alltoall"
#        RESULTS=DIR (keep the JSON/logs there; default a temp dir)
#        RUN_TIMEOUT=900 (seconds per run)
#        METRIC=busbw|time (the table's figure; time in us suits small sizes)
#        PLOT=FILE.png (busbw of every configuration side by side, one panel
#        per collective; default RESULTS/compare_baselines.png; needs matplotlib)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT_MD="${1:-}"
REPS="${REPS:-3}" NRANKS="${NRANKS:-4}" MINB="${MINB:-1M}" MAXB="${MAXB:-64M}"
ITERS="${ITERS:-20}" WARMUP="${WARMUP:-5}" CHECK="${CHECK:-1}"
CONFIGS="${CONFIGS:-attn-shm attn-shm-R attn-tcp mpi-shm mpi-tcp gloo-tcp}"
COLLS="${COLLS:-all_gather reduce_scatter alltoall}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"
METRIC="${METRIC:-busbw}"

if [[ -z ${BUILD_DIR:-} ]]; then
  for d in "$HERE/../build-perf" "$HERE/../build"; do
    [[ -x $d/perf/all_gather_perf ]] && { BUILD_DIR="$d"; break; }
  done
fi
B="${BUILD_DIR:?set BUILD_DIR to a build with perf/all_gather_perf}"
RESULTS="${RESULTS:-$(mktemp -d /tmp/attn_compare.XXXXXX)}"
mkdir -p "$RESULTS"

TIMEFORMAT='%R %U %S'  # wall user sys, written to <run>.time
COMMON=(-b "$MINB" -e "$MAXB" -f 2 -n "$ITERS" -w "$WARMUP" -c "$CHECK" -d float -o sum --timing median)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NRANKS")

# Prints the command line for one configuration and collective; empty if
# that program was not built (e.g. no MPI or Gloo found at configure time).
command_for() {
  local cfg=$1 coll=$2 json=$3 bin
  case $cfg in
    attn-shm|attn-tcp)
      bin="$B/perf/${coll}_perf"
      [[ -x $bin ]] || return 0
      echo env "ATTN_TRANSPORT=${cfg#attn-}" "$bin" --procs "$NRANKS" --inplace 0 "${COMMON[@]}" -J "$json" ;;
    attn-shm-4k)
      bin="$B/perf/${coll}_perf"
      [[ -x $bin ]] || return 0
      echo env ATTN_TRANSPORT=shm ATTN_SHM_HUGEPAGES=0 "$bin" --procs "$NRANKS" --inplace 0 "${COMMON[@]}" -J "$json" ;;
    attn-shm-R)
      bin="$B/perf/${coll}_perf"
      [[ -x $bin ]] || return 0
      echo env ATTN_TRANSPORT=shm "$bin" --procs "$NRANKS" --inplace 0 --mem shareable "${COMMON[@]}" -J "$json" ;;
    attn-threads)  # optional: ranks as threads, the library's default transport
      bin="$B/perf/${coll}_perf"
      [[ -x $bin ]] || return 0
      echo "$bin" -t "$NRANKS" --inplace 0 "${COMMON[@]}" -J "$json" ;;
    mpi-shm|mpi-tcp)
      bin="$B/perf/baselines/mpi_coll_bench"
      [[ -x $bin ]] && command -v mpirun >/dev/null || return 0
      if [[ $cfg == mpi-shm ]]; then
        echo "${MPIRUN[@]}" --mca pml ob1 --mca btl vader,self "$bin" --coll "$coll" "${COMMON[@]}" \
             --transport ob1+vader -J "$json"
      else
        echo "${MPIRUN[@]}" --mca pml ob1 --mca btl tcp,self "$bin" --coll "$coll" "${COMMON[@]}" \
             --transport ob1+tcp -J "$json"
      fi ;;
    gloo-tcp)
      bin="$B/perf/baselines/gloo_coll_bench"
      [[ -x $bin ]] || return 0
      echo "$bin" --procs "$NRANKS" --coll "$coll" "${COMMON[@]}" -J "$json" ;;
    *) echo "unknown config $cfg" >&2; return 1 ;;
  esac
}

echo "# results in $RESULTS; $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
FAILS=()
for rep in $(seq 1 "$REPS"); do
  for coll in $COLLS; do
    for cfg in $CONFIGS; do
      base="$RESULTS/$cfg.$coll.r$rep"
      cmd=$(command_for "$cfg" "$coll" "$base.json") || exit 2
      if [[ -z $cmd ]]; then
        [[ $rep == 1 ]] && echo "skip $cfg $coll: program not built" >&2
        continue
      fi
      echo "== rep $rep $cfg $coll" >&2
      echo "$cmd" > "$base.cmd"
      # Word splitting is intended: paths here have no spaces.
      # shellcheck disable=SC2086
      # CPU time of all ranks (they are waited-for descendants) tells how
      # much a library spins, which matters when ranks share cores.
      { time timeout "$RUN_TIMEOUT" $cmd > "$base.log" 2>&1; } 2> "$base.time"
      rc=$?
      if ((rc != 0)); then
        FAILS+=("$cfg $coll rep $rep (rc $rc, see $base.log)")
        rm -f "$base.json"  # a partial file would skew the medians
        tail -3 "$base.log" >&2
      fi
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

what="busbw (GB/s)"
[[ $METRIC == time ]] && what="time (us; ratios: how many times faster)"
args=(--order "${CONFIGS// /,}" --metric "$METRIC"
      --title "$what, $NRANKS ranks, median of $REPS runs (each: median over $ITERS iterations of max over ranks)"
      --ratio "attn-shm:mpi-shm" --ratio "attn-shm-4k:mpi-shm" --ratio "attn-shm-R:mpi-shm" --ratio "attn-tcp:mpi-tcp|gloo-tcp")
[[ -n $OUT_MD ]] && args+=(--out "$OUT_MD")
python3 "$HERE/summarize.py" "${args[@]}" "$RESULTS"
# One picture of every configuration side by side; no matplotlib is no failure.
PLOT="${PLOT:-$RESULTS/compare_baselines.png}"
python3 "$HERE/plot_perf.py" --label-from-file --title "$NRANKS ranks, median of $REPS runs" \
  "$RESULTS"/*.json -o "$PLOT" >/dev/null && echo "# plot: $PLOT" >&2
if ((${#FAILS[@]})); then
  printf 'FAILED: %s\n' "${FAILS[@]}" >&2
  [[ -n $OUT_MD ]] && printf '\nFailed runs: %s\n' "${FAILS[*]}" >> "$OUT_MD"
  exit 1
fi
