// The fabric model for people: a text table (fabric_text.cc) and a Graphviz
// DOT picture (fabric_dot.cc): racks and hosts as nested boxes, ranks as
// nodes, the proximity ring as edges coloured by tier.
#pragma once

#include <string>

#include "topology/fabric_model.h"

namespace attn {

std::string fabricToText(const FabricModel& m);
std::string fabricAsGraphviz(const FabricModel& m);
// "12.5 GB/s", "3.0 us"
std::string formatBandwidth(double bytesPerSecond);
std::string formatLatency(double seconds);

}  // namespace attn
