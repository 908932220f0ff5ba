// The shared secret of attnCommInitFromEnv, from ATTN_SECRET (32 hex digits)
// or ATTN_SECRET_FILE (a file only its owner can read holding them). A
// secret file is the better choice: the environment of a process is visible
// to other processes of the same user (/proc/<pid>/environ) and often ends
// up in job logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attncomm.h"

namespace attn {

// Largest secret file read: 32 hex digits and some whitespace fit many times.
constexpr size_t kMaxSecretFileBytes = 4096;

// 32 hex digits, with whitespace around them and nothing else. Pure.
bool parseSecretHex(const char* text, size_t len, uint8_t secret[16]);

// Reads `path`: a regular file owned by the calling user, no access for
// group or others, at most kMaxSecretFileBytes, holding parseSecretHex text.
// Errors name the path (and the mode when that is the reason).
attnResult_t readSecretFile(const std::string& path, uint8_t secret[16]);

// ATTN_SECRET and / or ATTN_SECRET_FILE (both set: they must agree).
// *found = false, and attnSuccess, when neither is set.
attnResult_t readConfiguredSecret(uint8_t secret[16], bool* found);

}  // namespace attn
