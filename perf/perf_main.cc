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

namespace attnperf {

int perfMain(int argc, char** argv, const CollSpec& spec) {
  Options o;
  int code = 0;
  if (!parseOptions(argc, argv, &o, &code)) return code;
  // -A / -T travel as environment so forked and externally launched ranks
  // see them too; set before any communicator exists.
  if (!o.algo.empty()) setenv("ATTN_ALGO", o.algo.c_str(), 1);
  if (!o.transports.empty()) setenv("ATTN_TRANSPORT", o.transports.c_str(), 1);

  const char* slash = strrchr(argv[0], '/');
  const std::string program = slash ? slash + 1 : argv[0];
  auto body = [&](const char* mode) {
    return [&o, &spec, &program, mode](attnComm_t comm) {
      return int(runRank(o, spec, comm, program, mode));
    };
  };
  if (int rc = checkDeviceFlag(o.device, program.c_str())) return rc;
  int rc;
  if (o.procs) rc = launchProcesses(o.procs, body("processes"), o.device);
  else if (o.threads || !launchedExternally())
    rc = launchThreads(o.threads ? o.threads : 2, body("threads"), o.device);
  else rc = launchExternal(body("external"), o.device);
  if (rc) fprintf(stderr, "%s: %s\n", program.c_str(),
                  rc == kRankWrong ? "wrong results" : "failed");
  return rc;
}

}  // namespace attnperf
