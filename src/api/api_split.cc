// attnCommSplit: ranks of one color form a new communicator, ordered by key
// then by old rank. The lowest member of each color creates the new unique id
// and it reaches the others through an all-gather on the parent.
#include <algorithm>
#include <cstring>
#include <vector>

#include "src/coll/coll.h"
#include "src/core/api_call.h"
#include "src/device/backends/nccl/nccl_bridge.h"

namespace attn {
attnResult_t newCommInternal(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                             const attnConfig_t* config, const CommConfig* inherit);
}

using namespace attn;

namespace {
struct SplitCard {
  int32_t color;
  int32_t ncclOk;  // an NCCL-backed parent, and this rank's child may stay on NCCL's device
  int64_t key;
  attnUniqueId id;  // filled by the leader of each color
};
}  // namespace

namespace attn {
// attnCommSplit with a 64-bit key (attnCommSplitType orders by the user's
// key, then by proximity). The caller holds the ApiCall.
attnResult_t commSplit(attnComm* comm, int color, int64_t key, attnComm_t* newcomm,
                       attnConfig_t* config);
}  // namespace attn

extern "C" attnResult_t attnCommSplit(attnComm_t comm, int color, int key, attnComm_t* newcomm,
                                      attnConfig_t* config) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    if (newcomm) *newcomm = nullptr;
    ATTN_CHECK(call.finish(call.check()));
    return call.finish(commSplit(comm, color, key, newcomm, config));
  });
}

attnResult_t attn::commSplit(attnComm* comm, int color, int64_t key, attnComm_t* newcomm,
                             attnConfig_t* config) {
  if (newcomm == nullptr) return setError(attnInvalidArgument, "newcomm is NULL");
  *newcomm = nullptr;
  ATTN_CHECK(checkCommUsable(comm));
  if (color < 0 && color != ATTN_SPLIT_NOCOLOR)
    return setError(attnInvalidArgument, "color must be >= 0 or ATTN_SPLIT_NOCOLOR, got %d",
                    color);
  if (inGroup()) return setError(attnInvalidUsage, "attnCommSplit inside a group");
  ATTN_CHECK(waitForQueuedOperations(comm));
  const int n = comm->nranks, me = comm->rank;
  Engine& e = *comm->engine;
  Ring ring = Ring::identity(me, n);

  // Round 1: colors and keys.
  std::vector<SplitCard> cards(n);
  std::memset(cards.data(), 0, sizeof(SplitCard) * n);
  cards[me].color = color;
  cards[me].key = key;
  const bool nccl = ncclBacked(comm);
  cards[me].ncclOk = nccl && (!config || config->device == ATTN_CONFIG_UNDEF_INT ||
                              config->device == comm->config.device);
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * sizeof(SplitCard), sizeof(SplitCard)};
  ATTN_CHECK(ringAllGatherv(e, ring, reinterpret_cast<char*>(cards.data()), blocks,
                           chunkBytes(1)));
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (color != ATTN_SPLIT_NOCOLOR && cards[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return cards[a].key != cards[b].key ? cards[a].key < cards[b].key : a < b;
  });
  const bool leader = !members.empty() && *std::min_element(members.begin(), members.end()) == me;

  // Round 2: each color's leader publishes the new id.
  if (leader) ATTN_CHECK(bootstrapCreateRoot(&cards[me].id));
  ATTN_CHECK(ringAllGatherv(e, ring, reinterpret_cast<char*>(cards.data()), blocks,
                           chunkBytes(1)));
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  // An NCCL-backed parent: every rank takes part in NCCL's split; a color
  // stays on NCCL when all its members may (the same answer on each).
  NcclBridgePtr ncclChild;
  if (nccl) {
    const bool colorOnNccl = color != ATTN_SPLIT_NOCOLOR &&
                             std::all_of(members.begin(), members.end(), [&](int r) { return cards[r].ncclOk != 0; });
    ATTN_CHECK(ncclSplitChild(comm, colorOnNccl ? color : ATTN_SPLIT_NOCOLOR, newRank, &ncclChild));
  }
  if (color == ATTN_SPLIT_NOCOLOR) return attnSuccess;
  const int leaderRank = *std::min_element(members.begin(), members.end());
  const attnResult_t r = newCommInternal(newcomm, static_cast<int>(members.size()), cards[leaderRank].id, newRank,
                                         config, config ? nullptr : &comm->config);
  if (*newcomm) ncclAdopt(*newcomm, std::move(ncclChild));  // also while a non-blocking one is still joining
  return r;
}
