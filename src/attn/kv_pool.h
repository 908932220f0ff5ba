// A rank's pool of fixed-size KV blocks for the distributed KV cache
// (Infinite-LLM DistAttention): the memory, the free list, the requests this
// rank owns (where each of their blocks lives) and the blocks it holds for
// peers. Local bookkeeping only; the collectives that move blocks and ship
// queries are kv_migrate.cc and kv_attention.cc.
//
// Memory is three arrays indexed by slot (K, V, positions), so the keys of
// consecutive slots are contiguous and one kernel call covers a run of them.
// K and V are host memory or, on a device communicator, GPU memory
// (KvMemory); positions are kept on the host, where the books are, and a
// device pool mirrors them on the GPU: blocks whose positions changed are
// uploaded, together, before the next device computation reads them.
//
// Two views of the requests, because collectives may be queued (a device
// stream, a non-blocking communicator) while the caller goes on:
//  - the front: every local call made so far (append, release). The caller's
//    thread checks new calls against it, so their errors return at once
//    (an append captured into a CUDA graph enters it at each launch);
//  - the books (`own`, `lentIn`): what the collectives see. A collective
//    runs on the books as they were when it was enqueued: local calls made
//    after it wait in `pending_` until it has run.
// An append takes its slots and copies its tokens at once (into slots and
// rows no queued collective reads); only its entry in the books waits.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_wire.h"

struct attnComm;

namespace attn {

// One block of an own request, in sequence order.
struct KvBlockLoc {
  int holder = -1;     // the rank whose pool holds it
  int64_t slot = -1;   // its slot, when the holder is this rank
  int32_t tokens = 0;  // filled tokens (only the last block may be partial)
  // Its first and last token's positions (a request's increase): which
  // queries a sliding window lets see it. first > last: not known.
  int32_t firstPos = INT32_MAX, lastPos = INT32_MIN;
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

// Where a pool's K and V live: host memory (kv_pool.cc) or the GPU of a
// device communicator (src/attn/device/kv_device_memory.cc).
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  virtual char* k() = 0;
  virtual char* v() = 0;
  virtual bool onDevice() const = 0;
  // Copies a caller's bytes into pool memory: at once (host), or enqueued on
  // `stream` (device).
  virtual attnResult_t copyIn(char* dst, const void* src, size_t bytes, attnStream_t stream) = 0;
  // One call's copies are enqueued (device: remembered for destroy).
  virtual attnResult_t copiesDone(attnStream_t) { return attnSuccess; }
  // Whether `stream` is being captured into a CUDA graph (device only).
  virtual attnResult_t capturing(attnStream_t, bool* yes) {
    *yes = false;
    return attnSuccess;
  }
  // The pool's own stream, for copies made where no caller's stream is (a
  // graph's append, run on the proxy thread), and the wait for them.
  virtual attnStream_t ownStream() { return nullptr; }
  virtual attnResult_t waitOwnStream() { return attnSuccess; }
  // Device pools: the mirror of the pool's positions (by row) in device
  // memory; null on the host.
  virtual int32_t* positions() { return nullptr; }
};

// A local call waiting for queued collectives to run before it reaches the
// books.
struct KvLocalCall {
  uint64_t seq = 0;
  bool release = false;
  int64_t req = 0;
  int32_t tokens = 0;                 // append: tokens added
  int32_t lastPos = 0;                // append: the last one's position
  std::vector<int64_t> newSlots;      // append: blocks taken, in order
  std::vector<int32_t> pos;           // append: every token's position
};

class KvPool {
 public:
  KvPool(attnComm* comm, const attnKvPoolConfig_t& cfg);
  ~KvPool();
  attnResult_t allocate();

  attnComm* comm() const { return comm_; }
  const attnKvPoolConfig_t& config() const { return cfg_; }
  int rank() const;
  int nranks() const;
  size_t rowBytes() const { return rowBytes_; }  // one token's K (or V)
  size_t blockBytes() const { return rowBytes_ * size_t(cfg_.block_tokens); }
  bool onDevice() const { return mem_->onDevice(); }

  // K and V in the pool's memory (device pointers on a device pool).
  char* k(int64_t slot) { return mem_->k() + size_t(slot) * blockBytes(); }
  char* v(int64_t slot) { return mem_->v() + size_t(slot) * blockBytes(); }
  int32_t* pos(int64_t slot) { return pos_.get() + size_t(slot) * size_t(cfg_.block_tokens); }
  // Writes positions [at, at + n) of a slot (only rows no queued collective
  // reads); a device pool marks the block for its mirror.
  void writePositions(int64_t slot, int32_t at, const void* src, int32_t n);
  // Device pools: the mirror (null on the host), and the blocks whose
  // positions were written since the last call, taken: their slots, and
  // block_tokens positions each in `pos`. The device code uploads them
  // before a computation reads the mirror.
  int32_t* devicePositions() { return mem_->positions(); }
  void takeChangedPositions(std::vector<int32_t>* slots, std::vector<int32_t>* pos);
  // Marks them changed again (their upload failed).
  void positionsNotMirrored(const std::vector<int32_t>& slots);

  // The free list; safe from any thread.
  int64_t freeBlocks() const;
  // All n slots, or none (false) when fewer are free.
  bool takeSlots(int64_t n, std::vector<int64_t>* slots);
  void giveSlot(int64_t slot);

  // --- Local calls, on the caller's thread (front view). An append on a
  // stream that captures a CUDA graph is captured instead: each launch of
  // the graph runs it on the proxy thread, with k, v and pos as they are
  // then; its errors become the communicator's asynchronous error.
  attnResult_t append(int64_t req, const void* k, const void* v, const int32_t* pos, int n,
                      attnStream_t stream);
  attnResult_t release(int64_t req);
  // Whether `stream` is capturing a CUDA graph (device pools).
  attnResult_t capturing(attnStream_t stream, bool* yes) { return mem_->capturing(stream, yes); }
  // Makes `work` a node of the graph `stream` captures: each launch runs it
  // on the proxy thread while the pool lives. A launch after the pool was
  // destroyed runs nothing and fails, naming `what` (the communicator's
  // asynchronous error).
  using LaunchWork = std::function<attnResult_t(KvPool&)>;
  attnResult_t captureWork(attnStream_t stream, std::string what, LaunchWork work);
  bool owns(int64_t req) const {
    std::lock_guard<std::mutex> g(frontMu_);
    return front_.count(req) > 0;
  }
  attnKvPoolStats_t stats();
  attnResult_t placement(int64_t req, int64_t* holders, int64_t* tokens);

  // --- Collectives. enqueueCollective() at the call gives its place among
  // the local calls; startCollective() where it runs brings the books up to
  // it; endCollective() (run, failed or dropped) lets the later calls in.
  uint64_t enqueueCollective();
  void startCollective(uint64_t seq);
  void endCollective(uint64_t seq);
  // Returns once no collective is queued or running.
  void drain();

  // The blocks of `r` this rank may lend out: full, here, not the last one
  // (appends go there), lowest index first.
  std::vector<int64_t> movableOwn(const KvOwnRequest& r) const;

  // The releases owed to `peer`, written to a payload; forgotten only once
  // every peer has them (a call that fails before its exchange completes
  // sends them again next time). And those a peer sent, applied (its blocks
  // here are freed).
  void writeReleases(int peer, class WireOut& out) const;
  void releasesDelivered();
  void applyReleases(int peer, const std::vector<int64_t>& ids);
  // The most releases a peer may owe this pool: each names a request that
  // had a block here when it was released, and that block stays until the
  // release arrives; a list that one failed call delivered may come again.
  uint64_t releaseBound() const { return 2 * uint64_t(cfg_.capacity_blocks) + 1; }
  // The peer's requests with blocks here (what its queries may ask for).
  uint64_t requestsHeldFor(int peer) const;
  // What `peer` may send in `what` as far as the pool's books say: the
  // releases it may owe and the pool's layout; the call sets the rest.
  KvPeerLimits limitsFor(int peer, const char* what) const {
    KvPeerLimits lim;
    lim.peer = peer;
    lim.what = what;
    lim.maxReleases = releaseBound();
    lim.numKvHeads = cfg_.num_kv_heads;
    lim.headDim = cfg_.head_dim;
    lim.dtype = cfg_.dtype;
    return lim;
  }

  // After attnCommShrink (kv_shrink.cc), with no collective queued: moves
  // the pool to `shrunk`, whose rank r was rank parentRanks[r] of the
  // pool's communicator. Own requests with a block on an excluded rank are
  // released and appended to *lost; blocks held for excluded owners are
  // freed; the rest is renumbered.
  void moveToShrunk(attnComm* shrunk, const std::vector<int>& parentRanks, std::vector<int64_t>* lost);

  // The books. Collectives change them on the thread they run on, holding
  // booksMu (local readers may be on another thread); nothing else changes
  // them while a collective is queued.
  std::map<int64_t, KvOwnRequest> own;
  std::map<KvReqKey, std::vector<KvLentBlock>> lentIn;
  // Per peer: own requests released while some of their blocks were there;
  // told to that peer in the next collective call on the pool.
  std::vector<std::vector<int64_t>> releasedAt;
  // Every rank's capacity_blocks, as agreed at create (renumbered by a
  // shrink): what bounds the messages a peer may send this pool. allocate()
  // assumes every pool is the size of this one until create tells.
  std::vector<int64_t> peerCapacity;
  mutable std::mutex booksMu;

 private:
  struct FrontRequest {
    int64_t tokens = 0;
    int32_t lastPos = 0;
    int64_t lastSlot = -1;  // the last block (always here), -1 before the first
    int32_t lastFill = 0;
  };
  // What a graph's captured work holds instead of the pool, which may go
  // first: cut (null) by the destructor.
  struct GraphLink {
    explicit GraphLink(KvPool* p) : pool(p) {}
    std::mutex mu;  // held while a launch appends
    KvPool* pool;
  };
  // Holding frontMu_: the append, its copies enqueued on `stream`.
  attnResult_t appendLocked(int64_t req, const void* k, const void* v, const int32_t* pos, int n,
                            attnStream_t stream);
  // One launch's run of a captured append (proxy thread).
  attnResult_t appendAtLaunch(int64_t req, const void* k, const void* v, const int32_t* pos, int n);
  // Holding booksMu: a local call into the books now, or queued behind the
  // collectives.
  void submitLocked(KvLocalCall call);
  void applyLocked(const KvLocalCall& call);
  void applyPendingLocked(uint64_t before);
  // The own requests with the pending local calls applied (a copy).
  std::map<int64_t, KvOwnRequest> frontBooksLocked() const;

  attnComm* comm_;
  attnKvPoolConfig_t cfg_;
  size_t rowBytes_ = 0;
  std::unique_ptr<KvMemory> mem_;
  std::unique_ptr<int32_t[]> pos_;
  // Device pools: blocks whose positions the mirror lacks. posMu_ also
  // orders a write of pos_ against the upload that reads it.
  std::mutex posMu_;
  std::vector<uint8_t> posChanged_;  // per slot
  std::vector<int32_t> changedSlots_;
  mutable std::mutex freeMu_;
  std::vector<int64_t> free_;  // a stack: the lowest slots are taken first

  // The caller's thread, and the proxy thread where a graph's append runs.
  mutable std::mutex frontMu_;
  std::map<int64_t, FrontRequest> front_;
  std::shared_ptr<GraphLink> graphLink_;  // made at the first captured append
  // Under booksMu:
  std::deque<KvLocalCall> pending_;
  std::deque<uint64_t> queued_;  // collectives enqueued, not finished
  uint64_t nextSeq_ = 1;
};

// Calls f(firstSlot, keys) for each run of consecutive slots (all full but
// maybe the last), whose keys are contiguous rows.
template <typename F>
attnResult_t forEachSlotRun(const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens,
                            int blockTokens, F f) {
  size_t i = 0;
  while (i < slots.size()) {
    size_t j = i + 1;
    while (j < slots.size() && slots[j] == slots[j - 1] + 1 && tokens[j - 1] == blockTokens) ++j;
    const int32_t nk = int32_t(int64_t(j - i - 1) * blockTokens + tokens[j - 1]);
    const attnResult_t r = f(slots[i], nk);
    if (r != attnSuccess) return r;
    i = j;
  }
  return attnSuccess;
}

}  // namespace attn
