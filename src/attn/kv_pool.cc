#include "src/attn/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "src/attn/kv_exchange.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

KvPool::KvPool(attnComm* comm, const attnKvPoolConfig_t& cfg) : comm_(comm), cfg_(cfg) {
  rowBytes_ = size_t(cfg.num_kv_heads) * size_t(cfg.head_dim) * dataTypeSize(cfg.dtype);
}

int KvPool::rank() const { return comm_->rank; }
int KvPool::nranks() const { return comm_->nranks; }

attnResult_t KvPool::allocate() {
  const size_t blocks = size_t(cfg_.capacity_blocks);
  // Not zero-filled: a slot is written before it is read.
  k_.reset(new (std::nothrow) char[std::max<size_t>(1, blocks * blockBytes())]);
  v_.reset(new (std::nothrow) char[std::max<size_t>(1, blocks * blockBytes())]);
  pos_.reset(new (std::nothrow) int32_t[std::max<size_t>(1, blocks * size_t(cfg_.block_tokens))]);
  if (!k_ || !v_ || !pos_)
    return setError(attnSystemError, "cannot allocate a KV pool of %lld blocks (%zu bytes each for K and V)",
                    (long long)cfg_.capacity_blocks, blockBytes());
  free_.resize(blocks);
  for (size_t i = 0; i < blocks; ++i) free_[i] = int64_t(blocks - 1 - i);
  releasedAt.assign(size_t(nranks()), {});
  return attnSuccess;
}

int64_t KvPool::takeSlot() {
  const int64_t s = free_.back();
  free_.pop_back();
  return s;
}

attnResult_t KvPool::append(int64_t req, const void* k, const void* v, const int32_t* pos, int n) {
  ATTN_REQUIRE(n >= 0, "n = %d < 0", n);
  if (n == 0) return attnSuccess;
  ATTN_REQUIRE(k && v && pos, "k, v or pos is NULL with %d tokens", n);
  auto it = own.find(req);
  const KvOwnRequest* r = it == own.end() ? nullptr : &it->second;
  int32_t last = r && r->tokens > 0 ? r->lastPos : INT32_MIN;
  for (int i = 0; i < n; ++i) {
    ATTN_REQUIRE(i == 0 && !(r && r->tokens > 0) ? true : pos[i] > last,
                 "request %lld: pos[%d] = %d does not follow the previous token's %d (positions "
                 "must increase)", (long long)req, i, pos[i], last);
    last = pos[i];
  }
  const int bt = cfg_.block_tokens;
  int64_t room = 0;
  if (r && !r->blocks.empty() && r->blocks.back().holder == rank())
    room = bt - r->blocks.back().tokens;
  const int64_t needed = std::max<int64_t>(0, (int64_t(n) - room + bt - 1) / bt);
  if (needed > freeBlocks())
    return setError(attnInvalidUsage,
                    "request %lld: %d tokens need %lld new blocks but the pool has %lld free of %lld",
                    (long long)req, n, (long long)needed, (long long)freeBlocks(),
                    (long long)cfg_.capacity_blocks);
  KvOwnRequest& o = own[req];
  const char* kb = static_cast<const char*>(k);
  const char* vb = static_cast<const char*>(v);
  int done = 0;
  while (done < n) {
    if (o.blocks.empty() || o.blocks.back().holder != rank() || o.blocks.back().tokens == bt)
      o.blocks.push_back({rank(), takeSlot(), 0});
    KvBlockLoc& b = o.blocks.back();
    const int take = std::min(n - done, bt - b.tokens);
    std::memcpy(this->k(b.slot) + size_t(b.tokens) * rowBytes_, kb + size_t(done) * rowBytes_,
                size_t(take) * rowBytes_);
    std::memcpy(this->v(b.slot) + size_t(b.tokens) * rowBytes_, vb + size_t(done) * rowBytes_,
                size_t(take) * rowBytes_);
    std::memcpy(this->pos(b.slot) + b.tokens, pos + done, size_t(take) * sizeof(int32_t));
    b.tokens += take;
    done += take;
  }
  o.tokens += n;
  o.lastPos = pos[n - 1];
  return attnSuccess;
}

attnResult_t KvPool::release(int64_t req) {
  auto it = own.find(req);
  ATTN_REQUIRE(it != own.end(), "request %lld is not a request of this rank", (long long)req);
  std::vector<bool> told(size_t(nranks()), false);
  for (const KvBlockLoc& b : it->second.blocks) {
    if (b.holder == rank()) {
      giveSlot(b.slot);
    } else if (!told[size_t(b.holder)]) {
      told[size_t(b.holder)] = true;
      releasedAt[size_t(b.holder)].push_back(req);
    }
  }
  own.erase(it);
  return attnSuccess;
}

std::vector<int64_t> KvPool::movableOwn(const KvOwnRequest& r) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < r.blocks.size(); ++i)
    if (r.blocks[i].holder == rank() && r.blocks[i].tokens == cfg_.block_tokens)
      out.push_back(int64_t(i));
  return out;
}

attnKvPoolStats_t KvPool::stats() const {
  attnKvPoolStats_t s{};
  s.capacity_blocks = cfg_.capacity_blocks;
  s.used_blocks = cfg_.capacity_blocks - freeBlocks();
  for (const auto& [key, blocks] : lentIn) s.lent_in_blocks += int64_t(blocks.size());
  for (const auto& [id, r] : own)
    for (const KvBlockLoc& b : r.blocks)
      if (b.holder != rank()) ++s.lent_out_blocks;
  s.num_requests = int(own.size());
  return s;
}

void KvPool::writeReleases(int peer, WireOut& out) const {
  const std::vector<int64_t>& r = releasedAt[size_t(peer)];
  out.put(uint32_t(r.size()));
  for (int64_t id : r) out.put(id);
}

void KvPool::releasesDelivered() {
  for (auto& r : releasedAt) r.clear();
}

attnResult_t KvPool::readReleases(int peer, WireIn& in) {
  uint32_t count = 0;
  if (!in.get(&count)) return setError(attnRemoteError, "rank %d sent a truncated release list", peer);
  for (uint32_t i = 0; i < count; ++i) {
    int64_t id = 0;
    if (!in.get(&id)) return setError(attnRemoteError, "rank %d sent a truncated release list", peer);
    auto it = lentIn.find({peer, id});
    if (it == lentIn.end()) continue;  // nothing of it here (any more)
    for (const KvLentBlock& b : it->second) giveSlot(b.slot);
    lentIn.erase(it);
  }
  return attnSuccess;
}

}  // namespace attn
