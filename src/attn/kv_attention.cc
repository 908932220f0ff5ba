// One exchange and one reply per pair of ranks:
//  1. every owner sends each peer the releases owed to it and, for each of
//     its requests with blocks there, the queries (rows, positions, Q);
//  2. each holder computes attention of those queries over its blocks of the
//     request (MicroAttention) and replies (O, LSE) in fp32, serving peers
//     before its own work so nobody waits on it;
//  3. the owner computes over its own blocks and folds each reply into the
//     result as it arrives.
// A request whose blocks are all at home costs no message beyond the
// exchange's small header.
#include "src/attn/kv_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/merge.h"
#include "src/attn/attn_state.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/kv_exchange.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

namespace {

struct QueryHeader {
  int32_t numQHeads;
  int32_t causal;
  float scale;
  uint32_t entries;
};

struct QueryEntry {
  int64_t req;
  int32_t rows;
  int32_t reserved;
};

// Folds the keys of `slots` (one request's blocks in this pool) into the
// accumulator of `rows` queries: one kernel call per run of consecutive
// slots, whose keys are contiguous.
attnResult_t accumulateSlots(KvPool& pool, std::vector<int64_t> slots,
                             const std::vector<int32_t>& slotTokens, const QueryHeader& h,
                             const void* q, const int32_t* qPos, int32_t rows, float* o, float* lse) {
  if (rows == 0 || slots.empty()) return attnSuccess;
  const attnKvPoolConfig_t& pc = pool.config();
  const int bt = pc.block_tokens;
  AttnState& st = attnStateOf(pool.comm());
  cpu::AttnExec ex;
  ex.threads = st.kernelThreads;
  ex.pool = st.pool.get();
  size_t i = 0;
  while (i < slots.size()) {
    size_t j = i + 1;
    // A run: consecutive slots, all full but maybe the last.
    while (j < slots.size() && slots[j] == slots[j - 1] + 1 && slotTokens[j - 1] == bt) ++j;
    const int64_t first = slots[i];
    const int32_t nk = int32_t(int64_t(j - i - 1) * bt + slotTokens[j - 1]);
    cpu::AttnProblem p;
    p.q = q;
    p.k = pool.k(first);
    p.v = pool.v(first);
    p.dtype = pc.dtype;
    p.nq = rows;
    p.nk = nk;
    p.num_q_heads = h.numQHeads;
    p.num_kv_heads = pc.num_kv_heads;
    p.head_dim = pc.head_dim;
    p.scale = h.scale;
    p.causal = h.causal != 0;
    p.q_pos = qPos;
    p.k_pos = pool.pos(first);
    ATTN_CHECK(cpu::attentionAccumulate(p, o, lse, ex));
    i = j;
  }
  return attnSuccess;
}

// The slots of a request here, ordered by slot, with their token counts.
void ownSlots(KvPool& pool, const KvOwnRequest& r, std::vector<int64_t>* slots,
              std::vector<int32_t>* tokens) {
  std::vector<std::pair<int64_t, int32_t>> s;
  for (const KvBlockLoc& b : r.blocks)
    if (b.holder == pool.rank()) s.push_back({b.slot, b.tokens});
  std::sort(s.begin(), s.end());
  for (auto& [slot, t] : s) {
    slots->push_back(slot);
    tokens->push_back(t);
  }
}

void lentSlots(KvPool& pool, const std::vector<KvLentBlock>& blocks, std::vector<int64_t>* slots,
               std::vector<int32_t>* tokens) {
  for (const KvLentBlock& b : blocks) slots->push_back(b.slot);
  std::sort(slots->begin(), slots->end());
  tokens->assign(slots->size(), pool.config().block_tokens);  // lent blocks are full
}

size_t rowBytesOf(const attnAttnConfig_t& c) {
  return size_t(c.num_q_heads) * size_t(c.head_dim) * dataTypeSize(c.dtype);
}

}  // namespace

attnResult_t checkKvAttnArgs(KvPool& pool, const KvAttnArgs& a) {
  const attnKvPoolConfig_t& pc = pool.config();
  const attnAttnConfig_t& c = a.cfg;
  ATTN_REQUIRE(c.num_kv_heads == pc.num_kv_heads && c.head_dim == pc.head_dim && c.dtype == pc.dtype,
               "cfg (kv heads %d, head_dim %d, dtype %d) is not the pool's (%d, %d, %d)", c.num_kv_heads,
               c.head_dim, c.dtype, pc.num_kv_heads, pc.head_dim, pc.dtype);
  ATTN_REQUIRE(c.num_q_heads >= 1 && c.num_q_heads % c.num_kv_heads == 0,
               "cfg.num_q_heads = %d is not a positive multiple of num_kv_heads %d", c.num_q_heads,
               c.num_kv_heads);
  ATTN_REQUIRE(std::isfinite(c.softmax_scale) && c.softmax_scale >= 0, "cfg.softmax_scale = %g",
               c.softmax_scale);
  std::set<int64_t> seen;
  for (size_t i = 0; i < a.reqs.size(); ++i) {
    ATTN_REQUIRE(pool.own.count(a.reqs[i]), "reqs[%zu] = %lld is not a request of this rank", i,
                 (long long)a.reqs[i]);
    ATTN_REQUIRE(seen.insert(a.reqs[i]).second, "reqs[%zu] = %lld appears twice", i, (long long)a.reqs[i]);
  }
  ATTN_REQUIRE(a.qOffsets.empty() || a.qOffsets[0] == 0, "q_offsets[0] = %d, not 0", a.qOffsets[0]);
  for (size_t i = 0; i + 1 < a.qOffsets.size(); ++i)
    ATTN_REQUIRE(a.qOffsets[i + 1] >= a.qOffsets[i], "q_offsets decreases at %zu (%d -> %d)", i,
                 a.qOffsets[i], a.qOffsets[i + 1]);
  const int32_t rows = a.qOffsets.empty() ? 0 : a.qOffsets.back();
  ATTN_REQUIRE(rows == 0 || (a.q && a.out), "q or out is NULL with %d query rows", rows);
  ATTN_REQUIRE(rows == 0 || !c.causal || a.qPos, "causal attention needs q_pos");
  return attnSuccess;
}

attnResult_t kvAttention(KvPool& pool, const KvAttnArgs& a, attnResult_t localStatus) {
  Engine& e = *pool.comm()->engine;
  const int me = pool.rank(), n = pool.nranks();
  const attnAttnConfig_t& cfg = a.cfg;
  const int hq = cfg.num_q_heads, d = cfg.head_dim;
  const size_t qRowBytes = rowBytesOf(cfg);
  const int32_t rows = a.qOffsets.empty() ? 0 : a.qOffsets.back();
  const QueryHeader mine{hq, cfg.causal, cfg.softmax_scale, 0};
  const char* qb = static_cast<const char*>(a.q);

  // 1. Queries to the holders (with the releases owed).
  std::vector<std::vector<char>> out(static_cast<size_t>(n));
  std::vector<std::vector<size_t>> sentTo(static_cast<size_t>(n));  // request indices shipped, per peer
  std::vector<int64_t> replyRows(size_t(n), 0);
  if (localStatus == attnSuccess) {
    for (size_t i = 0; i < a.reqs.size(); ++i) {
      std::vector<bool> at(size_t(n), false);
      for (const KvBlockLoc& b : pool.own.at(a.reqs[i]).blocks) at[size_t(b.holder)] = true;
      for (int p = 0; p < n; ++p)
        if (p != me && at[p]) sentTo[p].push_back(i);
    }
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      WireOut w;
      pool.writeReleases(p, w);
      QueryHeader h = mine;
      h.entries = uint32_t(sentTo[p].size());
      w.put(h);
      for (size_t i : sentTo[p]) {
        const int32_t r = a.qOffsets[i + 1] - a.qOffsets[i];
        w.put(QueryEntry{a.reqs[i], r, 0});
        replyRows[p] += r;
      }
      for (size_t i : sentTo[p]) {
        const int32_t r0 = a.qOffsets[i], r = a.qOffsets[i + 1] - r0;
        if (a.qPos) w.putBytes(a.qPos + r0, size_t(r) * sizeof(int32_t));
        else for (int32_t k = 0; k < r; ++k) w.put(int32_t(0));
        w.putBytes(qb + size_t(r0) * qRowBytes, size_t(r) * qRowBytes);
      }
      out[p] = std::move(w.bytes());
    }
  }
  PeerExchange got;
  ATTN_CHECK(exchangeWithPeers(e, me, n, "attnKvAttention", localStatus, out, &got));
  pool.releasesDelivered();

  // Replies to our queries may land from now on.
  std::vector<std::vector<float>> replies(static_cast<size_t>(n));
  std::unique_ptr<Request[]> rreq(new Request[size_t(n)]);
  std::unique_ptr<Request[]> sreq(new Request[size_t(n)]);
  std::vector<std::vector<float>> served(static_cast<size_t>(n));
  BreakOnEarlyExit guard(e);
  std::vector<Request*> pendingReplies;
  std::vector<int> replyFrom;
  for (int p = 0; p < n; ++p) {
    if (p == me || replyRows[p] == 0) continue;
    replies[p].resize(size_t(replyRows[p]) * hq * (d + 1));
    ATTN_CHECK(e.irecv(p, replies[p].data(), replies[p].size() * sizeof(float), &rreq[p]));
    pendingReplies.push_back(&rreq[p]);
    replyFrom.push_back(p);
  }

  // 2. Serve the peers' queries, first come first served.
  std::vector<int> servedTo;
  for (int p : got.arrival) {
    WireIn in(got.in[p]);
    ATTN_CHECK(pool.readReleases(p, in));
    QueryHeader h;
    if (!in.get(&h)) return setError(attnRemoteError, "attnKvAttention: rank %d sent a truncated header", p);
    if (h.entries == 0) continue;
    if (h.numQHeads < 1 || h.numQHeads % pool.config().num_kv_heads != 0 || !std::isfinite(h.scale))
      return setError(attnRemoteError, "attnKvAttention: rank %d sent queries with %d heads", p, h.numQHeads);
    std::vector<QueryEntry> entries(h.entries);
    int64_t total = 0;
    for (auto& en : entries) {
      if (!in.get(&en) || en.rows < 0)
        return setError(attnRemoteError, "attnKvAttention: rank %d sent a truncated request list", p);
      total += en.rows;
    }
    const size_t rb = size_t(h.numQHeads) * size_t(pool.config().head_dim) * dataTypeSize(pool.config().dtype);
    const size_t od = size_t(pool.config().head_dim);
    std::vector<float>& res = served[p];
    res.resize(size_t(total) * h.numQHeads * (od + 1));
    float* o = res.data();
    float* l = res.data() + size_t(total) * h.numQHeads * od;
    cpu::initAccumulator(o, l, total, h.numQHeads, int(od));
    for (const QueryEntry& en : entries) {
      const char* posBytes = in.take(size_t(en.rows) * sizeof(int32_t));
      const char* qBytes = in.take(size_t(en.rows) * rb);
      if (!posBytes || !qBytes)
        return setError(attnRemoteError, "attnKvAttention: rank %d sent fewer query rows than announced", p);
      auto it = pool.lentIn.find({p, en.req});
      if (it == pool.lentIn.end())
        return setError(attnRemoteError,
                        "attnKvAttention: rank %d sent queries of its request %lld, of which this rank "
                        "holds no blocks", p, (long long)en.req);
      std::vector<int32_t> pos(size_t(en.rows));
      std::memcpy(pos.data(), posBytes, pos.size() * sizeof(int32_t));
      std::vector<int64_t> slots;
      std::vector<int32_t> tokens;
      lentSlots(pool, it->second, &slots, &tokens);
      ATTN_CHECK(accumulateSlots(pool, slots, tokens, h, qBytes, pos.data(), en.rows, o, l));
      o += size_t(en.rows) * h.numQHeads * od;
      l += size_t(en.rows) * h.numQHeads;
    }
    ATTN_CHECK(e.isend(p, res.data(), res.size() * sizeof(float), &sreq[p]));
    servedTo.push_back(p);
  }

  // 3. Our own blocks, then the replies as they arrive.
  std::vector<float> accO(size_t(rows) * hq * d), accL(size_t(rows) * hq);
  cpu::initAccumulator(accO.data(), accL.data(), rows, hq, d);
  for (size_t i = 0; i < a.reqs.size(); ++i) {
    const int32_t r0 = a.qOffsets[i], r = a.qOffsets[i + 1] - r0;
    std::vector<int64_t> slots;
    std::vector<int32_t> tokens;
    ownSlots(pool, pool.own.at(a.reqs[i]), &slots, &tokens);
    ATTN_CHECK(accumulateSlots(pool, slots, tokens, mine, qb + size_t(r0) * qRowBytes,
                               a.qPos ? a.qPos + r0 : nullptr, r, accO.data() + size_t(r0) * hq * d,
                               accL.data() + size_t(r0) * hq));
  }
  while (!pendingReplies.empty()) {
    size_t k = 0;
    ATTN_CHECK(e.waitAny(pendingReplies.data(), pendingReplies.size(), &k));
    const int p = replyFrom[k];
    if (pendingReplies[k]->bytes != replies[p].size() * sizeof(float))
      return setError(attnRemoteError, "attnKvAttention: rank %d replied %zu bytes, %zu expected", p,
                      pendingReplies[k]->bytes, replies[p].size() * sizeof(float));
    const float* o = replies[p].data();
    const float* l = o + size_t(replyRows[p]) * hq * d;
    for (size_t i : sentTo[p]) {
      const int32_t r0 = a.qOffsets[i], r = a.qOffsets[i + 1] - r0;
      cpu::AttnPartialRef ref{o, attnFloat32, l};
      ATTN_CHECK(cpu::foldPartial(accO.data() + size_t(r0) * hq * d, accL.data() + size_t(r0) * hq, ref,
                                  size_t(r) * hq, d));
      o += size_t(r) * hq * d;
      l += size_t(r) * hq;
    }
    pendingReplies.erase(pendingReplies.begin() + long(k));
    replyFrom.erase(replyFrom.begin() + long(k));
  }
  for (int p : servedTo) ATTN_CHECK(e.wait(&sreq[p]));
  guard.done();
  if (rows > 0) ATTN_CHECK(cpu::convertFromFloat(a.out, cfg.dtype, accO.data(), accO.size()));
  if (a.lse && rows > 0) std::memcpy(a.lse, accL.data(), accL.size() * sizeof(float));
  return attnSuccess;
}

}  // namespace attn
