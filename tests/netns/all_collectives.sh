#!/bin/bash
# all_collectives.sh: one rank's part of the emulated-fabric correctness run
# (started by emulate_hosts.sh on every rank). Runs every collective's perf
# binary with result checking (-c 1) on small sizes, one after the other,
# each with its own bootstrap port. The first run also logs the hierarchy
# the ranks found; with --expect-tiers, rank 0 checks it (e.g. "2x2x2
# (racks x hosts x ranks)").
#
#   emulate_hosts.sh --racks 2 --hosts 4 --ranks-per-host 2 -- \
#       tests/netns/all_collectives.sh --bin build/perf --algo hier \
#       --expect-tiers "2x2x2 (racks x hosts x ranks)"
set -uo pipefail

BIN="" ALGO="auto" EXPECT=""
while (($#)); do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --algo) ALGO="$2"; shift 2 ;;
    --expect-tiers) EXPECT="$2"; shift 2 ;;
    *) echo "all_collectives: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ -d $BIN ]] || { echo "all_collectives: --bin DIR with the perf binaries" >&2; exit 2; }
: "${ATTN_ROOT:?set by emulate_hosts.sh}" "${ATTN_RANK:?set by emulate_hosts.sh}"
host=${ATTN_ROOT%:*} port=${ATTN_ROOT##*:}
sizes=(-b 1K -e 256K -f 16 -n 2 -w 1 -c 1 -A "$ALGO")

i=0
for coll in all_gather reduce_scatter all_reduce broadcast reduce alltoall sendrecv; do
  log=$(mktemp)
  ATTN_ROOT="$host:$((port + i))" ATTN_DEBUG=INFO ATTN_DEBUG_SUBSYS=COLL \
    "$BIN/${coll}_perf" "${sizes[@]}" >"$log" 2>&1
  rc=$?
  if ((rc != 0)); then  # the perf binaries exit non-zero on any wrong value
    echo "all_collectives: rank $ATTN_RANK: ${coll}_perf -A $ALGO failed (rc $rc)" >&2
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  if ((i == 0 && ATTN_RANK == 0)); then
    grep -o "hierarchy .*" "$log" | head -1 >&2
    if [[ -n $EXPECT ]] && ! grep -qF "hierarchy $EXPECT;" "$log"; then
      echo "all_collectives: rank 0 expected hierarchy '$EXPECT'" >&2
      rm -f "$log"
      exit 1
    fi
  fi
  ((ATTN_RANK == 0)) && grep -E "^ +[0-9]+ " "$log" | tail -1 | sed "s/^/${coll} -A $ALGO: /" >&2
  rm -f "$log"
  i=$((i + 1))
done
