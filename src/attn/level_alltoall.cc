// Level-aware all-to-all of K/V with token dropping (CSPS §3.2.4, CSA), the
// algorithm of attnLevelAttention. Every rank sends each peer the keys it
// keeps for the tier between them (all of them inside a GPU or host when
// keep says so, fewer across racks), in one self-describing block, and
// attends to every block it receives the moment it lands (merge-on-receive).
// Peers are served nearest first, so the fast local blocks are computed
// while the far ones still cross the slow links.
//
// Keys a peer could not use are not sent either: keys of a sequence the peer
// holds no queries of, and, with a causal mask, keys after the peer's last
// query of that sequence. Dropping them changes nothing in the result (they
// would be masked), only the bytes; which keys are kept is decided first,
// over all of a sequence's keys, so the result is the documented one.
//
// Keys bound for another host or rack cross each slow boundary once: they
// go to a relay there, which passes them on (level_routes.h: a tree per
// sender over hosts and racks). A block for a subtree holds what any rank
// of it can see.
//
// Messages between two ranks match in posting order (FIFO); a receiver
// posts, per peer, one receive for each block that peer hands it (its own
// and those it relays), and tells them apart by the origin in the header.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/level_alltoall.h"
#include "src/attn/level_routes.h"
#include "src/attn/level_select.h"
#include "src/attn/progress_thread.h"
#include "src/coll/coll.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "topology/fabric_model.h"

namespace attn {
namespace {

// Peers nearest first: by tier, then by distance along the proximity order.
std::vector<int> peersNearestFirst(const attnComm& comm, const std::vector<int>& tierOf) {
  const int n = comm.nranks, me = comm.rank;
  const FabricModel* f = comm.fabric.get();
  auto hops = [&](int p) {
    if (!f) return std::min((p - me + n) % n, (me - p + n) % n);
    const int d = (f->topoRank(p) - f->topoRank(me) + n) % n;
    return std::min(d, n - d);
  };
  std::vector<int> peers;
  for (int p = 0; p < n; ++p)
    if (p != me) peers.push_back(p);
  std::stable_sort(peers.begin(), peers.end(), [&](int a, int b) {
    return tierOf[a] != tierOf[b] ? tierOf[a] < tierOf[b] : hops(a) < hops(b);
  });
  return peers;
}

// The positions each sequence's queries on this rank can see, [seq][lo,
// hi]: none (lo > hi) without query rows; the causal mask bounds hi, a
// sliding window lo and hi (clamped to int32).
std::vector<int32_t> visibleSpans(const AttnCall& c) {
  std::vector<int32_t> v(2 * size_t(c.numSeqs));
  const cpu::VisibleSpan span = cpu::visibleSpan(c.cfg.causal != 0, c.cfg.window_left, c.cfg.window_right);
  for (int s = 0; s < c.numSeqs; ++s) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int32_t r = c.qOffsets[s]; r < c.qOffsets[s + 1]; ++r) {
      lo = std::min(lo, span.bounded ? int64_t(c.q.pos[r]) - span.lo : int64_t(INT32_MIN));
      hi = std::max(hi, span.bounded ? int64_t(c.q.pos[r]) + span.hi : int64_t(INT32_MAX));
    }
    v[2 * size_t(s)] = int32_t(std::clamp<int64_t>(lo, INT32_MIN, INT32_MAX));
    v[2 * size_t(s) + 1] = int32_t(std::clamp<int64_t>(hi, INT32_MIN, INT32_MAX));
    if (lo > hi) v[2 * size_t(s)] = INT32_MAX, v[2 * size_t(s) + 1] = INT32_MIN;
  }
  return v;
}

// Every rank's visibleSpans, [rank][seq][lo, hi]. Collective.
attnResult_t allVisibleSpans(AttnCall& c, std::vector<int32_t>* all) {
  const int n = c.comm->nranks;
  const size_t per = 2 * size_t(c.numSeqs);
  const std::vector<int32_t> mine = visibleSpans(c);
  all->assign(static_cast<size_t>(n) * per, 0);
  if (per == 0) return attnSuccess;
  std::copy(mine.begin(), mine.end(), all->begin() + static_cast<size_t>(c.comm->rank) * per);
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * per * sizeof(int32_t), per * sizeof(int32_t)};
  return ringAllGatherv(*c.comm->engine, Ring::identity(c.comm->rank, n), reinterpret_cast<char*>(all->data()),
                        blocks, chunkBytes(sizeof(int32_t)));
}

// The rows of `kept` a peer whose queries see positions span[s] = [lo, hi]
// can use.
KeptRows visibleTo(const AttnCall& c, const KeptRows& kept, const int32_t* span) {
  KeptRows out;
  out.offsets.assign(1, 0);
  for (int s = 0; s < c.numSeqs; ++s) {
    for (int32_t i = kept.offsets[s]; i < kept.offsets[s + 1]; ++i) {
      const int32_t pos = c.kv.pos[kept.rows[i]];
      if (pos >= span[2 * s] && pos <= span[2 * s + 1]) out.rows.push_back(kept.rows[i]);
    }
    out.offsets.push_back(static_cast<int32_t>(out.rows.size()));
  }
  return out;
}

LevelRoutes routesOf(const attnComm& comm) {
  std::vector<std::string> host(comm.nranks), rack(comm.nranks);
  for (int r = 0; r < comm.nranks; ++r) {
    host[r] = comm.fabric ? comm.fabric->ranks[r].host : std::to_string(r);
    rack[r] = comm.fabric ? comm.fabric->ranks[r].rack : std::string();
  }
  return LevelRoutes(host, rack);
}

// Packs the kept rows of this rank's keys into a block at `out`.
size_t packKept(const AttnCall& c, const KeptRows& kept, char* out) {
  const int64_t rows = static_cast<int64_t>(kept.rows.size());
  std::vector<int32_t> pos(kept.rows.size());
  for (size_t i = 0; i < kept.rows.size(); ++i) pos[i] = c.kv.pos[kept.rows[i]];
  const BlockLayout l = packBlockMeta(c.comm->rank, c.numSeqs, kept.offsets.data(), pos.data(), rows,
                                      c.kvRow(), out);
  const char* k = static_cast<const char*>(c.kv.t0);
  const char* v = static_cast<const char*>(c.kv.t1);
  char* ko = out + l.t0At;
  char* vo = out + l.t1At;
  const size_t kb = c.kRowBytes, vb = c.vRowBytes;
  for (int64_t i = 0; i < rows; ++i) {
    const size_t row = static_cast<size_t>(kept.rows[i]);
    std::memcpy(ko + i * kb, k + row * kb, kb);
    std::memcpy(vo + i * vb, v + row * vb, vb);
  }
  return l.total;
}

}  // namespace

attnResult_t planLevelExchange(AttnCall& c, const LevelDrop& drop, LevelPlan* plan) {
  const int n = c.comm->nranks, me = c.comm->rank, S = c.numSeqs;
  LevelPlan& L = *plan;
  L.routes = routesOf(*c.comm);
  const LevelRoutes& routes = L.routes;
  L.tierOf.assign(n, int(Tier::kDevice));
  std::vector<int>& tierOf = L.tierOf;
  for (int p = 0; p < n; ++p)
    if (p != me && c.comm->fabric) tierOf[p] = int(c.comm->fabric->tierBetween(me, p));
  std::vector<int32_t> spans;
  ATTN_CHECK(allVisibleSpans(c, &spans));
  const std::vector<int> nearest = peersNearestFirst(*c.comm, tierOf);

  // What we send: to each first hop of our tree the keys kept for its tier
  // (the same for its whole subtree) that any rank of the subtree can see.
  bool used[kTierCount] = {};
  for (int p = 0; p < n; ++p)
    if (p != me) used[tierOf[p]] = true;
  KeptRows kept[kTierCount];
  for (int t = 0; t < kTierCount; ++t)
    if (used[t]) kept[t] = selectKept(S, c.kvOffsets.data(), drop.importance, drop.keep[t]);
  // Per first hop: the positions its subtree can see, [seq][lo, hi].
  std::vector<std::vector<int32_t>> seenBy(n);
  std::vector<bool> firstHop(n, false);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const int hop = routes.firstHop(me, r);
    if (!firstHop[hop])
      for (int s = 0; s < S; ++s) seenBy[hop].insert(seenBy[hop].end(), {INT32_MAX, INT32_MIN});
    firstHop[hop] = true;
    const int32_t* theirs = spans.data() + static_cast<size_t>(r) * 2 * S;
    for (int s = 0; s < S; ++s) {
      seenBy[hop][2 * s] = std::min(seenBy[hop][2 * s], theirs[2 * s]);
      seenBy[hop][2 * s + 1] = std::max(seenBy[hop][2 * s + 1], theirs[2 * s + 1]);
    }
  }
  L.sendTo.clear();
  L.toPeer.assign(n, KeptRows());
  for (int p : nearest)
    if (firstHop[p]) {
      L.toPeer[p] = visibleTo(c, kept[tierOf[p]], seenBy[p].data());
      L.sendTo.push_back(p);
    }

  // What we receive: every other rank's block, each from its parent in that
  // rank's tree, in the order the parent sends them (arrival order; a block
  // names its origin). Blocks we relay go on to our children in that tree.
  std::vector<int> count(n, 0);
  std::vector<int64_t> rowsCap(n, 0);
  L.forwards = 0;
  for (int s = 0; s < n; ++s) {
    if (s == me) continue;
    const int p = routes.parent(s, me);
    ++count[p];
    rowsCap[p] = std::max(rowsCap[p], keptBound(c.kvRowsOf[s], S, drop.keep[tierOf[s]]));
    L.forwards += routes.children(s, me).size();
  }
  L.in.clear();
  for (int p : nearest)
    for (int i = 0; i < count[p]; ++i)
      L.in.push_back(LevelPlan::Incoming{p, BlockLayout::of(S, rowsCap[p], c.kvRow()).total});
  return attnSuccess;
}

attnResult_t exchangeLevelBlocks(AttnCall& c, const LevelPlan& L, const std::vector<const char*>& blocks,
                                 const LevelBackend& be) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank, S = c.numSeqs;
  const std::vector<LevelPlan::Incoming>& in = L.in;
  std::vector<char*> buf(in.size());
  for (size_t i = 0; i < in.size(); ++i) buf[i] = be.landing(i);
  std::vector<bool> done(in.size(), false);
  std::unique_ptr<Request[]> recvReq(new Request[in.size()]);
  std::unique_ptr<Request[]> sendReq(new Request[L.sendTo.size() + L.forwards]);
  size_t sends = 0;
  BreakOnEarlyExit guard(e);
  for (size_t i = 0; i < in.size(); ++i) ATTN_CHECK(e.irecv(in[i].from, buf[i], in[i].capacity, &recvReq[i]));
  for (int p : L.sendTo) {
    const size_t bytes = BlockLayout::of(S, L.toPeer[p].rows.size(), c.kvRow()).total;
    ATTN_CHECK(e.isend(p, blocks[p], bytes, &sendReq[sends++]));
    c.stats.bytesSent += bytes;
    c.stats.rowsSent += static_cast<int64_t>(L.toPeer[p].rows.size());
  }
  std::unique_ptr<ProgressThread> driver;
  if (n > 1) {
    driver = std::make_unique<ProgressThread>(e, c.comm->prefix);
    ATTN_CHECK(driver->kick());
  }
  // Our own keys, all of them, while the first blocks are on the way.
  const double computeBefore = c.stats.computeUs;
  ATTN_CHECK(be.foldOwn());

  std::vector<bool> seen(n, false);
  seen[me] = true;
  size_t remaining = in.size();
  int spins = 0;
  const auto waitStart = Clock::now();
  while (remaining > 0) {
    bool did = false;
    for (size_t i = 0; i < in.size(); ++i) {
      if (done[i] || recvReq[i].pending()) continue;
      ATTN_CHECK(driver->wait(&recvReq[i]));
      BlockExpect want;
      want.from = in[i].from;
      want.nranks = n;
      want.numSeqs = S;
      want.maxRows = INT32_MAX;  // its origin's card bounds it, below
      want.rowBytes = c.kvRow();
      want.what = "level attention block";
      BlockView block;
      ATTN_CHECK(parseBlock(buf[i], recvReq[i].bytes, want, &block));
      const int o = block.origin;
      if (o == me || seen[o] || L.routes.parent(o, me) != in[i].from || block.rows > c.kvRowsOf[o])
        return setError(attnRemoteError,
                        "level attention: unexpected block from rank %d (origin %d%s, %d rows of its %lld)",
                        in[i].from, o, o == me || seen[o] ? ", seen already" : "", block.rows,
                        static_cast<long long>(c.kvRowsOf[o]));
      seen[o] = true;
      const std::vector<int> next = L.routes.children(o, me);
      for (int r : next) {  // pass it on first: the ranks behind us wait for it
        ATTN_CHECK(e.isend(r, buf[i], recvReq[i].bytes, &sendReq[sends++]));
        c.stats.bytesSent += recvReq[i].bytes;
      }
      if (!next.empty()) ATTN_CHECK(driver->kick());
      ATTN_CHECK(be.fold(i, block, buf[i], recvReq[i].bytes, !next.empty()));
      ATTN_TRACE(kLogAttn, "level attention: folded %d of %lld keys of rank %d (tier %s%s)", block.rows,
                 static_cast<long long>(c.kvRowsOf[o]), o, tierName(Tier(L.tierOf[o])),
                 in[i].from != o ? ", relayed" : "");
      done[i] = did = true;
      --remaining;
    }
    if (did) {
      spins = 0;
      continue;
    }
    // Nothing landed: sleep until any block does. Not on one in particular:
    // a relayed block waits for its relay to see the original, and two
    // relays each sleeping on the other's forward would never wake.
    if (++spins > 50) {
      ATTN_CHECK(driver->waitFor([&] {
        for (size_t i = 0; i < in.size(); ++i)
          if (!done[i] && !recvReq[i].pending()) return true;
        return false;
      }));
    } else {
      std::this_thread::yield();
    }
  }
  for (size_t i = 0; i < sends; ++i) ATTN_CHECK(driver->wait(&sendReq[i]));
  for (int p = 0; p < n; ++p)
    if (!seen[p]) return setError(attnInternalError, "level attention: no block of rank %d arrived", p);
  c.stats.waitUs += usSince(waitStart) - (c.stats.computeUs - computeBefore);
  guard.done();
  return attnSuccess;
}

attnResult_t runLevelAllToAll(AttnCall& c, const LevelDrop& drop) {
  LevelPlan L;
  ATTN_CHECK(planLevelExchange(c, drop, &L));
  const int n = c.comm->nranks;
  PeerSlots slot(n);
  for (int p : L.sendTo) slot.add(p, BlockLayout::of(c.numSeqs, L.toPeer[p].rows.size(), c.kvRow()).total);
  ATTN_CHECK(c.state->outgoing.reserve(std::max<size_t>(slot.total, 1)));
  std::vector<const char*> blocks(n, nullptr);
  for (int p : L.sendTo) {
    char* out = c.state->outgoing.data() + slot.offset[p];
    packKept(c, L.toPeer[p], out);
    blocks[p] = out;
  }
  // Receive buffers: filled by the transport, so never zeroed; a folded
  // block's memory goes back at once unless it still goes on to others.
  std::vector<std::unique_ptr<char[]>> bufs(L.in.size());
  LevelBackend be;
  be.landing = [&](size_t i) {
    bufs[i].reset(new char[std::max<size_t>(L.in[i].capacity, 1)]);
    return bufs[i].get();
  };
  be.foldOwn = [&] { return c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data()); };
  be.fold = [&](size_t i, const BlockView& block, const char*, size_t, bool relayed) -> attnResult_t {
    ATTN_CHECK(c.accumulate(c.q, RowsRef::of(block), c.accO.data(), c.accLse.data()));
    if (!relayed) bufs[i].reset();
    return attnSuccess;
  };
  return exchangeLevelBlocks(c, L, blocks, be);
}

}  // namespace attn
