#include "src/attn/attn_config.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "src/core/error.h"

namespace attn {
namespace {

// The fields every versioned config has (0.1's, after the header).
constexpr size_t kMinSize = offsetof(attnAttnConfig_t, causal) + sizeof(int);

}  // namespace

attnResult_t readAttnConfig(const attnAttnConfig_t* user, attnAttnConfig_t* out) {
  ATTN_REQUIRE(user != nullptr, "attention config is NULL");
  ATTN_REQUIRE(user->magic == ATTN_ATTN_CONFIG_MAGIC,
               "attnAttnConfig_t not initialised (magic 0x%x): start from ATTN_ATTN_CONFIG_INITIALIZER or "
               "ATTN_ATTN_CONFIG(...)",
               user->magic);
  ATTN_REQUIRE(user->size >= kMinSize && user->size <= (size_t(1) << 16),
               "attnAttnConfig_t size %zu is not one this library knows (at least %zu)", user->size, kMinSize);
  *out = ATTN_ATTN_CONFIG_INITIALIZER;
  std::memcpy(out, user, std::min(user->size, sizeof(*out)));
  out->size = sizeof(*out);
  ATTN_REQUIRE(out->lse_base == attnLseNatural || out->lse_base == attnLseBase2,
               "cfg.lse_base %d is not attnLseNatural or attnLseBase2", int(out->lse_base));
  ATTN_REQUIRE(out->lse_layout == attnLseTokenMajor || out->lse_layout == attnLseHeadMajor,
               "cfg.lse_layout %d is not attnLseTokenMajor or attnLseHeadMajor", int(out->lse_layout));
  ATTN_REQUIRE(out->window_left >= -1 && out->window_right >= -1,
               "cfg.window_left %d / window_right %d: a window is a number of tokens >= 0, or -1 for none",
               out->window_left, out->window_right);
  ATTN_REQUIRE(std::isfinite(out->softcap) && out->softcap >= 0, "cfg.softcap %g must be finite and >= 0 (0: none)",
               double(out->softcap));
  // 0 (and every config older than 0.4): V has Q/K's head dim. From here
  // on head_dim_v is always the V head dim; checkConfig bounds it.
  ATTN_REQUIRE(out->head_dim_v >= 0, "cfg.head_dim_v %d must be >= 0 (0: head_dim)", out->head_dim_v);
  out->head_dim_v = attnValueDim(*out);
  return attnSuccess;
}

attnResult_t checkHostSinks(const attnAttnConfig_t& c) {
  if (c.sinks == nullptr) return attnSuccess;
  for (int h = 0; h < c.num_q_heads; ++h)
    ATTN_REQUIRE(std::isfinite(c.sinks[h]), "cfg.sinks[%d] = %g is not finite", h, double(c.sinks[h]));
  return attnSuccess;
}

attnAttnConfig_t attnConfigOf(const attnAttnConfig_t* user) {
  attnAttnConfig_t c;
  if (readAttnConfig(user, &c) != attnSuccess) c = ATTN_ATTN_CONFIG_INITIALIZER;  // callers checked it first
  return c;
}

void writeLse(const attnAttnConfig_t& c, const float* natural, float* lse, int64_t rows, int heads) {
  const size_t n = size_t(rows) * size_t(heads);
  const float scale = c.lse_base == attnLseBase2 ? 1.4426950408889634f : 1.0f;  // log2(e)
  if (c.lse_layout == attnLseTokenMajor) {
    for (size_t i = 0; i < n; ++i) lse[i] = natural[i] * scale;
    return;
  }
  // Head-major: through a copy when the two are one buffer.
  std::vector<float> copy;
  if (natural == lse) {
    copy.assign(natural, natural + n);
    natural = copy.data();
  }
  for (int64_t t = 0; t < rows; ++t)
    for (int h = 0; h < heads; ++h) lse[size_t(h) * size_t(rows) + size_t(t)] = natural[size_t(t) * heads + h] * scale;
}

}  // namespace attn
