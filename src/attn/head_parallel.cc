// Head-parallel attention (CSPS §3.2.1 SP-NTP; DeepSpeed-Ulysses). Ranks
// hold a share of the sequence for every head; one all-to-all turns that into
// the whole sequence for a share of the heads (head_groups.h), each rank
// computes exact attention for its heads, and a second all-to-all brings
// every rank the outputs of its own rows for all heads. No partial crosses
// the network: a head is computed in full at one rank, so the returns are
// plain outputs in the model's dtype (and the lse in fp32).
//
// Causal work is balanced by construction (every rank sees the whole
// sequence), so no 2N-chunk sharding is needed. Traffic per rank is
// (N-1)/N of its Q, K, V and O, against pass-KV's (N-1) KV blocks; the
// price is that KV heads are replicated when Hkv < N.
//
// Overlap: a rank does not wait for the whole sequence. Its share is a grid
// of (queries from rank a, keys from rank b) pairs; when rank a's message
// arrives every pair it completes is folded in (online softmax), and the
// outputs for a rank go home as soon as its row of the grid is complete.
//
// Messages and schedule: head_parallel.h.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/head_groups.h"
#include "src/attn/head_parallel.h"
#include "src/attn/progress_thread.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {
namespace {

// Copies heads [first, first + count) of each row: from rows of `rowHeads`
// heads to rows of `count`.
void copyHeads(char* dst, const void* src, int64_t rows, int rowHeads, int first, int count,
               size_t headBytes) {
  if (rows == 0) return;  // src may be null then: no pointer arithmetic on it
  const char* s = static_cast<const char*>(src) + first * headBytes;
  const size_t srcRow = rowHeads * headBytes, dstRow = count * headBytes;
  if (count == rowHeads) {
    std::memcpy(dst, src, rows * srcRow);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * dstRow, s + i * srcRow, dstRow);
}

// Our rows for group `g` into `out` (room for the message's total).
void packForGroup(const AttnCall& c, const HeadGroup& g, const HeadsMessage& m, char* out) {
  const HeadBytes hb = headBytesOf(c.cfg);
  packBlockMeta(c.comm->rank, c.numSeqs, c.qOffsets.data(), c.q.pos, c.q.rows, m.qRow, out);
  copyHeads(out + m.q.t0At, c.q.t0, c.q.rows, c.cfg.num_q_heads, g.qBegin, g.q(), hb.qk);
  char* kv = out + m.kvAt;
  packBlockMeta(c.comm->rank, c.numSeqs, c.kvOffsets.data(), c.kv.pos, c.kv.rows, m.kvRow, kv);
  copyHeads(kv + m.kv.t0At, c.kv.t0, c.kv.rows, c.cfg.num_kv_heads, g.kvBegin, g.kv(), hb.qk);
  copyHeads(kv + m.kv.t1At, c.kv.t1, c.kv.rows, c.cfg.num_kv_heads, g.kvBegin, g.kv(), hb.v);
}

// The rows of one rank for our heads, as received.
struct Arrival {
  RowsRef q, kv;
};

attnResult_t viewArrival(const AttnCall& c, int from, const char* data, size_t bytes,
                         const HeadsMessage& m, Arrival* a) {
  BlockView qv, kvv;
  ATTN_CHECK(viewHeadsMessage(c, from, data, bytes, m, &qv, &kvv));
  a->q = RowsRef::of(qv);
  a->kv = RowsRef::of(kvv);
  return attnSuccess;
}

// Our share: the call for our heads only, with one accumulator per rank
// whose queries we attend for, filled pair by pair as ranks' rows arrive.
struct HeadShare {
  AttnCall sub;  // cfg narrowed to our heads; computes and times
  std::vector<Arrival> rows;
  std::vector<bool> arrived;
  std::vector<int> folded;  // key blocks folded into each rank's accumulator
  std::vector<std::vector<float>> o, lse;

  HeadShare(const AttnCall& c, const HeadGroup& g) : sub(narrowedTo(c, g)) {
    const int n = c.comm->nranks;
    rows.resize(n);
    arrived.assign(n, false);
    folded.assign(n, 0);
    o.resize(n);
    lse.resize(n);
    for (int r = 0; r < n; ++r) {
      o[r].resize(static_cast<size_t>(c.qRowsOf[r]) * g.q() * c.cfg.head_dim_v);
      lse[r].resize(static_cast<size_t>(c.qRowsOf[r]) * g.q());
      cpu::initAccumulator(o[r].data(), lse[r].data(), c.qRowsOf[r], g.q(), c.cfg.head_dim_v);
    }
  }
  attnResult_t fold(int queriesOf, int keysOf) {
    ++folded[queriesOf];
    return sub.accumulate(rows[queriesOf].q, rows[keysOf].kv, o[queriesOf].data(), lse[queriesOf].data());
  }
};

}  // namespace

HeadBytes headBytesOf(const attnAttnConfig_t& cfg) {
  const size_t elem = dataTypeSize(cfg.dtype);
  return {elem * size_t(cfg.head_dim), elem * size_t(cfg.head_dim_v)};
}

AttnCall narrowedTo(const AttnCall& c, const HeadGroup& g) {
  AttnCall sub;
  sub.comm = c.comm;
  sub.state = c.state;
  sub.cfg = c.cfg;
  sub.cfg.num_q_heads = g.q();
  sub.cfg.num_kv_heads = g.kv();
  sub.numSeqs = c.numSeqs;
  sub.q.rows = static_cast<int32_t>(*std::max_element(c.qRowsOf.begin(), c.qRowsOf.end()));
  return sub;
}

attnResult_t viewHeadsMessage(const AttnCall& c, int from, const char* data, size_t bytes,
                              const HeadsMessage& m, BlockView* q, BlockView* kv) {
  if (bytes != m.total)
    return setError(attnRemoteError, "head-parallel: rank %d sent %zu bytes, %zu expected", from,
                    bytes, m.total);
  // The rows of `from` for our heads only: its card's rows, narrower rows.
  BlockExpect wq = cardBlock(c, from, from, false), wkv = cardBlock(c, from, from, true);
  wq.rowBytes = m.qRow;
  wkv.rowBytes = m.kvRow;
  ATTN_CHECK(parseBlock(data, m.q.total, wq, q));
  return parseBlock(data + m.kvAt, m.kv.total, wkv, kv);
}

attnResult_t Outbox::pump(ProgressThread& driver, Arrived arrived) {
  if (inflight_ >= 0) {
    if (req_[inflight_].pending()) return attnSuccess;
    ATTN_CHECK(driver.wait(&req_[inflight_]));
    inflight_ = -1;
  }
  if (!open(arrived)) return attnSuccess;
  const Item& m = items_[next_];
  ATTN_CHECK(e_.isend(m.peer, m.data, m.bytes, &req_[next_]));
  inflight_ = static_cast<int>(next_++);
  ATTN_CHECK(driver.kick());
  return attnSuccess;
}

uint64_t Outbox::bytes() const {
  uint64_t b = 0;
  for (const Item& m : items_) b += m.bytes;
  return b;
}

attnResult_t runHeadParallel(AttnCall& c) {
  const int n = c.comm->nranks, me = c.comm->rank;
  if (n == 1) return c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data());
  Engine& e = *c.comm->engine;
  const std::vector<HeadGroup> groups = headGroups(c.cfg.num_q_heads, c.cfg.num_kv_heads, n);
  const HeadGroup& mine = groups[me];
  const size_t elem = dataTypeSize(c.cfg.dtype);
  const int Dv = c.cfg.head_dim_v;  // of the outputs going home
  const size_t oHeadBytes = elem * size_t(Dv);
  auto messageTo = [&](int from, int to) { return headsMessage(c, groups, from, to); };

  // Our rows for every group, and the outputs we send home, in shareable
  // memory (same-host peer processes read them through a mapping).
  PeerSlots outSlot(n), retSlot(n);
  for (int p = 0; p < n; ++p)
    if (!groups[p].empty()) outSlot.add(p, messageTo(me, p).total);
  if (!mine.empty())
    for (int p = 0; p < n; ++p)
      if (p != me) retSlot.add(p, ReturnMessage(c.qRowsOf[p], mine.q(), Dv, elem).total);
  ATTN_CHECK(c.state->outgoing.reserve(outSlot.total));
  ATTN_CHECK(c.state->rotation[0].reserve(retSlot.total));
  char* const out = c.state->outgoing.data();
  char* const ret = c.state->rotation[0].data();

  // Receive buffers: filled by the transport, so never zeroed first.
  std::vector<std::unique_ptr<char[]>> in(n), home(n);
  std::unique_ptr<Request[]> inReq(new Request[n]), homeReq(new Request[n]);
  Outbox outbox(e, n, everyGroupHasHeads(groups));
  BreakOnEarlyExit guard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (!mine.empty()) {
      const size_t bytes = messageTo(p, me).total;
      in[p].reset(new char[bytes]);
      ATTN_CHECK(e.irecv(p, in[p].get(), bytes, &inReq[p]));
    }
    if (!groups[p].empty()) {
      const size_t bytes = ReturnMessage(c.q.rows, groups[p].q(), Dv, elem).total;
      home[p].reset(new char[bytes]);
      ATTN_CHECK(e.irecv(p, home[p].get(), bytes, &homeReq[p]));
    }
  }
  auto driver = std::make_unique<ProgressThread>(e, c.comm->prefix);
  auto look = [&] { return arrivedSoFar(groups, me, inReq.get(), homeReq.get()); };
  for (int s = 1; s < n; ++s) {
    const int p = (me + s) % n;
    if (groups[p].empty()) continue;
    const HeadsMessage m = messageTo(me, p);
    auto t0 = Clock::now();
    packForGroup(c, groups[p], m, out + outSlot.offset[p]);
    c.stats.computeUs += usSince(t0);  // packing is local work, not waiting
    outbox.queue(Outbox::kRows, p, out + outSlot.offset[p], m.total);
    ATTN_CHECK(outbox.pump(*driver, look()));  // the first leaves while we pack the rest
  }

  double waitUs = 0;
  if (!mine.empty()) {
    HeadShare share(c, mine);
    // A rank's outputs for our heads, home when its row of the grid is full.
    auto finish = [&](int r) -> attnResult_t {
      if (r == me) {
        for (int64_t i = 0; i < c.q.rows; ++i) {
          std::memcpy(&c.accO[(i * c.cfg.num_q_heads + mine.qBegin) * Dv],
                      &share.o[me][i * mine.q() * Dv], sizeof(float) * mine.q() * Dv);
          std::memcpy(&c.accLse[i * c.cfg.num_q_heads + mine.qBegin], &share.lse[me][i * mine.q()],
                      sizeof(float) * mine.q());
        }
        return attnSuccess;
      }
      const ReturnMessage m(c.qRowsOf[r], mine.q(), Dv, elem);
      char* slot = ret + retSlot.offset[r];
      ATTN_CHECK(cpu::convertFromFloat(slot, c.cfg.dtype, share.o[r].data(), share.o[r].size()));
      if (!share.lse[r].empty())  // an empty vector's data() may be null
        std::memcpy(slot + m.lseAt, share.lse[r].data(), share.lse[r].size() * sizeof(float));
      outbox.queue(Outbox::kOutputs, r, slot, m.total);
      return outbox.pump(*driver, look());
    };
    auto take = [&](int a) -> attnResult_t {
      share.arrived[a] = true;
      for (int b = 0; b < n; ++b) {  // a's keys for the queries already here
        if (b == a || !share.arrived[b]) continue;
        ATTN_CHECK(share.fold(b, a));
        ATTN_CHECK(outbox.pump(*driver, look()));
        if (share.folded[b] == n) ATTN_CHECK(finish(b));
      }
      for (int b = 0; b < n; ++b)  // a's queries over every key here
        if (share.arrived[b]) ATTN_CHECK(share.fold(a, b));
      if (share.folded[a] == n) ATTN_CHECK(finish(a));
      return outbox.pump(*driver, look());
    };
    auto nextArrival = [&] {
      for (int p = 0; p < n; ++p)
        if (p != me && !share.arrived[p] && !inReq[p].pending()) return p;
      return -1;
    };

    // Our own rows for our heads need no message, only their slot.
    const HeadsMessage self = messageTo(me, me);
    char* own = out + outSlot.offset[me];
    packForGroup(c, mine, self, own);
    ATTN_CHECK(viewArrival(c, me, own, self.total, self, &share.rows[me]));
    const double before = share.sub.stats.computeUs;
    ATTN_CHECK(take(me));
    ATTN_TRACE(kLogAttn, "heads [%d, %d): own rows %.0f us", mine.qBegin, mine.qEnd,
               share.sub.stats.computeUs - before);
    for (int left = n - 1; left > 0;) {
      auto t0 = Clock::now();
      ATTN_CHECK(driver->waitFor([&] { return nextArrival() >= 0 || outbox.movable(look()); }));
      waitUs += usSince(t0);
      ATTN_CHECK(outbox.pump(*driver, look()));
      const int a = nextArrival();
      if (a < 0) continue;
      ATTN_CHECK(driver->wait(&inReq[a]));
      ATTN_CHECK(viewArrival(c, a, in[a].get(), inReq[a].bytes, messageTo(a, me), &share.rows[a]));
      const double computeBefore = share.sub.stats.computeUs;
      ATTN_CHECK(take(a));
      --left;
      ATTN_TRACE(kLogAttn, "heads: rows of rank %d folded in %.0f us", a,
                 share.sub.stats.computeUs - computeBefore);
    }
    c.stats.computeUs += share.sub.stats.computeUs;
  }
  // What is still queued leaves now, one message at a time.
  {
    auto t0 = Clock::now();
    while (!outbox.drained()) {
      ATTN_CHECK(outbox.pump(*driver, look()));
      if (!outbox.drained()) ATTN_CHECK(driver->waitFor([&] { return outbox.movable(look()); }));
    }
    waitUs += usSince(t0);
  }
  c.stats.bytesSent += outbox.bytes();

  // Our rows' outputs for the other groups' heads.
  for (int p = 0; p < n; ++p) {
    if (p == me || groups[p].empty()) continue;
    auto t0 = Clock::now();
    ATTN_CHECK(driver->wait(&homeReq[p]));
    waitUs += usSince(t0);
    const HeadGroup& g = groups[p];
    const ReturnMessage m(c.q.rows, g.q(), Dv, elem);
    if (homeReq[p].bytes != m.total)
      return setError(attnRemoteError, "head-parallel: outputs from rank %d have %zu bytes, %zu expected",
                      p, homeReq[p].bytes, m.total);
    t0 = Clock::now();
    const char* src = home[p].get();
    const float* lse = reinterpret_cast<const float*>(src + m.lseAt);
    for (int64_t i = 0; i < c.q.rows; ++i) {
      ATTN_CHECK(cpu::convertToFloat(&c.accO[(i * c.cfg.num_q_heads + g.qBegin) * Dv],
                                     src + i * g.q() * oHeadBytes, c.cfg.dtype,
                                     static_cast<size_t>(g.q()) * Dv));
      std::memcpy(&c.accLse[i * c.cfg.num_q_heads + g.qBegin], lse + i * g.q(), sizeof(float) * g.q());
    }
    c.stats.computeUs += usSince(t0);
  }
  c.stats.waitUs += waitUs;
  guard.done();
  return attnSuccess;
}

}  // namespace attn
