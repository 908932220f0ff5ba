// attnLevelAttention's algorithm (level_alltoall.cc) and what it is given.
#pragma once

#include "src/attn/attn_call.h"

namespace attn {

struct LevelDrop {
  float keep[4] = {1, 1, 1, 1};      // by Tier (topology/fabric_model.h)
  const float* importance = nullptr;  // [kv rows] or NULL (every keep 1)
};

attnResult_t runLevelAllToAll(AttnCall& c, const LevelDrop& drop);

}  // namespace attn
