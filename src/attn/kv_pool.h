// A rank's pool of fixed-size KV blocks for the distributed KV cache
// (Infinite-LLM DistAttention): the memory, the free list, the requests this
// rank owns (where each of their blocks lives) and the blocks it holds for
// peers. Local bookkeeping only; the collectives that move blocks and ship
// queries are kv_migrate.cc and kv_attention.cc.
//
// Memory is three arrays indexed by slot (K, V, positions), so the keys of
// consecutive slots are contiguous and one kernel call covers a run of them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "attncomm.h"

struct attnComm;

namespace attn {

// One block of an own request, in sequence order.
struct KvBlockLoc {
  int holder = -1;     // the rank whose pool holds it
  int64_t slot = -1;   // its slot, when the holder is this rank
  int32_t tokens = 0;  // filled tokens (only the last block may be partial)
};

struct KvOwnRequest {
  std::vector<KvBlockLoc> blocks;
  int64_t tokens = 0;
  int32_t lastPos = 0;  // position of the last token (valid when tokens > 0)
};

// A block held for a peer: its index in the owner's request and our slot.
struct KvLentBlock {
  int64_t index;
  int64_t slot;
};

using KvReqKey = std::pair<int, int64_t>;  // (owner rank, request id)

class KvPool {
 public:
  KvPool(attnComm* comm, const attnKvPoolConfig_t& cfg);
  attnResult_t allocate();

  attnComm* comm() const { return comm_; }
  const attnKvPoolConfig_t& config() const { return cfg_; }
  int rank() const;
  int nranks() const;
  size_t rowBytes() const { return rowBytes_; }  // one token's K (or V)
  size_t blockBytes() const { return rowBytes_ * size_t(cfg_.block_tokens); }

  char* k(int64_t slot) { return k_.get() + size_t(slot) * blockBytes(); }
  char* v(int64_t slot) { return v_.get() + size_t(slot) * blockBytes(); }
  int32_t* pos(int64_t slot) { return pos_.get() + size_t(slot) * size_t(cfg_.block_tokens); }
  const char* kBase() const { return k_.get(); }
  const char* vBase() const { return v_.get(); }
  const int32_t* posBase() const { return pos_.get(); }

  int64_t freeBlocks() const { return int64_t(free_.size()); }
  int64_t takeSlot();  // caller checked freeBlocks() > 0
  void giveSlot(int64_t slot) { free_.push_back(slot); }

  attnResult_t append(int64_t req, const void* k, const void* v, const int32_t* pos, int n);
  attnResult_t release(int64_t req);

  // The blocks of `r` this rank may lend out: full, here, not the last one
  // (appends go there), lowest index first.
  std::vector<int64_t> movableOwn(const KvOwnRequest& r) const;

  attnKvPoolStats_t stats() const;

  // The releases owed to `peer`, written to a payload; forgotten only once
  // every peer has them (a call that fails before its exchange completes
  // sends them again next time). And those a peer sent, applied (its blocks
  // here are freed).
  void writeReleases(int peer, class WireOut& out) const;
  void releasesDelivered();
  attnResult_t readReleases(int peer, class WireIn& in);

  std::map<int64_t, KvOwnRequest> own;
  std::map<KvReqKey, std::vector<KvLentBlock>> lentIn;
  // Per peer: own requests released while some of their blocks were there;
  // told to that peer in the next collective call on the pool.
  std::vector<std::vector<int64_t>> releasedAt;

 private:
  attnComm* comm_;
  attnKvPoolConfig_t cfg_;
  size_t rowBytes_ = 0;
  std::unique_ptr<char[]> k_, v_;
  std::unique_ptr<int32_t[]> pos_;
  std::vector<int64_t> free_;  // a stack: the lowest slots are taken first
};

}  // namespace attn
