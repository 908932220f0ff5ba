#!/usr/bin/env bash
# Starts N processes of a command with only the variables srun gives each
# task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID,
# SLURM_STEP_ID, SLURM_STEP_NODELIST) and none of MASTER_ADDR / ATTN_ROOT:
# attnCommInitFromEnv must find the root (the node list's first host, a
# port from the job and step ids) by itself. Exit: the worst rank's code.
#
#   slurm_env.sh [-n 4] [--nodelist LIST] [--timeout 120] -- command args...
set -u
n=4
nodelist=""
timeout=120
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    --nodelist) nodelist="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "slurm_env.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "slurm_env.sh: no command after --" >&2; exit 2; }
if [ -z "$nodelist" ]; then
  # This host's name when it resolves (as on a Slurm node), else localhost.
  h="$(hostname 2>/dev/null || true)"
  if [ -n "$h" ] && getent hosts "$h" >/dev/null 2>&1; then nodelist="$h"; else nodelist=localhost; fi
fi

# Nothing from another launcher may leak in: this is srun's view only.
for v in $(env | sed -n 's/^\(\(ATTN_RANK\|ATTN_NRANKS\|ATTN_ROOT\|RANK\|WORLD_SIZE\|LOCAL_RANK\|LOCAL_WORLD_SIZE\|MASTER_ADDR\|MASTER_PORT\|TORCHELASTIC_[A-Z_]*\|OMPI_[A-Za-z_]*\|PMI_[A-Z_]*\|PMIX_[A-Z_]*\|MPI_LOCAL[A-Z]*\|SLURM_[A-Z_]*\)\)=.*/\1/p'); do
  unset "$v"
done
# A job id of this run's own, so concurrent runs meet at different ports.
export SLURM_JOB_ID=$(( ($$ << 8) + RANDOM % 256 )) SLURM_STEP_ID=0 SLURM_NTASKS="$n"
export SLURM_STEP_NODELIST="$nodelist" SLURM_JOB_NODELIST="$nodelist"
echo "slurm_env.sh: $n tasks, SLURM_JOB_ID=$SLURM_JOB_ID SLURM_STEP_NODELIST=$nodelist"

pids=()
for ((r = 0; r < n; r++)); do
  SLURM_PROCID=$r SLURM_LOCALID=$r timeout -k 5 "$timeout" "$@" &
  pids+=($!)
done
worst=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rc=$?
  [ "$rc" -ne 0 ] && echo "slurm_env.sh: task $r exited $rc" >&2
  [ "$rc" -gt "$worst" ] && worst=$rc
done
exit "$worst"
