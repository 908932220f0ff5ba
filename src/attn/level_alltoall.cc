// Level-aware all-to-all of K/V with token dropping (CSPS §3.2.4, CSA), the
// algorithm of attnLevelAttention. Every rank sends each peer the keys it
// keeps for the tier between them (all of them inside a GPU or host when
// keep says so, fewer across racks), in one self-describing block, and
// attends to every block it receives the moment it lands (merge-on-receive). Peers are served nearest first, so the fast local
// blocks are computed while the far ones still cross the slow links.
//
// Keys a peer could not use are not sent either: keys of a sequence the peer
// holds no queries of, and, with a causal mask, keys after the peer's last
// query of that sequence. Dropping them changes nothing in the result (they
// would be masked), only the bytes; which keys are kept is decided first,
// over all of a sequence's keys, so the result is the documented one.
//
// Between two ranks there is one message each way: the keys this rank keeps
// for the pair's tier that the peer can see.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/level_alltoall.h"
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

// The last position each sequence's queries on this rank can see: none
// (INT32_MIN) without query rows, any (INT32_MAX) without a causal mask.
std::vector<int32_t> visibleUpTo(const AttnCall& c) {
  std::vector<int32_t> v(c.numSeqs, INT32_MIN);
  for (int s = 0; s < c.numSeqs; ++s)
    for (int32_t r = c.qOffsets[s]; r < c.qOffsets[s + 1]; ++r)
      v[s] = c.cfg.causal ? std::max(v[s], c.q.pos[r]) : INT32_MAX;
  return v;
}

// Every rank's visibleUpTo, [rank][seq]. Collective.
attnResult_t allVisibleUpTo(AttnCall& c, std::vector<int32_t>* all) {
  const int n = c.comm->nranks, S = c.numSeqs;
  const std::vector<int32_t> mine = visibleUpTo(c);
  all->assign(static_cast<size_t>(n) * S, 0);
  if (S == 0) return attnSuccess;
  std::copy(mine.begin(), mine.end(), all->begin() + static_cast<size_t>(c.comm->rank) * S);
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * S * sizeof(int32_t), S * sizeof(int32_t)};
  return ringAllGatherv(*c.comm->engine, Ring::identity(c.comm->rank, n), reinterpret_cast<char*>(all->data()),
                        blocks, chunkBytes(sizeof(int32_t)));
}

// The rows of `kept` a peer whose queries see up to upTo[s] can use.
KeptRows visibleTo(const AttnCall& c, const KeptRows& kept, const int32_t* upTo) {
  KeptRows out;
  out.offsets.assign(1, 0);
  for (int s = 0; s < c.numSeqs; ++s) {
    for (int32_t i = kept.offsets[s]; i < kept.offsets[s + 1]; ++i)
      if (c.kv.pos[kept.rows[i]] <= upTo[s]) out.rows.push_back(kept.rows[i]);
    out.offsets.push_back(static_cast<int32_t>(out.rows.size()));
  }
  return out;
}

// Packs the kept rows of this rank's keys into a block at `out`.
size_t packKept(const AttnCall& c, const KeptRows& kept, char* out) {
  const int64_t rows = static_cast<int64_t>(kept.rows.size());
  std::vector<int32_t> pos(kept.rows.size());
  for (size_t i = 0; i < kept.rows.size(); ++i) pos[i] = c.kv.pos[kept.rows[i]];
  const BlockLayout l = packBlockMeta(c.comm->rank, c.numSeqs, kept.offsets.data(), pos.data(), rows,
                                      c.kvRowBytes, 2, out);
  const char* k = static_cast<const char*>(c.kv.t0);
  const char* v = static_cast<const char*>(c.kv.t1);
  char* ko = out + l.tensorAt;
  char* vo = ko + l.tensorBytes;
  for (int64_t i = 0; i < rows; ++i) {
    const size_t from = static_cast<size_t>(kept.rows[i]) * c.kvRowBytes;
    std::memcpy(ko + i * c.kvRowBytes, k + from, c.kvRowBytes);
    std::memcpy(vo + i * c.kvRowBytes, v + from, c.kvRowBytes);
  }
  return l.total;
}

}  // namespace

attnResult_t runLevelAllToAll(AttnCall& c, const LevelDrop& drop) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;
  std::vector<int> tierOf(n, int(Tier::kDevice));
  for (int p = 0; p < n; ++p)
    if (p != me && c.comm->fabric) tierOf[p] = int(c.comm->fabric->tierBetween(me, p));

  // The keys kept for each tier some peer sits at, then per peer those it
  // can see, packed into its slot of shareable memory (same-host peer
  // processes map it instead of copying it).
  std::vector<int32_t> upTo;
  ATTN_CHECK(allVisibleUpTo(c, &upTo));
  bool used[kTierCount] = {};
  for (int p = 0; p < n; ++p)
    if (p != me) used[tierOf[p]] = true;
  KeptRows kept[kTierCount];
  for (int t = 0; t < kTierCount; ++t)
    if (used[t]) kept[t] = selectKept(c.numSeqs, c.kvOffsets.data(), drop.importance, drop.keep[t]);
  std::vector<KeptRows> toPeer(n);
  PeerSlots slot(n);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    toPeer[p] = visibleTo(c, kept[tierOf[p]], upTo.data() + static_cast<size_t>(p) * c.numSeqs);
    slot.add(p, BlockLayout::of(c.numSeqs, toPeer[p].rows.size(), c.kvRowBytes, 2).total);
  }
  ATTN_CHECK(c.state->outgoing.reserve(std::max<size_t>(slot.total, 1)));
  std::vector<size_t> blockBytes(n, 0);
  for (int p = 0; p < n; ++p)
    if (p != me) blockBytes[p] = packKept(c, toPeer[p], c.state->outgoing.data() + slot.offset[p]);

  const std::vector<int> peers = peersNearestFirst(*c.comm, tierOf);
  std::vector<std::vector<char>> in(n);
  std::unique_ptr<Request[]> recvReq(new Request[n]), sendReq(new Request[n]);
  BreakOnEarlyExit guard(e);
  for (int p : peers) {
    const int64_t bound = keptBound(c.kvRowsOf[p], c.numSeqs, drop.keep[tierOf[p]]);
    in[p].resize(BlockLayout::of(c.numSeqs, bound, c.kvRowBytes, 2).total);
    ATTN_CHECK(e.irecv(p, in[p].data(), in[p].size(), &recvReq[p]));
  }
  for (int p : peers) {
    ATTN_CHECK(e.isend(p, c.state->outgoing.data() + slot.offset[p], blockBytes[p], &sendReq[p]));
    c.stats.bytesSent += blockBytes[p];
    c.stats.rowsSent += static_cast<int64_t>(toPeer[p].rows.size());
  }
  std::unique_ptr<ProgressThread> driver;
  if (n > 1) {
    driver = std::make_unique<ProgressThread>(e, c.comm->prefix);
    driver->kick();
  }
  // Our own keys, all of them, while the first blocks are on the way.
  ATTN_CHECK(c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data()));

  std::vector<bool> folded(n, false);
  size_t remaining = peers.size();
  int spins = 0;
  const auto waitStart = Clock::now();
  const double computeBefore = c.stats.computeUs;
  while (remaining > 0) {
    bool did = false;
    for (int p : peers) {
      if (folded[p] || recvReq[p].pending()) continue;
      ATTN_CHECK(driver->wait(&recvReq[p]));
      BlockView block;
      ATTN_CHECK(viewBlock(in[p].data(), recvReq[p].bytes, c.kvRowBytes, 2, &block));
      if (block.numSeqs != c.numSeqs || block.rows > c.kvRowsOf[p])
        return setError(attnInternalError, "level attention: block of rank %d has %d sequences and %d rows",
                        p, block.numSeqs, block.rows);
      ATTN_CHECK(c.accumulate(c.q, RowsRef::of(block), c.accO.data(), c.accLse.data()));
      ATTN_TRACE(kLogAttn, "level attention: folded %d of %lld keys of rank %d (tier %s)", block.rows,
                 static_cast<long long>(c.kvRowsOf[p]), p, tierName(Tier(tierOf[p])));
      in[p] = {};  // a folded block's memory goes back at once
      folded[p] = did = true;
      --remaining;
    }
    if (did) {
      spins = 0;
      continue;
    }
    // Nothing landed: sleep on the nearest block still outstanding.
    if (++spins > 50) {
      for (int p : peers)
        if (!folded[p]) {
          ATTN_CHECK(driver->wait(&recvReq[p]));
          break;
        }
    } else {
      std::this_thread::yield();
    }
  }
  for (int p : peers) ATTN_CHECK(driver->wait(&sendReq[p]));
  c.stats.waitUs += usSince(waitStart) - (c.stats.computeUs - computeBefore);
  guard.done();
  return attnSuccess;
}

}  // namespace attn
