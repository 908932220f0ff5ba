#include "src/core/topo_settings.h"

#include "src/core/settings.h"
#include "topology/host_identity.h"

namespace attn {

DiscoveryOptions discoveryOptionsFromEnv() {
  DiscoveryOptions o;
  // ATTN_NCCL_TOPO_FILE=none ignores an NCCL_TOPO_FILE meant for NCCL only.
  if (auto f = settingString(Setting::kNcclTopoFile)) {
    if (*f != "none") o.ncclTopoFile = *f, o.ncclTopoVar = settingName(Setting::kNcclTopoFile);
  } else if (auto n = settingString(Setting::kNcclTopoFileNccl)) {
    o.ncclTopoFile = *n, o.ncclTopoVar = settingName(Setting::kNcclTopoFileNccl);
  }
  o.hwlocXmlFile = settingString(Setting::kHwlocXmlFile).value_or("");
  o.hwlocThisSystem = settingString(Setting::kHwlocThisSystem).value_or("0") != "0";
  return o;
}

std::string thisHostIdentity() { return hostIdentity(settingString(Setting::kHostId).value_or("")); }
std::string thisRackIdentity() { return rackIdentity(settingString(Setting::kRackId).value_or("")); }

}  // namespace attn
