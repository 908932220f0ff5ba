// --plot FILE.png of the attention perf binaries: the picture is drawn from
// the JSON, so without -J the JSON goes to a temporary file first.
#pragma once

#include <string>

#include "perf/attn/attn_cli.h"

namespace attnperf {

class PlotOutput {
 public:
  // Before the ranks start: points o->json at a temporary file when
  // --plot is given without -J (forked ranks inherit the name).
  PlotOutput(AttnOptions* o, AttnProgram p);
  ~PlotOutput();  // removes the temporary JSON
  PlotOutput(const PlotOutput&) = delete;
  PlotOutput& operator=(const PlotOutput&) = delete;

  // On rank 0 once its JSON is written: draws the PNG; 0, or 1 with one
  // line on stderr saying why not.
  int draw() const;
  bool ok() const { return ok_; }  // false: no temporary file could be made

 private:
  const AttnOptions* o_;
  const char* prog_;
  std::string temp_;
  bool ok_ = true;
};

}  // namespace attnperf
