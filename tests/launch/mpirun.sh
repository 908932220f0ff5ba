#!/usr/bin/env bash
# Runs a command under `mpirun -np N` with none of MASTER_ADDR / ATTN_ROOT
# set. By default a perf binary built with MPI shares the unique id over
# MPI; --no-mpi sets ATTN_PERF_NO_MPI=1 so it takes attnCommInitFromEnv's
# one-host path (Open MPI's / MPICH's own variables) instead.
# Exit 77 (skip) when there is no mpirun.
#
#   mpirun.sh [-n 4] [--no-mpi] [--timeout 120] -- command args...
set -u
n=4
timeout=120
nompi=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    --no-mpi) nompi=1; shift ;;
    --timeout) timeout="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "mpirun.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "mpirun.sh: no command after --" >&2; exit 2; }
mpirun="$(command -v mpirun || command -v mpiexec || true)"
[ -n "$mpirun" ] || { echo "mpirun.sh: no mpirun or mpiexec: skipped"; exit 77; }

for v in ATTN_RANK ATTN_NRANKS ATTN_ROOT RANK WORLD_SIZE MASTER_ADDR MASTER_PORT ATTN_PERF_NO_MPI; do
  unset "$v"
done
# Slurm's variables of an enclosing allocation would only confuse the test.
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
[ "$nompi" = 1 ] && export ATTN_PERF_NO_MPI=1

flags=()
if "$mpirun" --version 2>&1 | grep -q "Open MPI"; then
  # Open MPI refuses root without this, and more ranks than cores without
  # --oversubscribe; MPICH's Hydra needs neither.
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  [ "$(nproc)" -lt "$n" ] && flags+=(--oversubscribe)
fi
echo "mpirun.sh: $mpirun ${flags[*]} -np $n (ATTN_PERF_NO_MPI=${ATTN_PERF_NO_MPI:-unset})"
timeout -k 5 "$timeout" "$mpirun" "${flags[@]}" -np "$n" "$@"
