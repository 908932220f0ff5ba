// The library's settings for topology/ (which reads no environment): where
// discovery may look besides this machine, and who this host and rack are.
#pragma once

#include <string>

#include "topology/local_view.h"

namespace attn {

// ATTN_NCCL_TOPO_FILE (=none ignores an NCCL_TOPO_FILE meant for NCCL
// only), else NCCL_TOPO_FILE; HWLOC_XMLFILE, HWLOC_THISSYSTEM.
DiscoveryOptions discoveryOptionsFromEnv();
// hostIdentity / rackIdentity with ATTN_HOSTID / ATTN_RACKID.
std::string thisHostIdentity();
std::string thisRackIdentity();

}  // namespace attn
