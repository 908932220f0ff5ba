// A PNG of a perf binary's JSON, drawn by perf/plot_perf.py (matplotlib) in
// a child python3: busbw against size for the collectives, time per mode
// for the attention binaries. The script is the source tree's, or
// $ATTN_PERF_PLOT_SCRIPT.
#pragma once

#include <string>

namespace attnperf {

// Runs `python3 <script> <jsonPath> -o <pngPath>` (no shell). False with a
// one-line reason in *why: python3 missing, matplotlib missing, the script
// failing (its last line of stderr).
bool writePlot(const std::string& jsonPath, const std::string& pngPath, std::string* why);

}  // namespace attnperf
