// attnCommShrink (like ncclCommShrink): the ranks not excluded form a new
// communicator without help from the excluded ones, so it works after they
// died or hung. It never touches the parent's data connections (they may be
// broken); the survivors meet over the parent's bootstrap sockets, which
// stay up between any two live ranks:
//
//   1. the survivors agree on a fresh unique id (shrink_agreement.h): the
//      leader (the lowest survivor) checks that every survivor passed its
//      list, starts a bootstrap root and sends them the id; survivors whose
//      lists differ all fail fast;
//   2. they join the new communicator, ranked in the old order.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "src/core/api_call.h"
#include "src/core/log.h"
#include "src/core/shrink_agreement.h"
#include "src/device/device_route.h"
#include "src/device/backends/nccl/nccl_bridge.h"

namespace attn {
attnResult_t newCommInternal(attnComm** out, int nranks, const attnUniqueId& id, int rank,
                             const attnConfig_t* config, const CommConfig* inherit);
}  // namespace attn

using namespace attn;

namespace {

// Bootstrap user tags at the top of the tag space, one per shrink of the
// same parent (the shm transport and the topology use other ranges).
constexpr uint32_t kShrinkTagBase = 0xA7500000u;

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
  if (comm->executor) comm->executor->drain();
  comm->engine->breakWith(attnRemoteError, "operations stopped by attnCommShrink (ATTN_SHRINK_ABORT)");
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
  const bool nccl = ncclBacked(comm);
  if (nccl && config && config->device != ATTN_CONFIG_UNDEF_INT && config->device != comm->config.device)
    return setError(attnInvalidArgument,
                    "config->device is %d, but a communicator shrunk from an NCCL-backed one stays on NCCL's "
                    "device %d", config->device, comm->config.device);

  // A broken parent is expected here: only its bootstrap is used.
  if (flags & ATTN_SHRINK_ABORT) {
    stopParentOperations(comm);
  } else {
    if (!comm->config.blocking) comm->executor->drain();
    deviceWaitIdle(comm);
  }

  std::vector<int> survivors;
  for (int r = 0; r < comm->nranks; ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) survivors.push_back(r);
  const uint32_t seq = comm->shrinkSeq++;
  attnUniqueId id;
  ATTN_CHECK(agreeOnShrinkId(*comm->bootstrap, comm->rank, comm->nranks, excluded, kShrinkTagBase + seq, &id));
  const int newRank =
      static_cast<int>(std::find(survivors.begin(), survivors.end(), comm->rank) - survivors.begin());
  ATTN_INFO(kLogInit, "attnCommShrink: %zu of %d ranks remain; rank %d becomes rank %d",
            survivors.size(), comm->nranks, comm->rank, newRank);
  // An NCCL-backed parent: the survivors shrink its NCCL communicator too
  // (every survivor has the id: all of them get here).
  NcclBridgePtr ncclChild;
  if (nccl) ATTN_CHECK(ncclShrinkChild(comm, excluded, (flags & ATTN_SHRINK_ABORT) != 0, &ncclChild));
  const attnResult_t r = newCommInternal(newcomm, static_cast<int>(survivors.size()), id, newRank, config,
                                         config ? nullptr : &comm->config);
  if (*newcomm) {  // also while a non-blocking one is still joining
    (*newcomm)->shrunkFrom = comm;
    (*newcomm)->parentRanks = survivors;
    ncclAdopt(*newcomm, std::move(ncclChild));
  }
  return r;
}

}  // namespace

extern "C" attnResult_t attnCommShrink(attnComm_t comm, const int* excludeRanks, int excludeCount,
                                       attnComm_t* newcomm, attnConfig_t* config,
                                       int shrinkFlags) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    if (newcomm) *newcomm = nullptr;
    ATTN_CHECK(call.finish(call.checkHandle()));  // a broken one is what it is for
    return call.finish(commShrink(comm, excludeRanks, excludeCount, newcomm, config, shrinkFlags));
  });
}
