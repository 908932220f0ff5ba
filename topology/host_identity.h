// Who and where this process is: host identity (the caller's setting, else
// hostname plus boot id, so containers on one kernel count as one host) and
// hashing. The settings come from the caller (src/core/topo_settings.h reads
// ATTN_HOSTID / ATTN_RACKID); "" means unset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace attn {

std::string hostIdentity(const std::string& configured);
// Rack identity: `configured`, else "" (unknown: every host its own rack tier).
std::string rackIdentity(const std::string& configured);
std::string shortHostName();
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace attn
