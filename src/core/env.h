// Typed access to ATTN_* environment variables. Every variable read here is
// listed in the README's table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace attn {

std::optional<std::string> envString(const char* name);
// Integer value; `fallback` when unset. A malformed value logs a WARN and
// yields `fallback`.
int64_t envInt(const char* name, int64_t fallback);
bool envBool(const char* name, bool fallback);

}  // namespace attn
