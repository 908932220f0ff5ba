// The --help text of the collective perf binaries (flag table in one place).
#include <cstdio>

#include "perf/options.h"

namespace attnperf {

void printUsage(const char* prog) {
  fprintf(stderr,
          "usage: %s [options]   (nccl-tests flags keep nccl-tests' meaning)\n"
          "  -t,--nthreads N          threads per process (each drives -g ranks)   [1]\n"
          "  -g,--ngpus N             ranks per thread, driven inside one group    [1]\n"
          "  -b,--minbytes SIZE       smallest size (K/M/G suffix)                 [32M]\n"
          "  -e,--maxbytes SIZE       largest size                                 [32M]\n"
          "  -i,--stepbytes SIZE      add SIZE between sizes                       [1M]\n"
          "  -f,--stepfactor F        multiply by F instead (F > 1)                [off]\n"
          "  -n,--iters N             timed iterations                             [20]\n"
          "  -m,--agg_iters N         calls per iteration, in one group            [1]\n"
          "  -w,--warmup_iters N      untimed iterations                           [1]\n"
          "  -N,--run_cycles N        repeat the sweep N times, 0 = until killed   [1]\n"
          "  -p,--parallel_init 0|1   threads init their communicators themselves  [0]\n"
          "  -c,--check N             checked iterations per size (0: no check)    [1]\n"
          "  -o,--op OP|all           sum prod max min avg                         [sum]\n"
          "  -d,--datatype T|all      int8 uint8 int32 int64 half float double bfloat16 [float]\n"
          "  -r,--root R|all          root rank (broadcast, reduce)                [0]\n"
          "  -z,--blocking 0..3       1 wait+barrier per call, 2 wait per call,\n"
          "                           3 wait+barrier per iteration (barrier not timed) [0]\n"
          "  -y,--stream_null 0|1     device buffers: use the NULL stream          [0]\n"
          "  -T,--timeout S           abort the communicators after S seconds      [off]\n"
          "  -G,--cudagraph N         capture iters*agg calls, replay N times (device) [0]\n"
          "  -C,--report_cputime 0|1  report the time to issue the calls           [0]\n"
          "  -S,--report_timestamps 0|1  timestamp column                          [0]\n"
          "  -J,--output_file FILE    JSON (nccl-tests schema v3); never overwrites\n"
          "  -a,--average 0..3        combine ranks' times: rank0 avg min max      [1]\n"
          "  -I,--per_iter_timing 0|1 per-iteration i_min/i_max/i_p99/i_cv%% columns [0]\n"
          "  -K,--per_iter_skip N     leave the first N samples out of those stats [0]\n"
          "  -M,--memory 0|1          print the buffers' bytes per rank            [0]\n"
          "  -u,--unalign N           misalign buffers by N elements               [0]\n"
          "  -R,--local_register 0    (registration: use --mem shareable)          [0]\n"
          "  -x/-D/-V                 NCCL-only; defaults (-x 0, -D 0, -V 16) accepted\n"
          "attncomm options:\n"
          "  --procs N                N ranks as forked processes\n"
          "  -A,--algo ring|hier|direct|auto   sets ATTN_ALGO\n"
          "  --transport LIST         sets ATTN_TRANSPORT (e.g. shm,tcp)\n"
          "  --mem host|shareable|device  buffers: malloc, attnMemAlloc, CUDA  [host]\n"
          "  --device DEV             device buffers on CUDA device DEV, ranks share it\n"
          "  --inplace 0|1            also time the in-place variant              [1]\n"
          "  --timing avg|median      avg: loop time / (n*m), as nccl-tests; median:\n"
          "                           barrier per iteration, max over ranks, median [avg]\n"
          "  --coll NAME              (baselines) all_gather|reduce_scatter|alltoall|...\n"
          "  --plot FILE.png          plot busbw per size (needs matplotlib)\n"
          "Launched by mpirun/torchrun/emulate_hosts.sh (ATTN_RANK, RANK or\n"
          "OMPI_COMM_WORLD_RANK set), each process is one rank.\n",
          prog);
}

}  // namespace attnperf
