#!/bin/bash
# compare_ucx.sh: the UCX transport next to our own shm and tcp transports,
# and next to ucx_perftest (UCX's own point-to-point bandwidth: the physical
# limit for anything built on UCX on this machine).
#
# For all_gather, reduce_scatter and alltoall (float, sum), NRANKS ranks as
# local processes, sizes MINB..MAXB, REPS repetitions (the outer loop, so
# background load hits all configurations alike):
#   attn-shm  ATTN_TRANSPORT=shm
#   attn-tcp  ATTN_TRANSPORT=tcp
#   ucx-sm    ATTN_TRANSPORT=ucx UCX_TLS=sm,self   (UCX shared memory)
#   ucx-tcp   ATTN_TRANSPORT=ucx UCX_TLS=tcp       (UCX over TCP/loopback)
# The first table holds the median busbw over repetitions (summarize.py).
# The second is `ucx_perftest -t tag_bw` between two local processes at the
# same sizes with UCX_TLS=sm,self and =tcp (median over REPS runs).
#
# Usage: compare_ucx.sh [OUT.md]
# Env:   BUILD_DIR (default: ../build-ucx, ../build-perf or ../build)
#        REPS=3 NRANKS=4 MINB=1M MAXB=64M FACTOR=4 ITERS=20 WARMUP=5 CHECK=1
#        CONFIGS="attn-shm attn-tcp ucx-sm ucx-tcp"
#        COLLS="all_gather reduce_scatter alltoall"
#        PERFTEST=1 (0: skip ucx_perftest)  PERFTEST_ITERS=200
#        RESULTS=DIR (keep JSON/logs there; default a temp dir)
#        RUN_TIMEOUT=900 (seconds per run)
#        PLOT=FILE.png (busbw of every configuration side by side; default
#        RESULTS/compare_ucx.png; needs matplotlib)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT_MD="${1:-}"
REPS="${REPS:-3}" NRANKS="${NRANKS:-4}" MINB="${MINB:-1M}" MAXB="${MAXB:-64M}"
FACTOR="${FACTOR:-4}" ITERS="${ITERS:-20}" WARMUP="${WARMUP:-5}" CHECK="${CHECK:-1}"
CONFIGS="${CONFIGS:-attn-shm attn-tcp ucx-sm ucx-tcp}"
COLLS="${COLLS:-all_gather reduce_scatter alltoall}"
PERFTEST="${PERFTEST:-1}" PERFTEST_ITERS="${PERFTEST_ITERS:-200}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"

if [[ -z ${BUILD_DIR:-} ]]; then
  for d in "$HERE/../build-ucx" "$HERE/../build-perf" "$HERE/../build"; do
    [[ -x $d/perf/all_gather_perf ]] && { BUILD_DIR="$d"; break; }
  done
fi
B="${BUILD_DIR:?set BUILD_DIR to a build with perf/all_gather_perf}"
RESULTS="${RESULTS:-$(mktemp -d /tmp/attn_ucx.XXXXXX)}"
mkdir -p "$RESULTS"
COMMON=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c "$CHECK" -d float -o sum --inplace 0 --timing median)

# "1M" -> 1048576
bytes_of() {
  local v=${1^^} m=1
  case $v in *K) m=1024 ;; *M) m=$((1 << 20)) ;; *G) m=$((1 << 30)) ;; esac
  v=${v%[KMG]}
  echo $((v * m))
}

env_for() {
  case $1 in
    attn-shm) echo ATTN_TRANSPORT=shm ;;
    attn-tcp) echo ATTN_TRANSPORT=tcp ;;
    ucx-sm) echo ATTN_TRANSPORT=ucx UCX_TLS=sm,self ;;
    ucx-tcp) echo ATTN_TRANSPORT=ucx UCX_TLS=tcp ;;
    *) echo "unknown config $1" >&2; return 1 ;;
  esac
}

echo "# results in $RESULTS; $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
FAILS=()
for rep in $(seq 1 "$REPS"); do
  for coll in $COLLS; do
    bin="$B/perf/${coll}_perf"
    [[ -x $bin ]] || { echo "skip $coll: $bin not built" >&2; continue; }
    for cfg in $CONFIGS; do
      base="$RESULTS/$cfg.$coll.r$rep"
      envs=$(env_for "$cfg") || exit 2
      echo "== rep $rep $cfg $coll" >&2
      # shellcheck disable=SC2086
      timeout "$RUN_TIMEOUT" env $envs "$bin" --procs "$NRANKS" "${COMMON[@]}" -J "$base.json" \
        > "$base.log" 2>&1
      rc=$?
      if ((rc != 0)); then
        FAILS+=("$cfg $coll rep $rep (rc $rc, see $base.log)")
        rm -f "$base.json"
        tail -3 "$base.log" >&2
      fi
    done
  done
done

# ucx_perftest: tag bandwidth between two local processes, per size.
PT_MD=""
if [[ $PERFTEST == 1 ]] && command -v ucx_perftest >/dev/null; then
  port=$((20000 + RANDOM % 20000))
  sizes=()
  s=$(bytes_of "$MINB"); max=$(bytes_of "$MAXB")
  while ((s <= max)); do sizes+=("$s"); s=$((s * FACTOR)); done
  for rep in $(seq 1 "$REPS"); do
    for tls in sm,self tcp; do
      for sz in "${sizes[@]}"; do
        port=$((port + 1))
        log="$RESULTS/perftest.${tls%%,*}.$sz.r$rep.log"
        UCX_TLS=$tls timeout 120 ucx_perftest -p "$port" -t tag_bw -s "$sz" -n "$PERFTEST_ITERS" \
          > "$log.server" 2>&1 &
        spid=$!
        sleep 0.3
        UCX_TLS=$tls timeout 120 ucx_perftest localhost -p "$port" -t tag_bw -s "$sz" \
          -n "$PERFTEST_ITERS" > "$log" 2>&1 || FAILS+=("ucx_perftest $tls $sz (see $log)")
        wait "$spid" 2>/dev/null
      done
    done
  done
  # MB/s in ucx_perftest is MiB/s; the table is in GB/s like busbw.
  PT_MD=$(python3 - "$RESULTS" "${sizes[@]}" <<'PY'
import glob, os, statistics, sys
res, sizes = sys.argv[1], [int(s) for s in sys.argv[2:]]
def bw(tls, sz):
    vals = []
    for f in glob.glob(os.path.join(res, f"perftest.{tls}.{sz}.r*.log")):
        for line in open(f):
            if line.startswith("Final:"):
                vals.append(float(line.split()[6]) * 1048576 / 1e9)
    return statistics.median(vals) if vals else float("nan")
print("ucx_perftest -t tag_bw, 2 processes, GB/s (median of runs): the UCX limit")
print()
print("| size | ucx_perftest sm | ucx_perftest tcp |")
print("|---:|---:|---:|")
for sz in sizes:
    print(f"| {sz} | {bw('sm', sz):.2f} | {bw('tcp', sz):.2f} |")
PY
)
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

args=(--order "${CONFIGS// /,}"
      --title "busbw (GB/s), $NRANKS ranks as processes, median of $REPS runs"
      --ratio "ucx-sm:attn-shm" --ratio "ucx-tcp:attn-tcp")
[[ -n $OUT_MD ]] && args+=(--out "$OUT_MD")
python3 "$HERE/summarize.py" "${args[@]}" "$RESULTS"
# One picture of every configuration side by side; no matplotlib is no failure.
PLOT="${PLOT:-$RESULTS/compare_ucx.png}"
python3 "$HERE/plot_perf.py" --label-from-file --title "$NRANKS ranks as processes, median of $REPS runs" \
  "$RESULTS"/*.json -o "$PLOT" >/dev/null && echo "# plot: $PLOT" >&2
if [[ -n $PT_MD ]]; then
  echo
  echo "$PT_MD"
  [[ -n $OUT_MD ]] && printf '\n%s\n' "$PT_MD" >> "$OUT_MD"
fi
if ((${#FAILS[@]})); then
  printf 'FAILED: %s\n' "${FAILS[@]}" >&2
  [[ -n $OUT_MD ]] && printf '\nFailed runs: %s\n' "${FAILS[*]}" >> "$OUT_MD"
  exit 1
fi
