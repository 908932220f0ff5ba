// perfMain: flags -> environment -> launch -> exit code. Shared by every
// <coll>_perf binary.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "perf/coll_spec.h"
#include "perf/launch.h"
#include "perf/options.h"
#include "perf/rank_device.h"
#include "perf/runner.h"
#include "perf/watchdog.h"

namespace attnperf {

int perfMain(int argc, char** argv, const CollSpec& spec) {
  Options o;
  int code = 0;
  if (!parseOptions(argc, argv, &o, &code)) return code;
  // --algo / --transport travel as environment so forked and externally
  // launched ranks see them too; set before any communicator exists.
  if (!o.algo.empty()) setenv("ATTN_ALGO", o.algo.c_str(), 1);
  if (!o.transports.empty()) setenv("ATTN_TRANSPORT", o.transports.c_str(), 1);

  const char* slash = strrchr(argv[0], '/');
  const std::string program = slash ? slash + 1 : argv[0];
  const bool external = !o.procs && launchedExternally();
  if (external && o.ranksPerProcess() > 1) {
    fprintf(stderr, "%s: under an external launcher each process is one rank: -t and -g must be 1\n",
            program.c_str());
    return 2;
  }
  if (int rc = checkDeviceFlag(o.device, program.c_str())) return rc;
  // One rank per process: the watchdog starts in the rank's own process.
  auto body = [&](const char* mode) {
    return [&o, &spec, &program, mode](attnComm_t comm) {
      watchdogStart(o.timeoutSec, program.c_str());
      const int rc = int(runRank(o, spec, comm, program, mode));
      watchdogStop();
      return rc;
    };
  };
  int rc;
  if (o.procs) {
    rc = launchProcesses(o.procs, body("processes"), o.device);
  } else if (external) {
    rc = launchExternal(body("external"), o.device);
  } else {
    watchdogStart(o.timeoutSec, program.c_str());
    rc = launchThreadSlots(
        o.nthreads, o.ngpus, o.parallelInit != 0,
        [&](int thread, const std::vector<attnComm_t>& comms) {
          return int(runThread(o, spec, comms, thread, program, "threads"));
        },
        o.device);
    watchdogStop();
  }
  if (rc)
    fprintf(stderr, "%s: %s\n", program.c_str(),
            watchdogFired() ? "timed out (-T)" : rc == kRankWrong ? "wrong results" : "failed");
  return rc;
}

}  // namespace attnperf
