// The pool's side of attnCommShrink (see kv_shrink.h).
#include "src/attn/kv_shrink.h"

#include <algorithm>
#include <set>
#include <utility>

#include "src/attn/kv_exchange.h"
#include "src/attn/kv_pool.h"
#include "src/core/checked_size.h"
#include "src/core/comm.h"
#include "src/core/error.h"

namespace attn {

namespace {

constexpr const char* kWhat = "attnKvPoolShrink";

// The most blocks an owner may claim this holder holds: every one was a
// block of this pool when granted; after a migration the failure cut short
// an owner may count some it never got (lenient: twice the capacity).
uint64_t claimBound(const KvPool& pool) { return 2 * uint64_t(pool.config().capacity_blocks) + 1; }

// Claims or answers of that many: a count, then per claim at most a
// request id, a count and an index.
uint64_t claimsBytes(uint64_t claims) {
  return satAdd(sizeof(uint32_t), satMul(claims, sizeof(int64_t) + sizeof(uint32_t) + sizeof(int64_t)));
}

// Step 2's claims to `holder`: per own request with blocks there, its id and
// the indices of those blocks.
std::vector<char> claimsFor(const KvPool& pool, int holder, uint64_t* requests) {
  WireOut out;
  std::vector<std::pair<int64_t, std::vector<int64_t>>> reqs;
  for (const auto& [id, r] : pool.own) {
    std::vector<int64_t> at;
    for (size_t i = 0; i < r.blocks.size(); ++i)
      if (r.blocks[i].holder == holder) at.push_back(int64_t(i));
    if (!at.empty()) reqs.emplace_back(id, std::move(at));
  }
  out.put(uint32_t(reqs.size()));
  *requests = reqs.size();
  for (const auto& [id, at] : reqs) {
    out.put(id);
    out.put(uint32_t(at.size()));
    for (int64_t i : at) out.put(i);
  }
  return std::move(out.bytes());
}

// Step 2 on the holder: keeps what `owner` claims, frees the rest of its
// blocks here, and lists the requests whose claimed blocks are missing.
attnResult_t settleWithOwner(KvPool& pool, int owner, const PeerBytes& claims, std::vector<int64_t>* missing) {
  std::vector<std::pair<int64_t, int64_t>> list;
  ATTN_CHECK(parseKvClaims(claims.data(), claims.size, owner, claimBound(pool), &list));
  const std::set<std::pair<int64_t, int64_t>> claimed(list.begin(), list.end());

  std::lock_guard<std::mutex> g(pool.booksMu);
  std::set<std::pair<int64_t, int64_t>> held;
  for (auto it = pool.lentIn.lower_bound({owner, INT64_MIN}); it != pool.lentIn.end() && it->first.first == owner;) {
    std::vector<KvLentBlock>& blocks = it->second;
    const int64_t id = it->first.second;
    auto unclaimed = std::stable_partition(blocks.begin(), blocks.end(), [&](const KvLentBlock& b) {
      return claimed.count({id, b.index}) > 0;
    });
    for (auto b = unclaimed; b != blocks.end(); ++b) pool.giveSlot(b->slot);
    blocks.erase(unclaimed, blocks.end());
    for (const KvLentBlock& b : blocks) held.insert({id, b.index});
    it = blocks.empty() ? pool.lentIn.erase(it) : std::next(it);
  }
  for (const auto& c : claimed)
    if (!held.count(c) && (missing->empty() || missing->back() != c.first)) missing->push_back(c.first);
  return attnSuccess;
}

}  // namespace

attnResult_t kvPoolShrink(KvPool* pool_, attnComm* shrunk, attnResult_t localStatus, std::vector<int64_t>* lost) {
  Engine& e = *shrunk->engine;
  const int me = shrunk->rank, n = shrunk->nranks;
  std::vector<std::vector<char>> out(static_cast<size_t>(n));
  PeerExchange got;
  // Everyone's input is good before any pool moves (no payloads).
  ATTN_CHECK(exchangeWithPeers(e, me, n, kWhat, localStatus, out, std::vector<uint64_t>(size_t(n), 0), &got));
  KvPool& pool = *pool_;

  pool.drain();
  pool.moveToShrunk(shrunk, shrunk->parentRanks, lost);

  // Per holder, the requests we claim there: all its answer may name.
  std::vector<uint64_t> claimedAt(static_cast<size_t>(n), 0);
  {
    std::lock_guard<std::mutex> g(pool.booksMu);
    for (int h = 0; h < n; ++h)
      if (h != me) out[size_t(h)] = claimsFor(pool, h, &claimedAt[size_t(h)]);
  }
  ATTN_CHECK(exchangeWithPeers(e, me, n, kWhat, attnSuccess, out,
                               std::vector<uint64_t>(size_t(n), claimsBytes(claimBound(pool))), &got));
  std::vector<std::vector<char>> answers(static_cast<size_t>(n));
  for (int o = 0; o < n; ++o) {
    if (o == me) continue;
    std::vector<int64_t> missing;
    ATTN_CHECK(settleWithOwner(pool, o, got.in[size_t(o)], &missing));
    WireOut w;
    w.put(uint32_t(missing.size()));
    for (int64_t id : missing) w.put(id);
    answers[size_t(o)] = std::move(w.bytes());
  }
  // The claims were the whole truth: releases not yet delivered are settled.
  {
    std::lock_guard<std::mutex> g(pool.booksMu);
    for (auto& r : pool.releasedAt) r.clear();
  }

  std::vector<uint64_t> answerBytes(static_cast<size_t>(n));
  for (int h = 0; h < n; ++h)
    answerBytes[size_t(h)] = satAdd(sizeof(uint32_t), satMul(claimedAt[size_t(h)], sizeof(int64_t)));
  ATTN_CHECK(exchangeWithPeers(e, me, n, kWhat, attnSuccess, answers, answerBytes, &got));
  std::set<int64_t> dropped;
  for (int h = 0; h < n; ++h) {
    if (h == me) continue;
    std::vector<int64_t> ids;
    ATTN_CHECK(parseKvLostList(got.in[size_t(h)].data(), got.in[size_t(h)].size, h, claimedAt[size_t(h)], &ids));
    dropped.insert(ids.begin(), ids.end());
  }
  // Their other holders free them in the pool's next collective.
  for (int64_t id : dropped)
    if (pool.owns(id)) {
      ATTN_CHECK(pool.release(id));
      lost->push_back(id);
    }
  std::sort(lost->begin(), lost->end());
  return attnSuccess;
}

}  // namespace attn
