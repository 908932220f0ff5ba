// attnLevelAttention's algorithm (level_alltoall.cc) and what it is given.
// The plan and the exchange are shared by the host algorithm and the device
// one (src/attn/device/level_alltoall_device.cc), which differ only in how a
// block is packed and folded.
#pragma once

#include <functional>
#include <vector>

#include "src/attn/attn_call.h"
#include "src/attn/level_routes.h"
#include "src/attn/level_select.h"

namespace attn {

struct LevelDrop {
  float keep[4] = {1, 1, 1, 1};      // by Tier (topology/fabric_model.h)
  const float* importance = nullptr;  // [kv rows] or NULL (every keep 1); where the tensors are
};

// Who sends what to whom in one call, the same on every backend.
struct LevelPlan {
  LevelRoutes routes;
  std::vector<int> tierOf;          // by peer
  std::vector<int> sendTo;          // first hops of our tree, nearest first
  std::vector<KeptRows> toPeer;     // by first hop: our key rows it gets
  struct Incoming {
    int from;         // the peer it comes from (its origin or a relay)
    size_t capacity;  // bytes to post for it
  };
  std::vector<Incoming> in;         // in the order each peer sends them
  size_t forwards = 0;              // blocks we relay
};

// Collective: every rank's visible positions are all-gathered.
attnResult_t planLevelExchange(AttnCall& c, const LevelDrop& drop, LevelPlan* plan);

// What a backend does with the blocks.
struct LevelBackend {
  // Where incoming block i lands (room for plan.in[i].capacity bytes, host
  // memory the transports take); asked once per block before any arrives.
  std::function<char*(size_t i)> landing;
  // Folds this rank's own keys; called once the blocks are on their way.
  std::function<attnResult_t()> foldOwn;
  // Folds incoming block i (viewed at `data`, `bytes` long), which is being
  // relayed to others when `relayed` (its memory is still being sent).
  std::function<attnResult_t(size_t i, const BlockView& block, const char* data, size_t bytes, bool relayed)>
      fold;
};

// Sends blocks[p] (packed by the backend, plan.toPeer[p]'s rows) to each
// p of plan.sendTo, receives, relays and folds every other rank's block.
attnResult_t exchangeLevelBlocks(AttnCall& c, const LevelPlan& plan, const std::vector<const char*>& blocks,
                                 const LevelBackend& backend);

attnResult_t runLevelAllToAll(AttnCall& c, const LevelDrop& drop);

}  // namespace attn
