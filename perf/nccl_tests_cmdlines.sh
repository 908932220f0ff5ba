#!/usr/bin/env bash
# nccl-tests' own README command lines, run against our binaries with small
# sizes: each must exit 0 and report #wrong 0 on every row.
#   perf/nccl_tests_cmdlines.sh BUILD_DIR
set -u
B=${1:?usage: nccl_tests_cmdlines.sh BUILD_DIR}/perf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
S="-b 8 -e 128K -f 8 -n 3 -w 1"  # the README's -e 128M, made small
fails=0 n=0

run() {
  n=$((n + 1))
  local out="$T/out.$n"
  if ! timeout 120 "$@" >"$out" 2>&1; then
    echo "FAIL (exit $?): $*"; tail -5 "$out"; fails=$((fails + 1)); return
  fi
  # Data rows start with a space; #wrong is column 9, and in place 13
  # (17 with -I 1's four per-iteration columns).
  local bad
  bad=$(awk '/i_min/ { ip = 17 } /^# +size/ && !ip { ip = 13 }
             /^ +[0-9]/ { if (($9 != "0" && $9 != "N/A") || (NF >= ip && $ip != "0" && $ip != "N/A")) print }' "$out")
  if [ -n "$bad" ] || ! grep -q "Out of bounds values : 0 OK" "$out"; then
    echo "FAIL (#wrong): $*"; echo "$bad" | head -3; fails=$((fails + 1)); return
  fi
  echo "ok: $*"
}

run "$B/all_reduce_perf" -b 8 -e 128K -f 2 -g 1
run "$B/all_reduce_perf" $S -t 2
run "$B/all_reduce_perf" $S -t 2 -g 2
run "$B/all_gather_perf" $S -t 3 -c 1
run "$B/reduce_scatter_perf" $S -t 2 -c 3
run "$B/alltoall_perf" -b 1K -e 64K -f 4 -t 2 -n 10 -w 2
for a in 0 1 2 3; do run "$B/all_reduce_perf" $S -t 2 -a $a; done
for z in 1 2 3; do run "$B/all_reduce_perf" $S -t 2 -m 2 -z $z; done
run "$B/all_reduce_perf" -b 1K -e 4K -f 4 -n 2 -w 1 -t 2 -d all
run "$B/reduce_perf" -b 1K -e 4K -f 4 -n 2 -w 1 -t 3 -o all -r all
run "$B/broadcast_perf" $S -t 3 -r all
run "$B/all_reduce_perf" $S -t 2 -m 2
run "$B/all_reduce_perf" $S -t 2 -I 1 -K 1
run "$B/sendrecv_perf" $S -t 2 -C 1 -S 1 -M 1 -u 1
run "$B/all_reduce_perf" $S -t 2 -p 1 -N 2
run "$B/all_reduce_perf" $S -t 2 -R 0 -x 0 -D 0 -V 16 -y 0 -T 60
run "$B/all_reduce_perf" $S -t 2 -I 1 -J "$T/run.json"
[ -s "$T/run.json" ] || { echo "FAIL: -J wrote no $T/run.json"; fails=$((fails + 1)); }
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['version']==3" "$T/run.json" ||
  { echo "FAIL: $T/run.json is not nccl-tests JSON v3"; fails=$((fails + 1)); }
echo "$((n - fails))/$n command lines ok"
[ "$fails" -eq 0 ]
