#!/bin/bash
# emulate_hosts.sh: run a multi-rank command across K emulated "hosts" on one
# machine, optionally grouped into R "racks". Each host is a network
# namespace with one veth link to a bridge that lives in its own "switch"
# namespace, so nothing is added to the root namespace and concurrent runs
# (names carry this script's pid) never meet. With --racks R > 1, the hosts
# of each rack share a rack switch (namespace + bridge) and the rack switches
# join a core switch over one uplink each. Host i gets 10.77.X.(i+1)/24 (one
# L2 segment); rank 0's bootstrap root is host0's address. Host links
# (--rate) and rack uplinks (--rack-rate) are shaped with tc tbf in both
# directions (netem does not work here).
#
#   emulate_hosts.sh --hosts 2 --ranks-per-host 2 --rate 1gbit -- \
#       build/perf/all_gather_perf -b 1M -e 16M -c 1
#   emulate_hosts.sh --racks 2 --hosts 4 --ranks-per-host 2 --rate 1gbit \
#       --rack-rate 500mbit -- build/perf/all_reduce_perf -A hier -c 1
#
# Every rank gets: ATTN_RANK ATTN_NRANKS ATTN_LOCAL_RANK ATTN_LOCAL_NRANKS
# ATTN_ROOT (host0:port) ATTN_SECRET ATTN_HOSTID=host<i> ATTN_RACKID=rack<j>
# ATTN_SOCKET_IFNAME=<the namespace's interface>; with --torchrun-env instead
# what a plain torchrun launch sets (RANK WORLD_SIZE LOCAL_RANK
# LOCAL_WORLD_SIZE MASTER_ADDR=host0 MASTER_PORT=port-1) plus ATTN_SECRET and
# ATTN_HOSTID, so the library must find the interface itself (the hosts
# have no default route). Ranks are numbered host by
# host (rank = host * R + local), or round robin over hosts with --interleave
# (so proximity order has to be found, not read off the rank numbers).
# Exit: 0 all ranks ok, 1 some rank failed, 2 bad usage, 77 cannot emulate
# here (not root, no `ip netns`, no tc) -- ctest's SKIP_RETURN_CODE.
set -uo pipefail

usage() {
  sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --hosts K            number of emulated hosts (all racks)     [2]
  --ranks-per-host R   ranks started in each host               [1]
  --rate RATE          per-host link rate, e.g. 100mbit, 1gbit  [unlimited]
  --racks N            racks (K/N consecutive hosts each), each
                       with its own switch and one uplink        [1]
  --rack-rate RATE     per-rack uplink rate                     [unlimited]
  --queue-ms MS        a shaped link's queue, in ms at its rate:
                       packets beyond it are dropped             [20]
  --hosts-per-rack N   same as --racks K/N
  --interleave         number ranks round robin over hosts
  --torchrun-env       torchrun's variables, no ATTN_ROOT / ATTN_SOCKET_IFNAME
  --subnet X           use 10.77.X.0/24                         [from pid]
  --port P             bootstrap root port on host0             [29500]
  --mtu M              link MTU                                 [1500]
  --timeout S          kill ranks still running after S seconds [none]
  --grace S            after a rank fails, kill the rest after S seconds [30]
  --log-dir DIR        write rank<r>.log there instead of the terminal
EOF
}

skip() { echo "emulate_hosts: SKIP: $*" >&2; exit 77; }
die() { echo "emulate_hosts: $*" >&2; exit 2; }

HOSTS=2 RPH=1 RATE="" RACKS=0 RACK_RATE="" QUEUE_MS=20 INTERLEAVE=0 TORCHRUN=0 HPR=0 SUBNET="" PORT=29500 MTU=1500 TIMEOUT=0 GRACE=30 LOGDIR=""
while (($#)); do
  case "$1" in
    --hosts) HOSTS="$2"; shift 2 ;;
    --ranks-per-host) RPH="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --hosts-per-rack) HPR="$2"; shift 2 ;;
    --racks) RACKS="$2"; shift 2 ;;
    --rack-rate) RACK_RATE="$2"; shift 2 ;;
    --queue-ms) QUEUE_MS="$2"; shift 2 ;;
    --interleave) INTERLEAVE=1; shift ;;
    --torchrun-env) TORCHRUN=1; shift ;;
    --subnet) SUBNET="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --mtu) MTU="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --grace) GRACE="$2"; shift 2 ;;
    --log-dir) LOGDIR="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
done
(($# > 0)) || { usage >&2; die "no command given (put it after --)"; }
for v in HOSTS RPH HPR RACKS PORT MTU TIMEOUT GRACE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v,,} needs a number"
done
((HOSTS >= 1 && HOSTS <= 250 && RPH >= 1)) || die "need 1..250 hosts and >= 1 rank per host"
# Racks: --racks wins; else --hosts-per-rack; else one rack.
if ((RACKS == 0)); then
  if ((HPR > 0)); then RACKS=$(( (HOSTS + HPR - 1) / HPR )); else RACKS=1; fi
fi
((RACKS >= 1 && RACKS <= 50 && HOSTS % RACKS == 0)) || die "--racks must divide --hosts (1..50 racks)"
HPR=$((HOSTS / RACKS))
[[ -z $RACK_RATE || $RACKS -gt 1 ]] || die "--rack-rate needs --racks > 1"
# The subnet only has to be unique among our own namespaces; deriving it
# from the pid keeps concurrent runs apart in logs as well.
[[ $QUEUE_MS =~ ^[0-9]+$ ]] && ((QUEUE_MS >= 1)) || die "--queue-ms must be a whole number of ms >= 1"
[[ -n $SUBNET ]] || SUBNET=$(( $$ % 200 + 20 ))
[[ $SUBNET =~ ^[0-9]+$ ]] && ((SUBNET <= 255)) || die "--subnet must be 0..255"

# tbf needs a burst of at least one GSO packet (64 KiB) and a few ms of
# traffic, else it drops or crawls. Prints "RATE BURST_BYTES".
tbf_params() {
  local bits
  bits=$(awk -v r="$1" 'BEGIN {
    if (match(r, /^[0-9.]+/) == 0) exit 1
    n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    if (!(u in m)) exit 1
    printf "%.0f\n", n * m[u] }') || return 1
  local burst=$(( bits / 8 / 500 ))  # 2 ms at line rate
  ((burst < 131072)) && burst=131072
  echo "$bits $burst"
}

# ---- can we emulate at all? ---------------------------------------------------
(( EUID == 0 )) || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "iproute2 'ip' not installed"
ip netns list >/dev/null 2>&1 || skip "'ip netns' not available"
if [[ -n $RATE || -n $RACK_RATE ]]; then
  command -v tc >/dev/null || skip "--rate/--rack-rate need tc (iproute2)"
fi
if [[ -n $RATE ]]; then
  read -r RATE_BITS BURST < <(tbf_params "$RATE") || die "bad --rate '$RATE' (e.g. 500mbit, 1gbit)"
fi
if [[ -n $RACK_RATE ]]; then
  read -r RACK_BITS RACK_BURST < <(tbf_params "$RACK_RATE") \
    || die "bad --rack-rate '$RACK_RATE' (e.g. 500mbit, 1gbit)"
fi

TAG="attn$$"
SW="${TAG}sw"
IFNAME="eth0"
NSES=()   # namespaces created so far, for cleanup
PIDS=()   # rank processes (their pids are ours: started below)

cleanup() {
  local ns pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  # Anything still running inside our namespaces was started by us.
  for ns in "${NSES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in "${NSES[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkns() {
  local err
  err=$(ip netns add "$1" 2>&1) || skip "cannot create a network namespace: $err"
  NSES+=("$1")
  ip -n "$1" link set lo up || die "cannot bring up lo in $1"
}

shape() {  # shape NS DEV [BITS BURST]: host link rate unless given
  local bits=${3:-${RATE_BITS:-}} burst=${4:-${BURST:-}}
  [[ -z $bits ]] && return 0
  tc -n "$1" qdisc add dev "$2" root tbf rate "${bits}bit" burst "$burst" latency "${QUEUE_MS}ms" \
    || die "tc tbf failed on $1/$2"
}

# ---- build the fabric ---------------------------------------------------------------
mkswitch() {  # a namespace holding bridge br0
  mkns "$1"
  ip -n "$1" link add br0 type bridge || die "cannot create bridge in $1"
  ip -n "$1" link set br0 up
}
# One rack: hosts hang off $SW. Several: $SW is the core; rack i's switch
# ${TAG}r<i> joins it by an uplink shaped at --rack-rate.
mkswitch "$SW"
rack_switch() { if ((RACKS > 1)); then echo "${TAG}r$1"; else echo "$SW"; fi; }
if ((RACKS > 1)); then
  for ((k = 0; k < RACKS; k++)); do
    rs=$(rack_switch "$k")
    mkswitch "$rs"
    ip -n "$SW" link add "r$k" mtu "$MTU" type veth peer name uplink netns "$rs" mtu "$MTU" \
      || die "cannot create the uplink of rack$k"
    ip -n "$SW" link set "r$k" master br0 up
    ip -n "$rs" link set dev uplink master br0 up
    shape "$rs" uplink "${RACK_BITS:-}" "${RACK_BURST:-}"     # rack -> core
    shape "$SW" "r$k" "${RACK_BITS:-}" "${RACK_BURST:-}"  # core -> rack
  done
fi
for ((h = 0; h < HOSTS; h++)); do
  ns="${TAG}h$h"
  rs=$(rack_switch $((h / HPR)))
  mkns "$ns"
  ip -n "$rs" link add "p$h" mtu "$MTU" type veth peer name "$IFNAME" netns "$ns" mtu "$MTU" \
    || die "cannot create veth for host$h"
  ip -n "$rs" link set "p$h" master br0 up
  ip -n "$ns" addr add "10.77.$SUBNET.$((h + 1))/24" dev "$IFNAME"
  ip -n "$ns" link set "$IFNAME" up
  shape "$ns" "$IFNAME"  # host -> switch
  shape "$rs" "p$h"      # switch -> host
done

NRANKS=$((HOSTS * RPH))
ROOT="10.77.$SUBNET.1:$PORT"
SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
[[ -n $LOGDIR ]] && { mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"; }
echo "emulate_hosts: $RACKS rack(s) x $HPR host(s) x $RPH rank(s), 10.77.$SUBNET.0/24 via" \
     "${IFNAME}, host links ${RATE:-unlimited}, rack uplinks ${RACK_RATE:-unlimited}," \
     "root $ROOT" >&2

# ---- start the ranks ---------------------------------------------------------------
declare -A RANK_OF
for ((h = 0; h < HOSTS; h++)); do
  for ((l = 0; l < RPH; l++)); do
    r=$((h * RPH + l))
    ((INTERLEAVE)) && r=$((l * HOSTS + h))
    rack=$((h / HPR))
    if ((TORCHRUN)); then
      cmd=(ip netns exec "${TAG}h$h" env
           RANK="$r" WORLD_SIZE="$NRANKS" LOCAL_RANK="$l" LOCAL_WORLD_SIZE="$RPH"
           MASTER_ADDR="${ROOT%:*}" MASTER_PORT="$((PORT - 1))" ATTN_SECRET="$SECRET"
           ATTN_HOSTID="host$h" ATTN_RACKID="rack$rack")
    else
      cmd=(ip netns exec "${TAG}h$h" env
           ATTN_RANK="$r" ATTN_NRANKS="$NRANKS" ATTN_LOCAL_RANK="$l" ATTN_LOCAL_NRANKS="$RPH"
           ATTN_ROOT="$ROOT" ATTN_SECRET="$SECRET" ATTN_HOSTID="host$h" ATTN_RACKID="rack$rack"
           ATTN_SOCKET_IFNAME="$IFNAME")
    fi
    ((TIMEOUT > 0)) && cmd+=(timeout "$TIMEOUT")
    if [[ -n $LOGDIR ]]; then
      "${cmd[@]}" "$@" >"$LOGDIR/rank$r.log" 2>&1 &
    else
      "${cmd[@]}" "$@" &
    fi
    PIDS+=($!)
    RANK_OF[$!]=$r
  done
done

# ---- wait; after a failure the others get --grace seconds, then are killed --------------
# The grace timer is a plain `sleep` child, so `wait -n` wakes for it too.
signal_ranks() {
  local ns pid
  for ns in "${NSES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "-$1" "$pid" 2>/dev/null; done
  done
}
FAILED=()
TIMER=""
STAGE=0  # 0 all fine, 1 a rank failed, 2 sent TERM, 3 sent KILL
while ((${#RANK_OF[@]})); do
  done_pid=""
  wait -n -p done_pid "${!RANK_OF[@]}" $TIMER
  rc=$?
  [[ -z $done_pid ]] && break
  if [[ $done_pid == "$TIMER" ]]; then
    TIMER=""
    if ((STAGE == 1)); then
      echo "emulate_hosts: ranks still running ${GRACE}s after a failure; terminating" >&2
      signal_ranks TERM; STAGE=2; sleep 5 & TIMER=$!
    else
      signal_ranks KILL; STAGE=3
    fi
    continue
  fi
  r=${RANK_OF[$done_pid]}
  unset "RANK_OF[$done_pid]"
  if ((rc != 0)); then
    FAILED+=("rank $r (rc $rc)")
    if ((STAGE == 0)); then STAGE=1; sleep "$GRACE" & TIMER=$!; fi
  fi
done
[[ -n $TIMER ]] && kill "$TIMER" 2>/dev/null
PIDS=()

if ((${#FAILED[@]})); then
  echo "emulate_hosts: failed: ${FAILED[*]}" >&2
  exit 1
fi
exit 0
