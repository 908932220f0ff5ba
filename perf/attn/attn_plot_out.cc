#include "perf/attn/attn_plot_out.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "perf/plot.h"

namespace attnperf {

PlotOutput::PlotOutput(AttnOptions* o, AttnProgram p) : o_(o), prog_(programName(p)) {
  if (o->plot.empty() || !o->json.empty()) return;
  const char* dir = getenv("TMPDIR");
  std::string name = std::string(dir && *dir ? dir : "/tmp") + "/" + prog_ + "-XXXXXX.json";
  const int fd = mkstemps(name.data(), 5);
  if (fd < 0) {
    fprintf(stderr, "%s: --plot: cannot make a temporary JSON file in %s (give -J FILE)\n", prog_,
            dir && *dir ? dir : "/tmp");
    ok_ = false;
    return;
  }
  close(fd);
  temp_ = name;
  o->json = name;
}

PlotOutput::~PlotOutput() {
  if (!temp_.empty()) unlink(temp_.c_str());
}

int PlotOutput::draw() const {
  if (o_->plot.empty()) return 0;
  std::string why;
  if (writePlot(o_->json, o_->plot, &why)) {
    printf("# plot: %s\n", o_->plot.c_str());
    fflush(stdout);
    return 0;
  }
  fprintf(stderr, "%s: --plot %s: %s\n", prog_, o_->plot.c_str(), why.c_str());
  return 1;
}

}  // namespace attnperf
