// Who and where this process is: host identity (ATTN_HOSTID, else hostname
// plus boot id, so containers on one kernel count as one host) and hashing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace attn {

std::string hostIdentity();
// Rack identity: ATTN_RACKID, else "" (unknown: every host its own rack tier).
std::string rackIdentity();
std::string shortHostName();
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace attn
