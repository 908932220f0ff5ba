#include "src/attn/kv_pool.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "src/attn/kv_exchange.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/device/device_route.h"
#include "src/attn/device/kv_device.h"

namespace attn {

namespace {

class HostKvMemory : public KvMemory {
 public:
  attnResult_t allocate(size_t bytes) {
    // Not zero-filled: a slot is written before it is read.
    k_.reset(new (std::nothrow) char[std::max<size_t>(1, bytes)]);
    v_.reset(new (std::nothrow) char[std::max<size_t>(1, bytes)]);
    return k_ && v_ ? attnSuccess : attnSystemError;
  }
  char* k() override { return k_.get(); }
  char* v() override { return v_.get(); }
  bool onDevice() const override { return false; }
  attnResult_t copyIn(char* dst, const void* src, size_t bytes, attnStream_t) override {
    std::memcpy(dst, src, bytes);
    return attnSuccess;
  }

 private:
  std::unique_ptr<char[]> k_, v_;
};

// An append's entry in the books: the last block filled, then the new ones.
void appendToBooks(KvOwnRequest& o, const KvLocalCall& c, int me, int bt) {
  int32_t left = c.tokens, at = 0;  // tokens to book; the next one's index in c.pos
  auto span = [&](KvBlockLoc& b, int32_t take) {
    if (take <= 0 || size_t(at + take) > c.pos.size()) return;
    b.firstPos = std::min(b.firstPos, c.pos[size_t(at)]);
    b.lastPos = std::max(b.lastPos, c.pos[size_t(at + take - 1)]);
  };
  if (!o.blocks.empty() && o.blocks.back().holder == me && o.blocks.back().tokens < bt) {
    const int32_t take = std::min(left, bt - o.blocks.back().tokens);
    o.blocks.back().tokens += take;
    span(o.blocks.back(), take);
    left -= take;
    at += take;
  }
  for (int64_t s : c.newSlots) {
    const int32_t take = std::min(left, bt);
    o.blocks.push_back({me, s, take});
    span(o.blocks.back(), take);
    left -= take;
    at += take;
  }
  o.tokens += c.tokens;
  o.lastPos = c.lastPos;
}

}  // namespace

KvPool::KvPool(attnComm* comm, const attnKvPoolConfig_t& cfg) : comm_(comm), cfg_(cfg) {
  rowBytes_ = size_t(cfg.num_kv_heads) * size_t(cfg.head_dim) * dataTypeSize(cfg.dtype);
}

KvPool::~KvPool() {
  if (graphLink_) {
    // A launch running now finishes first; later ones find no pool.
    std::lock_guard<std::mutex> g(graphLink_->mu);
    graphLink_->pool = nullptr;
  }
  drain();
}

int KvPool::rank() const { return comm_->rank; }
int KvPool::nranks() const { return comm_->nranks; }

attnResult_t KvPool::allocate() {
  const size_t blocks = size_t(cfg_.capacity_blocks);
  const size_t bytes = blocks * blockBytes();
  if (deviceRoute(comm_)) {
    // The mirror of the positions is indexed by 32-bit slots.
    if (cfg_.capacity_blocks > INT32_MAX)
      return setError(attnInvalidArgument, "config.capacity_blocks = %lld: a device pool holds at most %d blocks",
                      (long long)cfg_.capacity_blocks, INT32_MAX);
    ATTN_CHECK(makeKvDeviceMemory(comm_, bytes, blocks * size_t(cfg_.block_tokens) * sizeof(int32_t), &mem_));
    posChanged_.assign(blocks, 0);
  } else {
    auto host = std::make_unique<HostKvMemory>();
    if (host->allocate(bytes) != attnSuccess)
      return setError(attnSystemError, "cannot allocate a KV pool of %lld blocks (%zu bytes each for K and V)",
                      (long long)cfg_.capacity_blocks, blockBytes());
    mem_ = std::move(host);
  }
  // Zeroed: a device pool uploads whole blocks, written rows or not.
  pos_.reset(new (std::nothrow) int32_t[std::max<size_t>(1, blocks * size_t(cfg_.block_tokens))]());
  if (!pos_)
    return setError(attnSystemError, "cannot allocate the positions of a KV pool of %lld blocks",
                    (long long)cfg_.capacity_blocks);
  free_.resize(blocks);
  for (size_t i = 0; i < blocks; ++i) free_[i] = int64_t(blocks - 1 - i);
  releasedAt.assign(size_t(nranks()), {});
  peerCapacity.assign(size_t(nranks()), cfg_.capacity_blocks);
  return attnSuccess;
}

int64_t KvPool::freeBlocks() const {
  std::lock_guard<std::mutex> g(freeMu_);
  return int64_t(free_.size());
}

bool KvPool::takeSlots(int64_t n, std::vector<int64_t>* slots) {
  std::lock_guard<std::mutex> g(freeMu_);
  if (n > int64_t(free_.size())) return false;
  for (int64_t i = 0; i < n; ++i) {
    slots->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvPool::giveSlot(int64_t slot) {
  std::lock_guard<std::mutex> g(freeMu_);
  free_.push_back(slot);
}

attnResult_t KvPool::append(int64_t req, const void* k, const void* v, const int32_t* pos, int n,
                            attnStream_t stream) {
  ATTN_REQUIRE(n >= 0, "n = %d < 0", n);
  if (n == 0) return attnSuccess;
  ATTN_REQUIRE(k && v && pos, "k, v or pos is NULL with %d tokens", n);
  bool capturing = false;
  ATTN_CHECK(mem_->capturing(stream, &capturing));
  if (capturing)
    return captureWork(stream, "attnKvAppend of request " + std::to_string(req),
                       [req, k, v, pos, n](KvPool& p) { return p.appendAtLaunch(req, k, v, pos, n); });
  std::lock_guard<std::mutex> front(frontMu_);
  return appendLocked(req, k, v, pos, n, stream);
}

attnResult_t KvPool::captureWork(attnStream_t stream, std::string what, LaunchWork work) {
  std::shared_ptr<GraphLink> link;
  {
    std::lock_guard<std::mutex> front(frontMu_);
    if (!graphLink_) graphLink_ = std::make_shared<GraphLink>(this);
    link = graphLink_;
  }
  return deviceEnqueueWork(comm_, stream, [link, prefix = comm_->prefix, what = std::move(what),
                                           work = std::move(work)]() -> attnResult_t {
    ErrorContext ctx(prefix);
    std::lock_guard<std::mutex> g(link->mu);
    if (!link->pool)
      return setError(attnInvalidUsage, "a CUDA graph launched %s after its pool was destroyed; nothing ran",
                      what.c_str());
    return work(*link->pool);
  });
}

attnResult_t KvPool::appendAtLaunch(int64_t req, const void* k, const void* v, const int32_t* pos, int n) {
  std::lock_guard<std::mutex> front(frontMu_);
  // The copies go on the pool's own stream: the caller's stream is parked
  // on this launch, after the kernels that wrote k and v.
  ATTN_CHECK(appendLocked(req, k, v, pos, n, mem_->ownStream()));
  return mem_->waitOwnStream();
}

attnResult_t KvPool::appendLocked(int64_t req, const void* k, const void* v, const int32_t* pos, int n,
                                  attnStream_t stream) {
  auto it = front_.find(req);
  const FrontRequest* r = it == front_.end() ? nullptr : &it->second;
  int32_t last = r && r->tokens > 0 ? r->lastPos : INT32_MIN;
  for (int i = 0; i < n; ++i) {
    ATTN_REQUIRE(i == 0 && !(r && r->tokens > 0) ? true : pos[i] > last,
                 "request %lld: pos[%d] = %d does not follow the previous token's %d (positions "
                 "must increase)", (long long)req, i, pos[i], last);
    last = pos[i];
  }
  const int bt = cfg_.block_tokens;
  const int64_t room = r && r->lastSlot >= 0 ? bt - r->lastFill : 0;
  const int64_t needed = std::max<int64_t>(0, (int64_t(n) - room + bt - 1) / bt);
  KvLocalCall call;
  call.req = req;
  call.tokens = n;
  call.lastPos = pos[n - 1];
  call.pos.assign(pos, pos + n);
  // Checked and taken in one step: collectives running elsewhere take
  // slots too.
  if (!takeSlots(needed, &call.newSlots))
    return setError(attnInvalidUsage,
                    "request %lld: %d tokens need %lld new blocks but the pool has %lld free of %lld",
                    (long long)req, n, (long long)needed, (long long)freeBlocks(),
                    (long long)cfg_.capacity_blocks);
  // The tokens go into rows no queued collective reads: the last block's
  // unfilled rows, then the new blocks.
  const char* kb = static_cast<const char*>(k);
  const char* vb = static_cast<const char*>(v);
  const bool existed = r != nullptr;
  const FrontRequest before = existed ? *r : FrontRequest{};
  FrontRequest& f = front_[req];
  int done = 0;
  size_t next = 0;
  attnResult_t copied = attnSuccess;
  while (done < n && copied == attnSuccess) {
    if (f.lastSlot < 0 || f.lastFill == bt) {
      f.lastSlot = call.newSlots[next++];
      f.lastFill = 0;
    }
    const int take = std::min(n - done, bt - f.lastFill);
    const size_t at = size_t(f.lastFill) * rowBytes_, bytes = size_t(take) * rowBytes_;
    copied = mem_->copyIn(this->k(f.lastSlot) + at, kb + size_t(done) * rowBytes_, bytes, stream);
    if (copied == attnSuccess)
      copied = mem_->copyIn(this->v(f.lastSlot) + at, vb + size_t(done) * rowBytes_, bytes, stream);
    writePositions(f.lastSlot, f.lastFill, pos + done, take);
    f.lastFill += take;
    done += take;
  }
  if (copied == attnSuccess) copied = mem_->copiesDone(stream);
  if (copied != attnSuccess) {
    // A failed enqueue (device): the request stays as it was. Its last
    // block may have been half written past its filled rows, which nothing
    // reads.
    for (int64_t s : call.newSlots) giveSlot(s);
    if (existed) front_[req] = before;
    else front_.erase(req);
    return copied;
  }
  f.tokens += n;
  f.lastPos = call.lastPos;
  std::lock_guard<std::mutex> g(booksMu);
  submitLocked(std::move(call));
  return attnSuccess;
}

void KvPool::writePositions(int64_t slot, int32_t at, const void* src, int32_t n) {
  std::lock_guard<std::mutex> g(posMu_);
  std::memcpy(pos(slot) + at, src, size_t(n) * sizeof(int32_t));
  if (posChanged_.empty() || posChanged_[size_t(slot)]) return;
  posChanged_[size_t(slot)] = 1;
  changedSlots_.push_back(int32_t(slot));
}

void KvPool::takeChangedPositions(std::vector<int32_t>* slots, std::vector<int32_t>* positions) {
  const size_t bt = size_t(cfg_.block_tokens);
  std::lock_guard<std::mutex> g(posMu_);
  slots->swap(changedSlots_);
  changedSlots_.clear();
  positions->resize(slots->size() * bt);
  for (size_t i = 0; i < slots->size(); ++i) {
    posChanged_[size_t((*slots)[i])] = 0;
    std::memcpy(positions->data() + i * bt, pos((*slots)[i]), bt * sizeof(int32_t));
  }
}

void KvPool::positionsNotMirrored(const std::vector<int32_t>& slots) {
  std::lock_guard<std::mutex> g(posMu_);
  for (int32_t slot : slots)
    if (!posChanged_[size_t(slot)]) {
      posChanged_[size_t(slot)] = 1;
      changedSlots_.push_back(slot);
    }
}

attnResult_t KvPool::release(int64_t req) {
  std::lock_guard<std::mutex> front(frontMu_);
  ATTN_REQUIRE(front_.count(req), "request %lld is not a request of this rank", (long long)req);
  front_.erase(req);
  KvLocalCall call;
  call.release = true;
  call.req = req;
  std::lock_guard<std::mutex> g(booksMu);
  submitLocked(std::move(call));
  return attnSuccess;
}

void KvPool::submitLocked(KvLocalCall call) {
  call.seq = nextSeq_++;
  if (queued_.empty()) {
    applyLocked(call);
  } else {
    pending_.push_back(std::move(call));
  }
}

void KvPool::applyLocked(const KvLocalCall& c) {
  const int me = rank(), bt = cfg_.block_tokens;
  if (c.release) {
    auto it = own.find(c.req);
    if (it == own.end()) return;  // the front checked it: cannot happen
    std::vector<bool> told(size_t(nranks()), false);
    for (const KvBlockLoc& b : it->second.blocks) {
      if (b.holder == me) {
        giveSlot(b.slot);
      } else if (!told[size_t(b.holder)]) {
        told[size_t(b.holder)] = true;
        releasedAt[size_t(b.holder)].push_back(c.req);
      }
    }
    own.erase(it);
    return;
  }
  appendToBooks(own[c.req], c, me, bt);
}

void KvPool::applyPendingLocked(uint64_t before) {
  while (!pending_.empty() && pending_.front().seq < before) {
    applyLocked(pending_.front());
    pending_.pop_front();
  }
}

uint64_t KvPool::enqueueCollective() {
  std::lock_guard<std::mutex> g(booksMu);
  const uint64_t seq = nextSeq_++;
  queued_.push_back(seq);
  return seq;
}

void KvPool::startCollective(uint64_t seq) {
  std::lock_guard<std::mutex> g(booksMu);
  applyPendingLocked(seq);
}

void KvPool::endCollective(uint64_t seq) {
  std::lock_guard<std::mutex> g(booksMu);
  auto it = std::find(queued_.begin(), queued_.end(), seq);
  if (it != queued_.end()) queued_.erase(it);
  applyPendingLocked(queued_.empty() ? UINT64_MAX : queued_.front());
}

void KvPool::drain() {
  for (;;) {
    {
      std::lock_guard<std::mutex> g(booksMu);
      if (queued_.empty()) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::map<int64_t, KvOwnRequest> KvPool::frontBooksLocked() const {
  std::map<int64_t, KvOwnRequest> view = own;
  const int me = rank(), bt = cfg_.block_tokens;
  for (const KvLocalCall& c : pending_) {
    if (c.release) {
      view.erase(c.req);
      continue;
    }
    appendToBooks(view[c.req], c, me, bt);
  }
  return view;
}

std::vector<int64_t> KvPool::movableOwn(const KvOwnRequest& r) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < r.blocks.size(); ++i)
    if (r.blocks[i].holder == rank() && r.blocks[i].tokens == cfg_.block_tokens)
      out.push_back(int64_t(i));
  return out;
}

attnKvPoolStats_t KvPool::stats() {
  attnKvPoolStats_t s{};
  s.capacity_blocks = cfg_.capacity_blocks;
  s.used_blocks = cfg_.capacity_blocks - freeBlocks();
  {
    std::lock_guard<std::mutex> front(frontMu_);
    s.num_requests = int(front_.size());
  }
  std::lock_guard<std::mutex> g(booksMu);
  for (const auto& [key, blocks] : lentIn) s.lent_in_blocks += int64_t(blocks.size());
  const int me = rank();
  auto count = [&](const std::map<int64_t, KvOwnRequest>& reqs) {
    for (const auto& [id, r] : reqs)
      for (const KvBlockLoc& b : r.blocks)
        if (b.holder != me) ++s.lent_out_blocks;
  };
  if (pending_.empty()) count(own);
  else count(frontBooksLocked());
  return s;
}

attnResult_t KvPool::placement(int64_t req, int64_t* holders, int64_t* tokens) {
  std::lock_guard<std::mutex> front(frontMu_);
  auto f = front_.find(req);
  ATTN_REQUIRE(f != front_.end(), "request %lld is not a request of this rank", (long long)req);
  std::lock_guard<std::mutex> g(booksMu);
  auto fill = [&](const KvOwnRequest& r) {
    if (holders) {
      std::fill(holders, holders + nranks(), int64_t(0));
      for (const KvBlockLoc& b : r.blocks) ++holders[b.holder];
    }
  };
  if (pending_.empty()) fill(own.at(req));
  else fill(frontBooksLocked().at(req));
  if (tokens) *tokens = f->second.tokens;
  return attnSuccess;
}

void KvPool::moveToShrunk(attnComm* shrunk, const std::vector<int>& parentRanks, std::vector<int64_t>* lost) {
  std::vector<int> newOf(size_t(nranks()), -1);
  for (size_t r = 0; r < parentRanks.size(); ++r) newOf[size_t(parentRanks[r])] = int(r);
  std::vector<int64_t> gone;
  {
    std::lock_guard<std::mutex> g(booksMu);
    for (const auto& [id, r] : own)
      for (const KvBlockLoc& b : r.blocks)
        if (newOf[size_t(b.holder)] < 0) {
          gone.push_back(id);
          break;
        }
  }
  // With the old numbering: the surviving holders are told like any release.
  for (int64_t id : gone) release(id);
  lost->insert(lost->end(), gone.begin(), gone.end());

  std::lock_guard<std::mutex> g(booksMu);
  for (auto& [id, r] : own)
    for (KvBlockLoc& b : r.blocks) b.holder = newOf[size_t(b.holder)];
  std::map<KvReqKey, std::vector<KvLentBlock>> kept;
  for (auto& [key, blocks] : lentIn) {
    if (newOf[size_t(key.first)] < 0) {
      for (const KvLentBlock& b : blocks) giveSlot(b.slot);
    } else {
      kept[{newOf[size_t(key.first)], key.second}] = std::move(blocks);
    }
  }
  lentIn = std::move(kept);
  std::vector<std::vector<int64_t>> released(parentRanks.size());
  for (size_t r = 0; r < parentRanks.size(); ++r) released[r] = std::move(releasedAt[size_t(parentRanks[r])]);
  releasedAt = std::move(released);
  std::vector<int64_t> capacity(parentRanks.size(), 0);
  for (size_t r = 0; r < parentRanks.size(); ++r)
    if (size_t(parentRanks[r]) < peerCapacity.size()) capacity[r] = peerCapacity[size_t(parentRanks[r])];
  peerCapacity = std::move(capacity);
  comm_ = shrunk;
}

void KvPool::writeReleases(int peer, WireOut& out) const {
  const std::vector<int64_t>& r = releasedAt[size_t(peer)];
  out.put(uint32_t(r.size()));
  for (int64_t id : r) out.put(id);
}

void KvPool::releasesDelivered() {
  std::lock_guard<std::mutex> g(booksMu);
  for (auto& r : releasedAt) r.clear();
}

void KvPool::applyReleases(int peer, const std::vector<int64_t>& ids) {
  std::lock_guard<std::mutex> g(booksMu);
  for (int64_t id : ids) {
    auto it = lentIn.find({peer, id});
    if (it == lentIn.end()) continue;  // nothing of it here (any more)
    for (const KvLentBlock& b : it->second) giveSlot(b.slot);
    lentIn.erase(it);
  }
}

uint64_t KvPool::requestsHeldFor(int peer) const {
  uint64_t n = 0;
  for (auto it = lentIn.lower_bound({peer, INT64_MIN}); it != lentIn.end() && it->first.first == peer; ++it) ++n;
  return n;
}

}  // namespace attn
