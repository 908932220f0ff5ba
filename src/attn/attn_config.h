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
// checkConfig (plan_call.h). head_dim_v comes out set (0 becomes head_dim).
attnResult_t readAttnConfig(const attnAttnConfig_t* user, attnAttnConfig_t* out);
// The same for a config readAttnConfig accepted before.
attnAttnConfig_t attnConfigOf(const attnAttnConfig_t* user);

// The head dim of V and the outputs: head_dim_v, or head_dim where a config
// that readAttnConfig did not read leaves it 0.
inline int attnValueDim(const attnAttnConfig_t& c) { return c.head_dim_v > 0 ? c.head_dim_v : c.head_dim; }

// Whether a query sees only some keys by position (causal or a window):
// then the layout's positions are needed.
inline bool attnNeedsPositions(const attnAttnConfig_t& c) {
  return c.causal || c.window_left >= 0 || c.window_right >= 0;
}
// Whether the config asks the kernel for more than plain (causal) softmax
// attention: what an engine kernel registered before 0.3 cannot do.
inline bool attnHasWindowOrSoftcap(const attnAttnConfig_t& c) {
  return c.window_left >= 0 || c.window_right >= 0 || c.softcap != 0.0f;
}

// Sinks in host memory (a host communicator's): each finite.
attnResult_t checkHostSinks(const attnAttnConfig_t& c);

// Natural log, token-major: what the algorithms compute.
inline bool lseIsNatural(const attnAttnConfig_t& c) {
  return c.lse_base == attnLseNatural && c.lse_layout == attnLseTokenMajor;
}
// Writes `natural` ([rows, heads], natural log) into `lse` in c's
// convention; the two may be the same buffer.
void writeLse(const attnAttnConfig_t& c, const float* natural, float* lse, int64_t rows, int heads);

}  // namespace attn
