// Combinations of flags that cannot run, refused up front with one line each
// (nccl-tests warns and drops some of these; we refuse, so a script never
// measures something other than what it asked for).
#include <cstdio>

#include "perf/options.h"

namespace attnperf {

bool checkOptions(Options* o, const char* prog) {
  auto no = [prog](const char* why) {
    fprintf(stderr, "%s: %s\n", prog, why);
    return false;
  };
  if (o->minBytes > o->maxBytes) return no("-b is larger than -e");
  if (o->stepFactor <= 1.0 && o->stepBytes == 0) return no("-i 0 without -f would never advance");
  if (o->procs && o->ranksPerProcess() > 1)
    return no("--procs runs one rank per process: -t and -g must be 1 with it");
  if (o->graphLaunches > 0 && !o->onDevice())
    return no("-G (CUDA graph) needs device buffers: add --mem device or --device DEV");
  if (o->graphLaunches > 0 && o->perIterTiming)
    return no("-I 1 (per-iteration timing) cannot time the calls inside a CUDA graph (-G)");
  if (o->graphLaunches > 0 && o->blocking)
    return no("-z 1..3 wait between calls, which a CUDA graph (-G) cannot");
  // Threads of one process share the device's one NULL stream: a rank's call
  // would queue behind a peer's that waits for it.
  if (o->streamNull && o->onDevice() && !o->procs && o->ranksPerProcess() > 1)
    return no("-y 1 with device buffers needs one rank per process (--procs N, or -t 1 -g 1)");
  if (o->graphLaunches > 0 && o->timing == Timing::kMedian)
    return no("--timing median needs per-iteration times, which a CUDA graph (-G) replay has not");
  if (o->perIterSkip && !o->perIterTiming) return no("-K needs -I 1");
  if (o->perIterSkip >= o->iters) return no("-K must be smaller than -n");
  return true;
}

}  // namespace attnperf
