// attnCommShrink (like ncclCommShrink): the ranks not excluded form a new
// communicator without help from the excluded ones, so it works after they
// died or hung. It never touches the parent's data connections (they may be
// broken); the survivors meet over the parent's bootstrap sockets, which
// stay up between any two live ranks:
//
//   1. every survivor sends the leader (the lowest survivor) a digest of its
//      exclude list;
//   2. the leader checks they all match, starts a fresh bootstrap root and
//      sends every survivor its unique id (or the rank whose list differs);
//   3. the survivors join the new communicator, ranked in the old order.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "src/core/api_call.h"
#include "src/core/log.h"
#include "src/device/device_route.h"

namespace attn {
attnResult_t newCommInternal(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                             const attnConfig_t* config, const CommConfig* inherit);
}  // namespace attn

using namespace attn;

namespace {

// Bootstrap user tags at the top of the tag space, one pair per shrink of
// the same parent (the shm transport and the topology use other ranges).
constexpr uint32_t kShrinkTagBase = 0xA7500000u;

struct ShrinkRequest {
  uint64_t digest;  // of the sorted exclude list
  int32_t count;
  int32_t rank;     // the sender's old rank (a check)
};

struct ShrinkReply {
  int32_t ok;          // 1: join `id`; 0: `mismatchRank` passed another list
  int32_t mismatchRank;
  attnUniqueId id;
};

uint64_t listDigest(const std::vector<int>& sorted) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int r : sorted) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(r) >> (8 * b));
      h *= 1099511628211ull;
    }
  }
  return h;
}

attnResult_t checkExcludeList(const attnComm* comm, const int* excludeRanks, int excludeCount,
                              std::vector<int>* sorted) {
  const int n = comm->nranks;
  ATTN_REQUIRE(excludeCount >= 0, "excludeCount is negative (%d)", excludeCount);
  ATTN_REQUIRE(excludeRanks != nullptr || excludeCount == 0,
               "excludeRanks is NULL with excludeCount %d", excludeCount);
  ATTN_REQUIRE(excludeCount < n, "excludeCount %d leaves no rank of %d", excludeCount, n);
  sorted->assign(excludeRanks, excludeRanks + excludeCount);
  for (int r : *sorted)
    ATTN_REQUIRE(r >= 0 && r < n, "excluded rank %d is outside [0, %d)", r, n);
  std::sort(sorted->begin(), sorted->end());
  for (size_t i = 1; i < sorted->size(); ++i)
    ATTN_REQUIRE((*sorted)[i] != (*sorted)[i - 1], "rank %d is excluded twice", (*sorted)[i]);
  ATTN_REQUIRE(!std::binary_search(sorted->begin(), sorted->end(), comm->rank),
               "rank %d is in its own exclude list (excluded ranks do not call attnCommShrink)",
               comm->rank);
  return attnSuccess;
}

// Ends the parent's operations in flight and waits until every other API
// call on it has left (ours is counted too). Work a device communicator's
// streams have queued on its proxy waits in the same engine, so it ends
// too, and the streams move on.
void stopParentOperations(attnComm* comm) {
  comm->engine->stopOperations();
  while (comm->activeCalls.load(std::memory_order_acquire) > 1)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (comm->executor && !onDeviceProxy(comm)) comm->executor->drain();
  comm->engine->breakWith(attnRemoteError, "operations stopped by attnCommShrink (ATTN_SHRINK_ABORT)");
}

// Steps 1 and 2 above. On return every survivor holds the same id, or all
// of them fail.
attnResult_t agreeOnNewId(attnComm* comm, const std::vector<int>& survivors,
                          const std::vector<int>& excluded, uint32_t seq, attnUniqueId* id) {
  Bootstrap& boot = *comm->bootstrap;
  const uint32_t tagRequest = kShrinkTagBase + 2 * seq, tagReply = tagRequest + 1;
  const int leader = survivors.front();
  const ShrinkRequest mine{listDigest(excluded), static_cast<int32_t>(excluded.size()), comm->rank};
  ShrinkReply reply{};
  if (comm->rank != leader) {
    ATTN_CHECK(boot.send(leader, tagRequest, &mine, sizeof(mine)));
    ATTN_CHECK(boot.recv(leader, tagReply, &reply, sizeof(reply)));
  } else {
    reply.ok = 1;
    reply.mismatchRank = -1;
    for (size_t i = 1; i < survivors.size(); ++i) {
      ShrinkRequest theirs{};
      ATTN_CHECK(boot.recv(survivors[i], tagRequest, &theirs, sizeof(theirs)));
      if (reply.ok && (theirs.digest != mine.digest || theirs.count != mine.count ||
                       theirs.rank != survivors[i])) {
        reply.ok = 0;
        reply.mismatchRank = survivors[i];
      }
    }
    if (reply.ok) ATTN_CHECK(bootstrapCreateRoot(&reply.id));
    for (size_t i = 1; i < survivors.size(); ++i)
      ATTN_CHECK(boot.send(survivors[i], tagReply, &reply, sizeof(reply)));
  }
  if (!reply.ok)
    return setError(attnInvalidUsage,
                    "attnCommShrink: the survivors passed different exclude lists (rank %d's "
                    "differs from rank %d's)", reply.mismatchRank, leader);
  *id = reply.id;
  return attnSuccess;
}

attnResult_t commShrink(attnComm* comm, const int* excludeRanks, int excludeCount,
                        attnComm_t* newcomm, attnConfig_t* config, int flags) {
  ATTN_REQUIRE(newcomm != nullptr, "newcomm is NULL");
  *newcomm = nullptr;
  ATTN_REQUIRE(comm != nullptr, "communicator is NULL");
  ATTN_REQUIRE(flags == ATTN_SHRINK_DEFAULT || flags == ATTN_SHRINK_ABORT,
               "unknown shrinkFlags 0x%x (ATTN_SHRINK_DEFAULT or ATTN_SHRINK_ABORT)",
               static_cast<unsigned>(flags));
  if (!comm->ready.load(std::memory_order_acquire))
    return setError(attnInvalidUsage, "attnCommShrink on a communicator that is not initialised");
  if (comm->abortFlag.load()) return setError(attnInvalidUsage, "communicator was aborted");
  if (inGroup()) return setError(attnInvalidUsage, "attnCommShrink inside a group");
  std::vector<int> excluded;
  ATTN_CHECK(checkExcludeList(comm, excludeRanks, excludeCount, &excluded));

  // A broken parent is expected here: only its bootstrap is used.
  if (flags & ATTN_SHRINK_ABORT) {
    stopParentOperations(comm);
  } else {
    if (!comm->config.blocking && !onDeviceProxy(comm)) comm->executor->drain();
    deviceWaitIdle(comm);
  }

  std::vector<int> survivors;
  for (int r = 0; r < comm->nranks; ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) survivors.push_back(r);
  const uint32_t seq = comm->shrinkSeq++;
  attnUniqueId id;
  ATTN_CHECK(agreeOnNewId(comm, survivors, excluded, seq, &id));
  const int newRank =
      static_cast<int>(std::find(survivors.begin(), survivors.end(), comm->rank) - survivors.begin());
  ATTN_INFO(kLogInit, "attnCommShrink: %zu of %d ranks remain; rank %d becomes rank %d",
            survivors.size(), comm->nranks, comm->rank, newRank);
  return newCommInternal(newcomm, static_cast<int>(survivors.size()), id, newRank, config,
                         config ? nullptr : &comm->config);
}

}  // namespace

extern "C" attnResult_t attnCommShrink(attnComm_t comm, const int* excludeRanks, int excludeCount,
                                       attnComm_t* newcomm, attnConfig_t* config,
                                       int shrinkFlags) {
  ApiCall call(comm);
  return call.finish(
      runGuarded([&] { return commShrink(comm, excludeRanks, excludeCount, newcomm, config, shrinkFlags); }));
}
