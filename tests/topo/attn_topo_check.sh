#!/usr/bin/env bash
# ctest checks of attn_topo's reading of NCCL topology files and of
# HWLOC_XMLFILE (tests/CMakeLists.txt registers them):
#   attn_topo_check.sh ATTN_TOPO pairs FILE NPAIRS NNUMA   NPAIRS "GPU -> NIC" lines, NNUMA NUMA nodes
#   attn_topo_check.sh ATTN_TOPO bad FILE                  exit 2 with "FILE:LINE: ..." on stderr
#   attn_topo_check.sh ATTN_TOPO hwloc-warn                an unloadable HWLOC_XMLFILE is warned about once
set -uo pipefail
bin=$1 mode=$2
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err" "${bad:-}"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$out"; echo "--- stderr"; cat "$err"; exit 1; }
# Neither the caller's NCCL file nor its hwloc XML may leak into the checks.
unset NCCL_TOPO_FILE ATTN_NCCL_TOPO_FILE HWLOC_XMLFILE
case $mode in
  pairs)
    file=$3 want=$4 numa=$5
    "$bin" --nccl-topo "$file" >"$out" 2>"$err" || fail "attn_topo exited $?"
    got=$(grep -cE '^    GPU [0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f] -> NIC .*pci [0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]\)?, NUMA node [0-9]+' "$out")
    [ "$got" = "$want" ] || fail "$got GPU-NIC pair lines, want $want"
    grep -q "NCCL topology $file): .* $numa NUMA node(s)" "$out" || fail "want $numa NUMA nodes from $file"
    ! grep -q "^  warning:" "$out" || fail "discovery warned"
    # Each GPU's NIC is a different one (one NIC per switch in the files tested).
    nics=$(grep -oE ' -> NIC .*pci [^,)]*' "$out" | sort -u | wc -l)
    [ "$nics" = "$want" ] || fail "$nics distinct NICs for $want GPUs"
    echo "ok: $got GPU-NIC pairs, $numa NUMA nodes"
    ;;
  bad)
    file=$3
    "$bin" --nccl-topo "$file" >"$out" 2>"$err"
    rc=$?
    [ $rc = 2 ] || fail "exit $rc, want 2"
    grep -qE "^attn_topo: $file:[0-9]+: " "$err" || fail "no file:line error"
    [ "$(wc -l <"$err")" = 1 ] || fail "error is not one line"
    echo "ok: $(cat "$err")"
    ;;
  hwloc-warn)
    bad=$(mktemp --suffix=.xml)
    echo '<topology><object type="Machine"' >"$bad"
    HWLOC_XMLFILE=$bad ATTN_DEBUG=WARN ATTN_DEBUG_SUBSYS=TOPO "$bin" -t 2 >"$out" 2>"$err" || fail "attn_topo exited $?"
    n=$(grep -c "ATTN WARN.*HWLOC_XMLFILE=$bad: hwloc could not load it" "$err")
    [ "$n" = 1 ] || fail "$n warnings, want exactly 1"
    grep -q "warning: HWLOC_XMLFILE=$bad" "$out" || fail "no warning in the local view"
    echo "ok: warned once"
    ;;
  *) echo "usage: $0 ATTN_TOPO pairs|bad|hwloc-warn ..." >&2; exit 2 ;;
esac
