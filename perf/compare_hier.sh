#!/bin/bash
# compare_hier.sh: flat ring against hierarchical all-gather / reduce-scatter
# on emulated hosts (tests/netns/emulate_hosts.sh, needs root), side by side
# in one run, with the slow-link lower bound next to them.
#
#   sudo perf/compare_hier.sh [--build build] [--hosts 2] [--ranks-per-host 4]
#        [--rate 1gbit] [--reps 3] [--sizes "16M 32M 64M"] [--iters 3]
#        [--plot FILE.png]
#
# For each repetition, size and collective it runs ring then hier (same
# fabric, interleaved so drift hits both) and prints medians over the
# repetitions. Lower bound: what must cross one host's link, the other
# hosts' share of the data, (G-1)/G x size, over the link rate (tbf also
# counts packet headers, so ~3% above it is the practical floor). Exit 77
# when hosts cannot be emulated here. --plot (default compare_hier.png in
# the current directory) draws ring and hier busbw side by side (needs
# matplotlib; skipped without it).
set -uo pipefail

BUILD=build HOSTS=2 RPH=4 RATE=1gbit REPS=3 SIZES="16M 32M 64M" ITERS=3 PLOT=compare_hier.png
while (($#)); do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --hosts) HOSTS="$2"; shift 2 ;;
    --ranks-per-host) RPH="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --sizes) SIZES="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --plot) PLOT="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_hier: unknown option '$1'" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
EMU="$HERE/../tests/netns/emulate_hosts.sh"
for b in all_gather_perf reduce_scatter_perf; do
  [[ -x $BUILD/perf/$b ]] || { echo "compare_hier: $BUILD/perf/$b not built" >&2; exit 2; }
done
RATE_BPS=$(awk -v r="$RATE" 'BEGIN {
  if (match(r, /^[0-9.]+/) == 0) exit 1
  n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
  m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9
  if (!(u in m)) exit 1
  printf "%.0f\n", n * m[u] / 8 }') || { echo "compare_hier: bad --rate '$RATE'" >&2; exit 2; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS="$TMP/results"  # coll algo size seconds
: >"$RESULTS"

run() {  # run COLL ALGO SIZE REP
  local dir="$TMP/$1.$2.$3.$4"
  # Rank 0's JSON; one name per (coll, algo) so the plot merges sizes and reps.
  mkdir -p "$TMP/json/$3.$4"
  "$EMU" --hosts "$HOSTS" --ranks-per-host "$RPH" --rate "$RATE" --timeout 600 --log-dir "$dir" -- \
    "$BUILD/perf/$1_perf" -b "$3" -e "$3" -n "$ITERS" -w 1 -c 0 --inplace 0 --timing median -A "$2" -J "$TMP/json/$3.$4/$1.$2.json" 2>"$dir.err"
  local rc=$?
  if ((rc == 77)); then cat "$dir.err" >&2; exit 77; fi
  if ((rc != 0)); then
    echo "compare_hier: $1_perf -A $2 at $3 failed (rc $rc)" >&2
    cat "$dir.err" "$dir/rank0.log" >&2
    exit 1
  fi
  # Rank 0's row: size count type redop root time(us) ...
  awk -v c="$1" -v a="$2" '/^ +[0-9]+ / { printf "%s %s %s %.6f\n", c, a, $1, $6 / 1e6 }' \
    "$dir/rank0.log" >>"$RESULTS"
}

for ((rep = 0; rep < REPS; rep++)); do
  for size in $SIZES; do
    for coll in all_gather reduce_scatter; do
      for algo in ring hier; do run "$coll" "$algo" "$size" "$rep"; done
    done
  done
done

echo "# $HOSTS hosts x $RPH ranks, host link $RATE; medians of $REPS runs x $ITERS iterations"
echo "# bound = (G-1)/G x size / rate (what must cross one host's link)"
python3 - "$RESULTS" "$HOSTS" "$RATE_BPS" <<'EOF'
import statistics, sys
path, hosts, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t = {}
for line in open(path):
    c, a, size, sec = line.split()
    t.setdefault((c, int(size)), {}).setdefault(a, []).append(float(sec))
print(f"{'collective':<15}{'size':>10}{'ring s':>10}{'hier s':>10}{'bound s':>10}"
      f"{'ring/hier':>11}{'hier/bound':>12}")
for (c, size) in sorted(t):
    d = t[(c, size)]
    ring, hier = statistics.median(d["ring"]), statistics.median(d["hier"])
    bound = (hosts - 1) / hosts * size / rate
    print(f"{c:<15}{size:>10}{ring:>10.3f}{hier:>10.3f}{bound:>10.3f}"
          f"{ring / hier:>11.2f}{hier / bound:>12.2f}")
EOF
status=$?
# One picture: ring and hier side by side per collective; no matplotlib is no failure.
python3 "$HERE/plot_perf.py" --label-from-file --title "$HOSTS hosts x $RPH ranks, host link $RATE" \
  "$TMP"/json/*/*.json -o "$PLOT" >/dev/null && echo "# plot: $PLOT"
exit $status
