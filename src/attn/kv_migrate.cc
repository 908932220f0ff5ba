// Three rounds, every rank with every peer:
//  1. try_move: per peer, the releases owed to it and the moves bound for it
//     ({owner, req, blocks}). The destination applies every release first,
//     then grants whole moves in the order their messages arrived (first
//     come, first served) while its free blocks last, reserving the slots.
//  2. replies: per move, the blocks granted (all or none).
//  3. move: per granted move, a header {indices, positions} and then each
//     block's K and V as messages of their own, sent from the source's
//     slots and received straight into the slots reserved for them: no
//     packing, no unpacking, and the transport overlaps the blocks. The
//     source frees its slots once the sends complete, the destination files
//     the blocks, and the owner (one of the two) records where they are now.
// Only full blocks move (the last block of a request stays with its owner),
// so every block on the wire has the same size.
#include "src/attn/kv_migrate.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "src/attn/break_on_early_exit.h"
#include "src/attn/kv_exchange.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/attn/device/kv_device.h"

namespace attn {

namespace {

// A move's header: the blocks' indices in the owner's request, then their
// token positions.
size_t headerBytes(const KvPool& pool, int64_t blocks) {
  return size_t(blocks) * (sizeof(int64_t) + size_t(pool.config().block_tokens) * sizeof(int32_t));
}

// The blocks a granted move sends, by index in the owner's request.
std::vector<int64_t> blocksToSend(KvPool& pool, const attnKvMove_t& m) {
  std::vector<int64_t> idx;
  if (m.owner == pool.rank()) {
    idx = pool.movableOwn(pool.own.at(m.req));
  } else {
    for (const KvLentBlock& b : pool.lentIn.at({m.owner, m.req})) idx.push_back(b.index);
    std::sort(idx.begin(), idx.end());
  }
  idx.resize(size_t(m.num_blocks));
  return idx;
}

// Takes a move's blocks out of this pool's books: writes the header and
// returns the slots to send from (given back to the pool only after the
// sends complete).
std::vector<int64_t> detachBlocks(KvPool& pool, const attnKvMove_t& m, std::vector<char>* header) {
  const std::vector<int64_t> idx = blocksToSend(pool, m);
  const size_t pb = size_t(pool.config().block_tokens) * sizeof(int32_t);
  header->resize(headerBytes(pool, int64_t(idx.size())));
  char* ip = header->data();
  char* pp = ip + idx.size() * sizeof(int64_t);
  std::vector<KvLentBlock>* lent = m.owner == pool.rank() ? nullptr : &pool.lentIn.at({m.owner, m.req});
  std::vector<int64_t> slots;
  for (int64_t i : idx) {
    int64_t slot;
    if (!lent) {
      KvBlockLoc& b = pool.own.at(m.req).blocks[size_t(i)];
      slot = b.slot;
      b.holder = m.dst;
      b.slot = -1;
    } else {
      auto it = std::find_if(lent->begin(), lent->end(), [&](const KvLentBlock& b) { return b.index == i; });
      slot = it->slot;
      lent->erase(it);
    }
    std::memcpy(ip, &i, sizeof(i));
    std::memcpy(pp, pool.pos(slot), pb);
    ip += sizeof(i);
    pp += pb;
    slots.push_back(slot);
  }
  if (lent && lent->empty()) pool.lentIn.erase({m.owner, m.req});
  return slots;
}

// Files received blocks (K and V already in their reserved slots).
attnResult_t fileBlocks(KvPool& pool, int from, const TryMove& t, const std::vector<int64_t>& slots,
                        const std::vector<char>& header) {
  const size_t pb = size_t(pool.config().block_tokens) * sizeof(int32_t);
  const char* ip = header.data();
  const char* pp = ip + slots.size() * sizeof(int64_t);
  const int me = pool.rank();
  for (int64_t slot : slots) {
    int64_t i;
    std::memcpy(&i, ip, sizeof(i));
    pool.writePositions(slot, 0, pp, pool.config().block_tokens);
    ip += sizeof(i);
    pp += pb;
    if (t.owner == me) {
      KvOwnRequest& r = pool.own.at(t.req);
      if (i < 0 || size_t(i) >= r.blocks.size() || r.blocks[size_t(i)].holder != from)
        return setError(attnRemoteError, "rank %d returned block %lld of request %lld, which it does not hold",
                        from, (long long)i, (long long)t.req);
      r.blocks[size_t(i)] = {me, slot, pool.config().block_tokens};
    } else {
      std::vector<KvLentBlock>& held = pool.lentIn[{t.owner, t.req}];
      if (i < 0 || std::any_of(held.begin(), held.end(), [&](const KvLentBlock& b) { return b.index == i; }))
        return setError(attnRemoteError, "rank %d sent block %lld of its request %lld, %s", from, (long long)i,
                        (long long)t.req, i < 0 ? "which no request has" : "which this rank holds already");
      held.push_back({i, slot});
    }
  }
  return attnSuccess;
}

// Host pools: the bytes move straight from and into the slots.
class HostBlockIo : public KvBlockIo {
 public:
  explicit HostBlockIo(KvPool& pool) : pool_(pool) {}
  attnResult_t move(const std::vector<KvBlockTransfer>& blocks) override {
    Engine& e = *pool_.comm()->engine;
    const size_t bb = pool_.blockBytes();
    std::unique_ptr<Request[]> reqs(new Request[2 * blocks.size()]);
    BreakOnEarlyExit guard(e);
    for (int sends = 0; sends < 2; ++sends)  // receives posted first
      for (size_t i = 0; i < blocks.size(); ++i) {
        const KvBlockTransfer& b = blocks[i];
        if (b.send != bool(sends)) continue;
        if (b.send) {
          ATTN_CHECK(e.isend(b.peer, pool_.k(b.slot), bb, &reqs[2 * i]));
          ATTN_CHECK(e.isend(b.peer, pool_.v(b.slot), bb, &reqs[2 * i + 1]));
        } else {
          ATTN_CHECK(e.irecv(b.peer, pool_.k(b.slot), bb, &reqs[2 * i]));
          ATTN_CHECK(e.irecv(b.peer, pool_.v(b.slot), bb, &reqs[2 * i + 1]));
        }
      }
    for (size_t i = 0; i < 2 * blocks.size(); ++i) ATTN_CHECK(e.wait(&reqs[i]));
    guard.done();
    return attnSuccess;
  }

 private:
  KvPool& pool_;
};

std::unique_ptr<KvBlockIo> makeBlockIo(KvPool& pool) {
#if ATTN_HAVE_CUDA
  if (pool.onDevice()) return makeKvBlockIoDevice(pool);
#endif
  return std::make_unique<HostBlockIo>(pool);
}

// Slots whose blocks were sent: back to the pool when the call leaves,
// after (declared before) the guard that breaks the engine on an early
// exit, so no transfer still reads them.
struct SlotsToFree {
  KvPool& pool;
  std::vector<int64_t> slots;
  ~SlotsToFree() {
    for (int64_t s : slots) pool.giveSlot(s);
  }
};

}  // namespace

attnResult_t checkKvMovesShape(const KvPool& pool, const std::vector<attnKvMove_t>& moves) {
  const int me = pool.rank(), n = pool.nranks();
  for (size_t i = 0; i < moves.size(); ++i) {
    const attnKvMove_t& m = moves[i];
    ATTN_REQUIRE(m.src == me, "moves[%zu].src = %d: a rank passes only its own moves (this is rank %d)", i, m.src, me);
    ATTN_REQUIRE(m.dst >= 0 && m.dst < n && m.dst != me, "moves[%zu].dst = %d is not a peer (nranks %d)", i, m.dst, n);
    ATTN_REQUIRE(m.owner == m.src || m.owner == m.dst,
                 "moves[%zu].owner = %d: blocks move between their owner and a peer (src %d, dst %d)", i,
                 m.owner, m.src, m.dst);
    ATTN_REQUIRE(m.num_blocks >= 0, "moves[%zu].num_blocks = %lld < 0", i, (long long)m.num_blocks);
  }
  return attnSuccess;
}

attnResult_t checkKvMoves(KvPool& pool, const std::vector<attnKvMove_t>& moves) {
  ATTN_CHECK(checkKvMovesShape(pool, moves));
  const int me = pool.rank();
  std::map<KvReqKey, int64_t> asked;
  for (size_t i = 0; i < moves.size(); ++i) {
    const attnKvMove_t& m = moves[i];
    int64_t have = 0;
    if (m.owner == me) {
      auto it = pool.own.find(m.req);
      ATTN_REQUIRE(it != pool.own.end() || m.num_blocks == 0, "moves[%zu]: request %lld is not a request of this rank", i,
                   (long long)m.req);
      if (it != pool.own.end()) have = int64_t(pool.movableOwn(it->second).size());
    } else {
      auto it = pool.lentIn.find({m.owner, m.req});
      if (it != pool.lentIn.end()) have = int64_t(it->second.size());
    }
    int64_t& total = asked[{m.owner, m.req}];
    total += m.num_blocks;
    ATTN_REQUIRE(total <= have,
                 "moves[%zu]: %lld blocks of request %lld of rank %d asked to move, but this rank can "
                 "move %lld of them (full blocks it holds; a request's last block stays with its owner)",
                 i, (long long)total, (long long)m.req, m.owner, (long long)have);
  }
  return attnSuccess;
}

attnResult_t kvMigrate(KvPool& pool, const std::vector<attnKvMove_t>& moves, attnResult_t localStatus,
                       std::vector<int64_t>* granted) {
  Engine& e = *pool.comm()->engine;
  const int me = pool.rank(), n = pool.nranks();
  granted->assign(moves.size(), 0);

  // 1. try_move (with the releases owed).
  std::vector<std::vector<char>> out(static_cast<size_t>(n));
  std::vector<std::vector<size_t>> movesTo(static_cast<size_t>(n));  // indices into moves, per destination
  if (localStatus == attnSuccess) {
    for (size_t i = 0; i < moves.size(); ++i)
      if (moves[i].num_blocks > 0) movesTo[size_t(moves[i].dst)].push_back(i);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      WireOut w;
      pool.writeReleases(p, w);
      w.put(uint32_t(movesTo[p].size()));
      for (size_t i : movesTo[p]) w.put(TryMove{moves[i].owner, 0, moves[i].req, moves[i].num_blocks});
      out[p] = std::move(w.bytes());
    }
  }
  // What each peer may send: the releases it may owe us, and at most one
  // move per block of its pool.
  std::vector<KvPeerLimits> limits(static_cast<size_t>(n));
  std::vector<uint64_t> maxBytes(static_cast<size_t>(n), 0);
  for (int p = 0; p < n; ++p) {
    KvPeerLimits& lim = limits[size_t(p)] = pool.limitsFor(p, "attnKvMigrate");
    lim.maxMoves = size_t(p) < pool.peerCapacity.size() ? uint64_t(pool.peerCapacity[size_t(p)]) : 0;
    maxBytes[size_t(p)] = kvMigrateRequestBound(lim);
  }
  PeerExchange got;
  ATTN_CHECK(exchangeWithPeers(e, me, n, "attnKvMigrate", localStatus, out, maxBytes, &got));
  pool.releasesDelivered();

  std::vector<std::vector<TryMove>> asks(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    KvMigrateRequest req;
    ATTN_CHECK(parseKvMigrateRequest(got.in[p].data(), got.in[p].size, limits[size_t(p)], &req));
    pool.applyReleases(p, req.releases);
    asks[p] = std::move(req.moves);
  }
  // Grants, first come first served.
  std::vector<std::vector<int64_t>> grants(static_cast<size_t>(n));
  std::vector<std::vector<std::vector<int64_t>>> reservedSlots(static_cast<size_t>(n));
  for (int p : got.arrival) {
    grants[p].assign(asks[p].size(), 0);
    reservedSlots[p].resize(asks[p].size());
    for (size_t j = 0; j < asks[p].size(); ++j) {
      const TryMove& t = asks[p][j];
      const bool returning = t.owner == me;
      const bool known = returning ? pool.own.count(t.req) > 0 : t.owner == p;
      if (!known || t.blocks <= 0 || !pool.takeSlots(t.blocks, &reservedSlots[p][j])) continue;
      grants[p][j] = t.blocks;
    }
  }

  // 2. replies.
  std::unique_ptr<Request[]> rreq(new Request[2 * size_t(n)]);
  std::vector<std::vector<int64_t>> replies(static_cast<size_t>(n));
  {
    BreakOnEarlyExit guard(e);
    std::vector<Request*> all;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (!movesTo[p].empty()) {
        replies[p].resize(movesTo[p].size());
        ATTN_CHECK(e.irecv(p, replies[p].data(), replies[p].size() * sizeof(int64_t), &rreq[2 * p]));
        all.push_back(&rreq[2 * p]);
      }
      if (!asks[p].empty()) {
        ATTN_CHECK(e.isend(p, grants[p].data(), grants[p].size() * sizeof(int64_t), &rreq[2 * p + 1]));
        all.push_back(&rreq[2 * p + 1]);
      }
    }
    for (Request* r : all) ATTN_CHECK(e.wait(r));
    guard.done();
  }

  // 3. move. Per peer, messages match in posting order: for each granted
  // move in the order of the try_move message, its header; then the K and
  // V of the blocks of every move, in the same order (KvBlockIo).
  std::unique_ptr<KvBlockIo> io = makeBlockIo(pool);
  SlotsToFree sentSlots{pool, {}};
  std::vector<std::vector<char>> headersOut(moves.size());
  std::vector<std::vector<std::vector<char>>> headersIn(static_cast<size_t>(n));
  std::vector<KvBlockTransfer> blocks;
  for (int p = 0; p < n; ++p) {
    if (p == me || asks[p].empty()) continue;
    headersIn[p].resize(asks[p].size());
    for (size_t j = 0; j < asks[p].size(); ++j) {
      if (grants[p][j] == 0) continue;
      headersIn[p][j].resize(headerBytes(pool, grants[p][j]));
      for (int64_t slot : reservedSlots[p][j]) blocks.push_back({p, false, slot});
    }
  }
  // The moves granted to us leave the books before any byte is sent.
  std::vector<std::pair<int, size_t>> outMoves;  // (peer, move index), in posting order
  for (int p = 0; p < n; ++p) {
    for (size_t j = 0; j < movesTo[p].size(); ++j) {
      const size_t i = movesTo[p][j];
      const int64_t g = replies[p][j];
      if (g != 0 && g != moves[i].num_blocks)
        return setError(attnRemoteError, "attnKvMigrate: rank %d granted %lld of %lld blocks", p,
                        (long long)g, (long long)moves[i].num_blocks);
      if (g == 0) continue;
      std::vector<int64_t> slots;
      {
        std::lock_guard<std::mutex> books(pool.booksMu);
        slots = detachBlocks(pool, moves[i], &headersOut[i]);
      }
      sentSlots.slots.insert(sentSlots.slots.end(), slots.begin(), slots.end());
      outMoves.push_back({p, i});
      for (int64_t slot : slots) blocks.push_back({p, true, slot});
      (*granted)[i] = g;
    }
  }

  std::deque<Request> reqs;  // stable addresses
  BreakOnEarlyExit guard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me || asks[p].empty()) continue;
    for (size_t j = 0; j < asks[p].size(); ++j)
      if (grants[p][j] != 0) ATTN_CHECK(e.irecv(p, headersIn[p][j].data(), headersIn[p][j].size(), &reqs.emplace_back()));
  }
  for (const auto& [p, i] : outMoves)
    ATTN_CHECK(e.isend(p, headersOut[i].data(), headersOut[i].size(), &reqs.emplace_back()));
  for (Request& r : reqs) ATTN_CHECK(e.wait(&r));
  ATTN_CHECK(io->move(blocks));
  guard.done();
  {
    std::lock_guard<std::mutex> books(pool.booksMu);
    for (int p = 0; p < n; ++p)
      for (size_t j = 0; j < asks[p].size(); ++j)
        if (grants[p][j] != 0) ATTN_CHECK(fileBlocks(pool, p, asks[p][j], reservedSlots[p][j], headersIn[p][j]));
  }
  int64_t sent = 0, refused = 0;
  for (size_t i = 0; i < moves.size(); ++i) {
    sent += (*granted)[i];
    if ((*granted)[i] == 0 && moves[i].num_blocks > 0) ++refused;
  }
  ATTN_INFO(kLogAttn, "attnKvMigrate: sent %lld blocks, %lld moves refused, %lld free blocks left",
            (long long)sent, (long long)refused, (long long)pool.freeBlocks());
  return attnSuccess;
}

}  // namespace attn
