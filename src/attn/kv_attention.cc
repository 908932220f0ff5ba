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
#include "kernels/cpu/pack.h"
#include "kernels/cpu/sinks.h"
#include "src/attn/attn_config.h"
#include "src/attn/attn_state.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/kv_exchange.h"
#include "src/attn/visibility.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/attn/device/kv_device.h"

namespace attn {

namespace {

cpu::AttnExec cpuExec(KvPool& pool) {
  AttnState& st = attnStateOf(pool.comm());
  cpu::AttnExec ex;
  ex.threads = st.kernelThreads;
  ex.pool = st.pool.get();
  return ex;
}

// Folds the keys of `slots` (one request's blocks in this pool) into the
// accumulator of `rows` queries with the CPU kernel: one call, over the
// blocks where they lie.
attnResult_t accumulateSlots(KvPool& pool, const std::vector<int64_t>& slots,
                             const std::vector<int32_t>& slotTokens, const KvQueryHeader& h,
                             const void* q, const int32_t* qPos, int32_t rows, float* o, float* lse) {
  if (rows == 0 || slots.empty()) return attnSuccess;
  const KvKeyLayout keys = kvKeyLayoutOf(pool, slots, slotTokens);
  std::vector<int64_t> keyRows;
  std::vector<int32_t> keyPos;
  if (keys.paged) {
    std::vector<cpu::KeyBlock> blocks;
    kvKeyBlocks(slots, slotTokens, 0, &blocks);
    keyRows.resize(size_t(keys.count));
    keyPos.resize(size_t(keys.count));
    cpu::gatherKeyTable(keyRows.data(), keyPos.data(), blocks.data(), blocks.size(), pool.config().block_tokens,
                        pool.pos(0), size_t(pool.config().capacity_blocks));
  }
  const cpu::AttnProblem p = kvKeysProblem(pool, h, q, rows, qPos, keys, keyRows.data(),
                                           keys.paged ? keyPos.data() : pool.pos(keys.first));
  return cpu::attentionAccumulate(p, o, lse, cpuExec(pool));
}

class HostKvAttnCompute : public KvAttnCompute {
 public:
  HostKvAttnCompute(KvPool& pool, const KvAttnArgs& a)
      : pool_(pool), a_(a), hq_(a.cfg.num_q_heads), d_(a.cfg.head_dim),
        accO_(size_t(a.rows()) * hq_ * d_), accL_(size_t(a.rows()) * hq_) {
    cpu::initAccumulator(accO_.data(), accL_.data(), a.rows(), hq_, d_);
  }

  attnResult_t serve(std::vector<KvServeBatch>& batches,
                     const std::function<attnResult_t(size_t)>& ready) override {
    const size_t od = size_t(pool_.config().head_dim);
    for (size_t i = 0; i < batches.size(); ++i) {
      const KvServeBatch& b = batches[i];
      b.result->resize(size_t(b.rows) * b.h.numQHeads * (od + 1));
      float* o = b.result->data();
      float* l = b.result->data() + size_t(b.rows) * b.h.numQHeads * od;
      cpu::initAccumulator(o, l, b.rows, b.h.numQHeads, int(od));
      for (const KvServedRequest& r : b.reqs) {
        ATTN_CHECK(accumulateSlots(pool_, r.slots, r.tokens, b.h, r.q, r.pos, r.rows, o, l));
        o += size_t(r.rows) * b.h.numQHeads * od;
        l += size_t(r.rows) * b.h.numQHeads;
      }
      ATTN_CHECK(ready(i));  // its reply leaves while the next is computed
    }
    return attnSuccess;
  }

  attnResult_t own(const std::vector<KvOwnWork>& work) override {
    const KvQueryHeader mine = kvQueryHeaderOf(a_.cfg, hq_);
    const size_t qRowBytes = size_t(hq_) * size_t(d_) * dataTypeSize(a_.cfg.dtype);
    for (const KvOwnWork& w : work)
      ATTN_CHECK(accumulateSlots(pool_, w.slots, w.tokens, mine,
                                 static_cast<const char*>(a_.q) + size_t(w.r0) * qRowBytes,
                                 a_.hasQPos ? a_.qPos.data() + w.r0 : nullptr, w.rows,
                                 accO_.data() + size_t(w.r0) * hq_ * d_, accL_.data() + size_t(w.r0) * hq_));
    return attnSuccess;
  }

  attnResult_t fold(const std::vector<float>& reply,
                    const std::vector<std::pair<int32_t, int32_t>>& ranges) override {
    int64_t rows = 0;
    for (const auto& [r0, r] : ranges) rows += r;
    const float* o = reply.data();
    const float* l = o + size_t(rows) * hq_ * d_;
    for (const auto& [r0, r] : ranges) {
      cpu::AttnPartialRef ref{o, attnFloat32, l};
      ATTN_CHECK(cpu::foldPartial(accO_.data() + size_t(r0) * hq_ * d_, accL_.data() + size_t(r0) * hq_, ref,
                                  size_t(r) * hq_, d_));
      o += size_t(r) * hq_ * d_;
      l += size_t(r) * hq_;
    }
    return attnSuccess;
  }

  attnResult_t finish() override {
    if (a_.rows() == 0) return attnSuccess;
    if (a_.cfg.sinks) cpu::applySinks(accO_.data(), accL_.data(), a_.rows(), hq_, d_, a_.cfg.sinks);
    ATTN_CHECK(cpu::convertFromFloat(a_.out, a_.cfg.dtype, accO_.data(), accO_.size()));
    if (a_.lse) writeLse(a_.cfg, accL_.data(), a_.lse, a_.rows(), hq_);
    return attnSuccess;
  }

 private:
  KvPool& pool_;
  const KvAttnArgs& a_;
  const int hq_, d_;
  std::vector<float> accO_, accL_;
};

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

attnResult_t makeKvAttnCompute(KvPool& pool, const KvAttnArgs& a, std::unique_ptr<KvAttnCompute>* out) {
#if ATTN_HAVE_CUDA
  if (pool.onDevice()) return makeKvAttnComputeDevice(pool, a, out);
#endif
  *out = std::make_unique<HostKvAttnCompute>(pool, a);
  return attnSuccess;
}

KvKeyLayout kvKeyLayoutOf(const KvPool& pool, const std::vector<int64_t>& slots,
                          const std::vector<int32_t>& tokens) {
  KvKeyLayout keys;
  int runs = 0;
  int64_t count = 0;
  (void)forEachSlotRun(slots, tokens, pool.config().block_tokens, [&](int64_t first, int32_t nk) {
    if (runs++ == 0) keys.first = first;
    count += nk;
    return attnSuccess;
  });
  keys.count = int32_t(count);
  keys.paged = runs > 1;
  return keys;
}

void kvKeyBlocks(const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens, int32_t at,
                 std::vector<cpu::KeyBlock>* blocks) {
  for (size_t i = 0; i < slots.size(); ++i) {
    blocks->push_back({slots[i], at, tokens[i]});
    at += tokens[i];
  }
}

bool kvBlockSeen(const KvBlockLoc& b, const attnAttnConfig_t& cfg, int32_t qMin, int32_t qMax) {
  if ((cfg.window_left < 0 && cfg.window_right < 0) || b.firstPos > b.lastPos || qMin > qMax) return true;
  const cpu::VisibleSpan span = cpu::visibleSpan(cfg.causal != 0, cfg.window_left, cfg.window_right);
  return int64_t(b.lastPos) >= int64_t(qMin) - span.lo && int64_t(b.firstPos) <= int64_t(qMax) + span.hi;
}

cpu::AttnProblem kvKeysProblem(KvPool& pool, const KvQueryHeader& h, const void* q, int32_t rows,
                               const int32_t* qPos, const KvKeyLayout& keys, const int64_t* keyRows,
                               const int32_t* keyPos) {
  const attnKvPoolConfig_t& pc = pool.config();
  const int64_t base = keys.paged ? 0 : keys.first;
  cpu::AttnProblem p;
  p.q = q;
  p.k = pool.k(base);
  p.v = pool.v(base);
  p.dtype = pc.dtype;
  p.nq = rows;
  p.nk = keys.count;
  p.num_q_heads = h.numQHeads;
  p.num_kv_heads = pc.num_kv_heads;
  p.head_dim = pc.head_dim;
  p.scale = h.scale;
  p.causal = h.causal != 0;
  p.window_left = h.windowLeft;
  p.window_right = h.windowRight;
  p.softcap = h.softcap;
  p.q_pos = qPos;
  p.k_pos = keyPos;
  p.k_rows = keys.paged ? keyRows : nullptr;
  return p;
}

attnResult_t checkKvAttnArgs(KvPool& pool, const KvAttnArgs& a) {
  const attnKvPoolConfig_t& pc = pool.config();
  const attnAttnConfig_t& c = a.cfg;
  ATTN_REQUIRE(c.num_kv_heads == pc.num_kv_heads && c.head_dim == pc.head_dim && c.dtype == pc.dtype,
               "cfg (kv heads %d, head_dim %d, dtype %d) is not the pool's (%d, %d, %d)", c.num_kv_heads,
               c.head_dim, c.dtype, pc.num_kv_heads, pc.head_dim, pc.dtype);
  ATTN_REQUIRE(c.head_dim_v == c.head_dim,
               "cfg.head_dim_v = %d: a KV pool holds V rows of its head_dim %d (MLA-shaped pools are not "
               "supported yet)",
               c.head_dim_v, pc.head_dim);
  ATTN_REQUIRE(c.num_q_heads >= 1 && c.num_q_heads % c.num_kv_heads == 0,
               "cfg.num_q_heads = %d is not a positive multiple of num_kv_heads %d", c.num_q_heads,
               c.num_kv_heads);
  ATTN_REQUIRE(std::isfinite(c.softmax_scale) && c.softmax_scale >= 0, "cfg.softmax_scale = %g",
               c.softmax_scale);
  std::set<int64_t> seen;
  for (size_t i = 0; i < a.reqs.size(); ++i) {
    ATTN_REQUIRE(pool.owns(a.reqs[i]), "reqs[%zu] = %lld is not a request of this rank", i,
                 (long long)a.reqs[i]);
    ATTN_REQUIRE(seen.insert(a.reqs[i]).second, "reqs[%zu] = %lld appears twice", i, (long long)a.reqs[i]);
  }
  ATTN_REQUIRE(a.qOffsets.empty() || a.qOffsets[0] == 0, "q_offsets[0] = %d, not 0", a.qOffsets[0]);
  for (size_t i = 0; i + 1 < a.qOffsets.size(); ++i)
    ATTN_REQUIRE(a.qOffsets[i + 1] >= a.qOffsets[i], "q_offsets decreases at %zu (%d -> %d)", i,
                 a.qOffsets[i], a.qOffsets[i + 1]);
  const int32_t rows = a.rows();
  ATTN_REQUIRE(rows == 0 || (a.q && a.out), "q or out is NULL with %d query rows", rows);
  ATTN_REQUIRE(rows == 0 || !attnNeedsPositions(c) || a.hasQPos, "causal or windowed attention needs q_pos");
  return attnSuccess;
}

attnResult_t kvAttention(KvPool& pool, const KvAttnArgs& a, attnResult_t localStatus) {
  Engine& e = *pool.comm()->engine;
  const int me = pool.rank(), n = pool.nranks();
  const attnAttnConfig_t& cfg = a.cfg;
  const int hq = cfg.num_q_heads, d = cfg.head_dim;
  const size_t qRowBytes = rowBytesOf(cfg);
  const KvQueryHeader mine = kvQueryHeaderOf(cfg, hq);
  std::unique_ptr<KvAttnCompute> compute;
  if (localStatus == attnSuccess) localStatus = makeKvAttnCompute(pool, a, &compute);

  // 1. Queries to the holders (with the releases owed). On a device pool
  // the query rows come down first.
  std::vector<std::vector<char>> out(static_cast<size_t>(n));
  std::vector<std::vector<size_t>> sentTo(static_cast<size_t>(n));  // request indices shipped, per peer
  std::vector<int64_t> replyRows(size_t(n), 0);
  if (localStatus == attnSuccess) {
    // Under a sliding window only the holders of blocks some query of the
    // request may see are asked.
    for (size_t i = 0; i < a.reqs.size(); ++i) {
      // A request without query rows asks nothing of its holders.
      if (a.qOffsets[i + 1] == a.qOffsets[i]) continue;
      int32_t qMin = INT32_MIN, qMax = INT32_MAX;  // unknown: any
      if (a.hasQPos) positionRange(a.qPos.data() + a.qOffsets[i], a.qOffsets[i + 1] - a.qOffsets[i], &qMin, &qMax);
      std::vector<bool> at(size_t(n), false);
      for (const KvBlockLoc& b : pool.own.at(a.reqs[i]).blocks)
        if (kvBlockSeen(b, cfg, qMin, qMax)) at[size_t(b.holder)] = true;
      for (int p = 0; p < n; ++p)
        if (p != me && at[p]) sentTo[p].push_back(i);
    }
    std::vector<char> hostQ;
    const char* qb = static_cast<const char*>(a.q);
    bool shipped = false;
    for (int p = 0; p < n; ++p) shipped = shipped || !sentTo[p].empty();
    if (shipped && pool.onDevice()) {
#if ATTN_HAVE_CUDA
      localStatus = kvDeviceDownload(pool, a.q, size_t(a.rows()) * qRowBytes, &hostQ);
#endif
      qb = hostQ.data();
    }
    for (int p = 0; p < n && localStatus == attnSuccess; ++p) {
      if (p == me) continue;
      WireOut w;
      pool.writeReleases(p, w);
      KvQueryHeader h = mine;
      h.entries = uint32_t(sentTo[p].size());
      w.put(h);
      for (size_t i : sentTo[p]) {
        const int32_t r = a.qOffsets[i + 1] - a.qOffsets[i];
        w.put(QueryEntry{a.reqs[i], r, 0});
        replyRows[p] += r;
      }
      for (size_t i : sentTo[p]) {
        const int32_t r0 = a.qOffsets[i], r = a.qOffsets[i + 1] - r0;
        if (a.hasQPos) w.putBytes(a.qPos.data() + r0, size_t(r) * sizeof(int32_t));
        else for (int32_t k = 0; k < r; ++k) w.put(int32_t(0));
        w.putBytes(qb + size_t(r0) * qRowBytes, size_t(r) * qRowBytes);
      }
      out[p] = std::move(w.bytes());
    }
  }
  // What each peer may send: the releases it may owe us and queries for
  // its requests with blocks here (with none, no query at all).
  std::vector<KvPeerLimits> limits(static_cast<size_t>(n));
  std::vector<uint64_t> maxBytes(static_cast<size_t>(n), 0);
  for (int p = 0; p < n; ++p) {
    KvPeerLimits& lim = limits[size_t(p)] = pool.limitsFor(p, "attnKvAttention");
    lim.maxEntries = p == me ? 0 : pool.requestsHeldFor(p);
    maxBytes[size_t(p)] = kvQueryRequestBound(lim);
  }
  PeerExchange got;
  ATTN_CHECK(exchangeWithPeers(e, me, n, "attnKvAttention", localStatus, out, maxBytes, &got));
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

  // 2. Serve the peers' queries, first come first served. The messages
  // are read first (their position and query bytes stay in got.in), so the
  // GPU can take every peer's work in one go.
  std::vector<KvServeBatch> batches;
  std::vector<std::vector<std::vector<int32_t>>> positions;  // per batch, per request (aligned copies)
  for (int p : got.arrival) {
    KvQueryRequest msg;
    ATTN_CHECK(parseKvQueryRequest(got.in[p].data(), got.in[p].size, limits[size_t(p)], &msg));
    pool.applyReleases(p, msg.releases);
    if (msg.entries.empty()) continue;
    const int64_t total = msg.rows;
    KvServeBatch b;
    b.peer = p;
    b.h = msg.header;
    b.rows = total;
    b.result = &served[p];
    b.reqs.resize(msg.entries.size());
    std::vector<std::vector<int32_t>> pos(msg.entries.size());
    for (size_t j = 0; j < msg.entries.size(); ++j) {
      const KvQueryRows& en = msg.entries[j];
      auto it = pool.lentIn.find({p, en.req});
      if (it == pool.lentIn.end())
        return setError(attnRemoteError,
                        "attnKvAttention: rank %d sent queries of its request %lld, of which this rank "
                        "holds no blocks", p, (long long)en.req);
      pos[j].resize(size_t(en.rows));
      std::memcpy(pos[j].data(), en.pos, pos[j].size() * sizeof(int32_t));
      b.reqs[j].rows = en.rows;
      b.reqs[j].pos = pos[j].data();  // the vector's buffer moves with it
      b.reqs[j].q = en.q;
      lentSlots(pool, it->second, &b.reqs[j].slots, &b.reqs[j].tokens);
    }
    // The owner waits for a reply only when it sent query rows: an empty
    // one would stay unmatched and be taken by its next receive from us.
    if (total == 0) continue;
    batches.push_back(std::move(b));
    positions.push_back(std::move(pos));
  }
  std::vector<int> servedTo;
  ATTN_CHECK(compute->serve(batches, [&](size_t i) {
    const int p = batches[i].peer;
    const attnResult_t r = e.isend(p, served[p].data(), served[p].size() * sizeof(float), &sreq[p]);
    if (r == attnSuccess) servedTo.push_back(p);
    return r;
  }));

  // 3. Our own blocks, then the replies as they arrive.
  std::vector<KvOwnWork> work;
  for (size_t i = 0; i < a.reqs.size(); ++i) {
    KvOwnWork w;
    w.r0 = a.qOffsets[i];
    w.rows = a.qOffsets[i + 1] - w.r0;
    ownSlots(pool, pool.own.at(a.reqs[i]), &w.slots, &w.tokens);
    if (w.rows > 0 && !w.slots.empty()) work.push_back(std::move(w));
  }
  ATTN_CHECK(compute->own(work));
  while (!pendingReplies.empty()) {
    size_t k = 0;
    ATTN_CHECK(e.waitAny(pendingReplies.data(), pendingReplies.size(), &k));
    const int p = replyFrom[k];
    if (pendingReplies[k]->bytes != replies[p].size() * sizeof(float))
      return setError(attnRemoteError, "attnKvAttention: rank %d replied %zu bytes, %zu expected", p,
                      pendingReplies[k]->bytes, replies[p].size() * sizeof(float));
    std::vector<std::pair<int32_t, int32_t>> ranges;
    for (size_t i : sentTo[p]) ranges.push_back({a.qOffsets[i], a.qOffsets[i + 1] - a.qOffsets[i]});
    ATTN_CHECK(compute->fold(replies[p], ranges));
    pendingReplies.erase(pendingReplies.begin() + long(k));
    replyFrom.erase(replyFrom.begin() + long(k));
  }
  for (int p : servedTo) ATTN_CHECK(e.wait(&sreq[p]));
  guard.done();
  return compute->finish();
}

}  // namespace attn
