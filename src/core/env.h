// Parsing of environment variables by name: the implementation under
// src/core/settings.h. Library code reads a variable through its Setting
// (settings.h), never through these; tests/test_settings.cc fails on a call
// outside the table's own files.
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
