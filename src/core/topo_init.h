// The topology step of communicator init (called from commInit): builds the
// fabric model from every rank's local view, applies ATTN_TOPO_FILE, sets
// the proximity order, and after connection optionally probes the tiers
// (ATTN_TOPO_PROBE=1), dumps the model (ATTN_TOPO_DUMP_FILE) and logs it.
#pragma once

#include <cstdint>

#include "attncomm.h"

struct attnComm;

namespace attn {

// After the RankCard all-gather (comm->peers filled), before transports
// connect. Collective over the bootstrap. `transportMask`: transports all
// ranks allow (for the default tier figures).
attnResult_t topoBuild(attnComm* comm, uint32_t transportMask);
// After the engine is attached. Collective (the probe and its broadcast).
attnResult_t topoFinish(attnComm* comm);
// Measures each tier between one representative pair (src/core/topo_probe.cc).
attnResult_t topoProbe(attnComm* comm);

}  // namespace attn
