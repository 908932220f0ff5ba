#!/usr/bin/env bash
# ctest helper: runs a perf binary with --plot OUT.png and checks that a
# real PNG came out (magic bytes, more than a trivial size). Exits 77 (skip)
# when python3 has no matplotlib.
#   check_plot_png.sh OUT.png BINARY ARGS... (ARGS include --plot OUT.png)
set -uo pipefail
png=$1
shift
if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  echo "skip: matplotlib not installed for $(command -v python3)"
  exit 77
fi
rm -f "$png"
"$@" || { echo "FAIL: $* exited $?"; exit 1; }
[[ -f $png ]] || { echo "FAIL: $png not written"; exit 1; }
magic=$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')
[[ $magic == 89504e470d0a1a0a ]] || { echo "FAIL: $png is not a PNG (starts $magic)"; exit 1; }
size=$(stat -c %s "$png")
((size > 10000)) || { echo "FAIL: $png has only $size bytes"; exit 1; }
echo "ok: $png, $size bytes"
