// The versioned attention config (attnAttnConfig_t): what a caller's struct,
// perhaps compiled against an older header, means here; and the LSE
// conventions it names for every LSE the calls write.
#pragma once

#include <cstdint>

#include "attncomm.h"

namespace attn {

// The caller's config as this library's struct: fails unless it was
// started from ATTN_ATTN_CONFIG_INITIALIZER (magic, a size that holds at
// least the 0.1 fields); fields past the caller's size take their
// defaults. Checks the LSE convention's values; the shape is checked by
// checkConfig (plan_call.h).
attnResult_t readAttnConfig(const attnAttnConfig_t* user, attnAttnConfig_t* out);
// The same for a config readAttnConfig accepted before.
attnAttnConfig_t attnConfigOf(const attnAttnConfig_t* user);

// Natural log, token-major: what the algorithms compute.
inline bool lseIsNatural(const attnAttnConfig_t& c) {
  return c.lse_base == attnLseNatural && c.lse_layout == attnLseTokenMajor;
}
// Writes `natural` ([rows, heads], natural log) into `lse` in c's
// convention; the two may be the same buffer.
void writeLse(const attnAttnConfig_t& c, const float* natural, float* lse, int64_t rows, int heads);

}  // namespace attn
