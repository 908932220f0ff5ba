// C API of the distributed KV cache: the pool handle, its local calls
// (append, release, stats, placement) and its collectives (migrate,
// attention, rebalance). Collectives check their input locally and tell the
// peers in their first exchange, so bad input on one rank fails the call on
// every rank instead of leaving the others waiting.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "src/attn/attn_config.h"
#include "src/attn/device/device_layout.h"
#include "src/attn/kv_attention.h"
#include "src/attn/kv_migrate.h"
#include "src/attn/kv_plan.h"
#include "src/attn/kv_pool.h"
#include "src/attn/kv_shrink.h"
#include "src/coll/coll.h"
#include "src/core/api_call.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/device/device_route.h"

using namespace attn;

struct attnKvPool {
  // Behind the handle table's check (handle_registry.h): cleared when freed.
  static constexpr uint64_t kMagic = 0xA77B001C5EED0002ull;
  uint64_t magic = kMagic;
  std::unique_ptr<KvPool> impl;
};

namespace {

attnResult_t checkPoolConfig(const attnKvPoolConfig_t& c) {
  ATTN_REQUIRE(c.block_tokens >= 1 && c.block_tokens <= 4096, "config.block_tokens = %d is outside 1 .. 4096",
               c.block_tokens);
  ATTN_REQUIRE(c.num_kv_heads >= 1, "config.num_kv_heads = %d < 1", c.num_kv_heads);
  ATTN_REQUIRE(c.head_dim >= 1 && c.head_dim <= 256, "config.head_dim = %d is outside 1 .. 256", c.head_dim);
  ATTN_REQUIRE(c.dtype == attnFloat32 || c.dtype == attnFloat16 || c.dtype == attnBfloat16,
               "config.dtype %d is not attnFloat32, attnFloat16 or attnBfloat16", c.dtype);
  ATTN_REQUIRE(c.capacity_blocks >= 0, "config.capacity_blocks = %lld < 0", (long long)c.capacity_blocks);
  const double bytes = double(c.capacity_blocks) * c.block_tokens * c.num_kv_heads * c.head_dim *
                       double(dataTypeSize(c.dtype)) * 2;
  ATTN_REQUIRE(bytes < double(int64_t(1) << 46), "config asks for a %.3g-byte pool", bytes);
  return attnSuccess;
}

// Every rank's record, all-gathered; status says whether its input was good.
template <typename T>
struct Report {
  int32_t status;
  int32_t reserved;
  T body;
};

template <typename T>
attnResult_t allGatherReports(attnComm* comm, const Report<T>& mine, std::vector<Report<T>>* all) {
  const int n = comm->nranks;
  all->assign(size_t(n), Report<T>{});
  (*all)[size_t(comm->rank)] = mine;
  if (n == 1) return attnSuccess;
  std::vector<Block> blocks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) blocks[size_t(i)] = {i * sizeof(Report<T>), sizeof(Report<T>)};
  return ringAllGatherv(*comm->engine, Ring::identity(comm->rank, n), reinterpret_cast<char*>(all->data()),
                        blocks, chunkBytes(1));
}

template <typename T>
attnResult_t firstBadReport(const std::vector<Report<T>>& all, int me, const char* what) {
  for (size_t r = 0; r < all.size(); ++r)
    if (int(r) != me && all[r].status != attnSuccess)
      return setError(attnRemoteError, "%s: rank %zu could not take part (%s; its own error says why)", what, r,
                      attnGetErrorString(attnResult_t(all[r].status)));
  return attnSuccess;
}

// The pool `pool` names when it is a live one (its memory is read only
// then); else the refusal, its text set.
attnResult_t livePool(const char* what, attnKvPool_t pool, KvPool** out) {
  *out = nullptr;
  const HandleLookup l = pool ? lookupHandle(pool, HandleKind::kKvPool) : HandleLookup{};
  if (!pool || l.state != HandleState::kLive || pool->magic != attnKvPool::kMagic || !pool->impl)
    return badHandle(what, pool, HandleKind::kKvPool, l);
  *out = pool->impl.get();
  return attnSuccess;
}

// `call` is on the pool's communicator (a destroyed one is refused here).
attnResult_t checkPoolUsable(const ApiCall& call, KvPool& p, attnStream_t stream) {
  ATTN_CHECK(call.check());
  ATTN_REQUIRE(stream == nullptr || deviceRoute(p.comm()),
               "a host-memory communicator takes a NULL stream (got %p)", (void*)stream);
  return attnSuccess;
}

// A peer's pool report: what checkPoolConfig asks of a local one. Every
// later bound on what that peer may send rests on its capacity.
attnResult_t checkPeerPool(int peer, const attnKvPoolConfig_t& c) {
  const std::string why = threadLastError();
  if (checkPoolConfig(c) == attnSuccess) return attnSuccess;
  const std::string bad = threadLastError();
  restoreError(attnSuccess, why);
  return setError(attnRemoteError, "attnKvPoolCreate: rank %d reported an impossible pool (%s)", peer, bad.c_str());
}

// A peer's heartbeat (attnKvRebalance): what the planner asks of any
// instance, and the capacity its pool was created with.
attnResult_t checkPeerHeartbeat(const KvPool& pool, int peer, const attnKvInstance_t& in, const attnKvModel_t& m) {
  if (peer == pool.rank()) return attnSuccess;
  const int64_t created = size_t(peer) < pool.peerCapacity.size() ? pool.peerCapacity[size_t(peer)] : -1;
  const std::string why = threadLastError();
  std::string bad;
  if (in.capacity_blocks != created)
    bad = "capacity " + std::to_string(in.capacity_blocks) + ", created with " + std::to_string(created);
  else if (checkKvPlanInput(&in, 1, m) != attnSuccess)
    bad = threadLastError();
  if (bad.empty()) return attnSuccess;
  restoreError(attnSuccess, why);
  return setError(attnRemoteError, "attnKvRebalance: rank %d sent an impossible heartbeat (%s)", peer, bad.c_str());
}

// A collective's place among the pool's local calls (kv_pool.h): taken at
// the call, given back when the work has run (before its stream goes on) or
// was dropped unrun.
class CollectiveTicket {
 public:
  explicit CollectiveTicket(KvPool& p) : pool_(p), seq_(p.enqueueCollective()) {}
  ~CollectiveTicket() { finish(); }
  CollectiveTicket(const CollectiveTicket&) = delete;
  CollectiveTicket& operator=(const CollectiveTicket&) = delete;
  void start() { pool_.startCollective(seq_); }
  void finish() {
    if (!done_.exchange(true)) pool_.endCollective(seq_);
  }

 private:
  KvPool& pool_;
  uint64_t seq_;
  std::atomic<bool> done_{false};
};

// Whether a collective's stream is being captured into a CUDA graph (device
// pools). Asked once per call; a failed query becomes the call's local
// error, which its peers learn.
bool capturedCall(KvPool& p, attnStream_t stream, attnResult_t* local) {
  bool captured = false;
  if (!deviceRoute(p.comm())) return false;
  const attnResult_t r = p.capturing(stream, &captured);
  if (r != attnSuccess && *local == attnSuccess) *local = r;
  return captured;
}

// Runs a collective on the pool in call order: now, on the executor of a
// non-blocking communicator, enqueued on `stream` (device communicator), or
// captured into the graph `stream` captures (capturedCall).
attnResult_t dispatchCollective(KvPool& p, attnStream_t stream, bool captured, const char* name, CommOp body) {
  attnComm* comm = p.comm();
  if (captured)
    // A graph's collective takes its place among the local calls at each
    // launch, not at the capture: it sees the appends made before it.
    return p.captureWork(stream, std::string("attn") + name, [body = std::move(body)](KvPool& pool) {
      CollectiveTicket ticket(pool);
      ticket.start();
      const attnResult_t r = runGuarded(body);
      ticket.finish();
      return r;
    });
  auto ticket = std::make_shared<CollectiveTicket>(p);
  CommOp run = [ticket, body = std::move(body)] {
    ticket->start();
    const attnResult_t r = runGuarded(body);
    ticket->finish();
    return r;
  };
  ticket.reset();  // the closure holds it now
  if (deviceRoute(comm)) return deviceEnqueueWork(comm, stream, std::move(run));
  return dispatch(comm, name, std::move(run));
}

// From the books, where the collective runs: the pool as its place in call
// order sees it.
attnKvInstance_t instanceOf(const KvPool& pool, int pendingRequests, int64_t pendingBlocks) {
  attnKvInstance_t in{};
  in.batch_size = int(pool.own.size());
  in.pending_requests = pendingRequests;
  in.pending_blocks = pendingBlocks;
  in.capacity_blocks = pool.config().capacity_blocks;
  in.used_blocks = in.capacity_blocks - pool.freeBlocks();
  in.longest_req = -1;
  int64_t longest = -1;
  for (const auto& [id, r] : pool.own)
    if (r.tokens > longest) {
      longest = r.tokens;
      in.longest_req = id;
      in.longest_req_blocks = int64_t(pool.movableOwn(r).size());
    }
  return in;
}

}  // namespace

extern "C" attnResult_t attnKvPoolCreate(attnComm_t comm, const attnKvPoolConfig_t* config, attnKvPool_t* pool) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(comm);
    if (pool) *pool = nullptr;
    ATTN_CHECK(call.finish(call.check()));
    ATTN_CHECK(call.finish(waitForQueuedOperations(comm)));
    return call.finish(runGuarded([&]() -> attnResult_t {
      attnResult_t local = pool ? attnSuccess : setError(attnInvalidArgument, "pool is NULL");
      if (local == attnSuccess)
        local = config ? checkPoolConfig(*config) : setError(attnInvalidArgument, "config is NULL");
      Report<attnKvPoolConfig_t> mine{int32_t(local), 0, config && local == attnSuccess ? *config : attnKvPoolConfig_t{}};
      std::vector<Report<attnKvPoolConfig_t>> all;
      ATTN_CHECK(allGatherReports(comm, mine, &all));
      if (local != attnSuccess) return local;
      ATTN_CHECK(firstBadReport(all, comm->rank, "attnKvPoolCreate"));
      std::vector<int64_t> capacities;
      for (size_t r = 0; r < all.size(); ++r) {
        const attnKvPoolConfig_t& o = all[r].body;
        ATTN_CHECK(checkPeerPool(int(r), o));
        capacities.push_back(o.capacity_blocks);
        if (o.block_tokens != config->block_tokens || o.num_kv_heads != config->num_kv_heads ||
            o.head_dim != config->head_dim || o.dtype != config->dtype)
          return setError(attnInvalidUsage,
                          "attnKvPoolCreate: rank %d has blocks of %d tokens x %d kv heads x %d (dtype %d) "
                          "but rank %zu of %d x %d x %d (dtype %d): the block layout must agree",
                          comm->rank, config->block_tokens, config->num_kv_heads, config->head_dim,
                          config->dtype, r, o.block_tokens, o.num_kv_heads, o.head_dim, o.dtype);
      }
      auto h = std::make_unique<attnKvPool>();
      h->impl = std::make_unique<KvPool>(comm, *config);
      ATTN_CHECK(h->impl->allocate());
      h->impl->peerCapacity = std::move(capacities);
      if (!registerHandle(h.get(), HandleKind::kKvPool))
        return setError(attnSystemError, "out of memory for the pool's handle");
      *pool = h.release();
      return attnSuccess;
    }));
  });
}

extern "C" attnResult_t attnKvPoolShrink(attnKvPool_t pool, attnComm_t newcomm, int64_t* lost_reqs, int max_lost,
                                        int* num_lost) {
  return guardedEntry([&]() -> attnResult_t {
    ApiCall call(newcomm);
    if (num_lost) *num_lost = 0;
    ATTN_CHECK(call.finish(call.check()));
    ATTN_CHECK(call.finish(waitForQueuedOperations(newcomm)));
    return call.finish(runGuarded([&]() -> attnResult_t {
      KvPool* live = nullptr;
      attnResult_t local = livePool("attnKvPoolShrink", pool, &live);
      if (local == attnSuccess && (max_lost < 0 || (max_lost > 0 && !lost_reqs)))
        local = setError(attnInvalidArgument, "lost_reqs %p with max_lost = %d", (void*)lost_reqs, max_lost);
      if (local == attnSuccess && newcomm->shrunkFrom != pool->impl->comm())
        local = setError(attnInvalidUsage, "attnKvPoolShrink: newcomm was not made by attnCommShrink from the "
                         "pool's communicator");
      if (local == attnSuccess && deviceRoute(newcomm) != pool->impl->onDevice())
        local = setError(attnInvalidUsage, "attnKvPoolShrink: a %s pool cannot move to a %s communicator",
                         pool->impl->onDevice() ? "device" : "host", deviceRoute(newcomm) ? "device" : "host");
      std::vector<int64_t> lost;
      ATTN_CHECK(kvPoolShrink(local == attnSuccess ? pool->impl.get() : nullptr, newcomm, local, &lost));
      if (lost_reqs) std::copy_n(lost.begin(), std::min<size_t>(lost.size(), size_t(max_lost)), lost_reqs);
      if (num_lost) *num_lost = int(lost.size());
      return attnSuccess;
    }));
  });
}

extern "C" attnResult_t attnKvPoolDestroy(attnKvPool_t pool) {
  return guardedEntry([&]() -> attnResult_t {
    ErrorContext ctx("-");
    clearThreadLastError();
    if (pool == nullptr) return attnSuccess;
    // Only the first destroy of a live pool goes on.
    const HandleLookup l = beginClose(pool, HandleKind::kKvPool);
    if (l.state != HandleState::kLive) return badHandle("attnKvPoolDestroy", pool, HandleKind::kKvPool, l);
    forgetHandle(pool);
    pool->magic = 0;
    delete pool;  // waits for the collectives queued on it
    return attnSuccess;
  });
}

// Local calls: the pool's front is the caller's, so they run on its thread.
// The communicator must be live (its prefix names the rank), not usable.
template <typename F>
attnResult_t localCall(const char* what, attnKvPool_t pool, attnStream_t stream, F f) {
  clearThreadLastError();
  KvPool* p = nullptr;
  ATTN_CHECK(livePool(what, pool, &p));
  ApiCall call(p->comm());
  ATTN_CHECK(call.checkHandle());
  ATTN_REQUIRE(stream == nullptr || p->onDevice(),
               "a host-memory communicator takes a NULL stream (got %p)", (void*)stream);
  return f(*p);
}

extern "C" attnResult_t attnKvAppend(attnKvPool_t pool, int64_t req, const void* k, const void* v,
                                     const int32_t* pos, int n, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    return localCall("attnKvAppend", pool, stream, [&](KvPool& p) { return p.append(req, k, v, pos, n, stream); });
  });
}

extern "C" attnResult_t attnKvRelease(attnKvPool_t pool, int64_t req, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    // The release needs nothing on the stream: the books keep it in its place
    // among the collectives queued there.
    return localCall("attnKvRelease", pool, stream, [&](KvPool& p) -> attnResult_t {
      bool captured = false;
      ATTN_CHECK(p.capturing(stream, &captured));
      if (captured)
        return setError(attnInvalidUsage,
                        "attnKvRelease of request %lld on a stream that is being captured into a CUDA graph: a "
                        "request ends once, so its release cannot be replayed; release it outside the graph",
                        (long long)req);
      return p.release(req);
    });
  });
}

extern "C" attnResult_t attnKvPoolGetStats(attnKvPool_t pool, attnKvPoolStats_t* stats) {
  return guardedEntry([&]() -> attnResult_t {
    return localCall("attnKvPoolGetStats", pool, nullptr, [&](KvPool& p) -> attnResult_t {
      ATTN_REQUIRE(stats != nullptr, "stats is NULL");
      *stats = p.stats();
      return attnSuccess;
    });
  });
}

extern "C" attnResult_t attnKvGetPlacement(attnKvPool_t pool, int64_t req, int64_t* holders, int64_t* tokens) {
  return guardedEntry([&]() -> attnResult_t {
    return localCall("attnKvGetPlacement", pool, nullptr, [&](KvPool& p) { return p.placement(req, holders, tokens); });
  });
}

extern "C" attnResult_t attnKvMigrate(attnKvPool_t pool, const attnKvMove_t* moves, int num_moves,
                                      int64_t* granted, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    clearThreadLastError();
    KvPool* live = nullptr;
    ATTN_CHECK(livePool("attnKvMigrate", pool, &live));
    KvPool& p = *live;
    ApiCall call(p.comm());
    ATTN_CHECK(call.finish(checkPoolUsable(call, p, stream)));
    // Bad moves are reported to the peers in the first exchange, not here.
    // What needs no books is checked now; the rest where the call runs, on
    // the books it moves.
    attnResult_t local = num_moves >= 0 && (num_moves == 0 || moves)
                             ? attnSuccess
                             : setError(attnInvalidArgument, "moves is NULL or num_moves = %d < 0", num_moves);
    std::vector<attnKvMove_t> ms;
    if (local == attnSuccess) {
      ms.assign(moves, moves + num_moves);
      local = checkKvMovesShape(p, ms);
    }
    const bool captured = capturedCall(p, stream, &local);
    return call.finish(dispatchCollective(p, stream, captured, "KvMigrate", [&p, ms, local, granted]() -> attnResult_t {
      std::vector<int64_t> g;
      ATTN_CHECK(kvMigrate(p, ms, local == attnSuccess ? checkKvMoves(p, ms) : local, &g));
      if (granted) std::copy(g.begin(), g.end(), granted);
      return attnSuccess;
    }));
  });
}

extern "C" attnResult_t attnKvAttention(attnKvPool_t pool, int num_reqs, const int64_t* reqs,
                                        const int32_t* q_offsets, const void* q, const int32_t* q_pos,
                                        void* out, float* lse, const attnAttnConfig_t* cfg,
                                        attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    clearThreadLastError();
    KvPool* live = nullptr;
    ATTN_CHECK(livePool("attnKvAttention", pool, &live));
    KvPool& p = *live;
    ApiCall call(p.comm());
    ATTN_CHECK(call.finish(checkPoolUsable(call, p, stream)));
    KvAttnArgs a;
    attnResult_t local = attnSuccess;
    if (num_reqs < 0 || (num_reqs > 0 && (!reqs || !q_offsets)) || !cfg)
      local = setError(attnInvalidArgument, "num_reqs = %d with reqs %p, q_offsets %p; cfg %p", num_reqs,
                       (const void*)reqs, (const void*)q_offsets, (const void*)cfg);
    if (local == attnSuccess) {
      a.reqs.assign(reqs, reqs + num_reqs);
      if (num_reqs > 0) a.qOffsets.assign(q_offsets, q_offsets + num_reqs + 1);
      a.q = q;
      a.out = out;
      a.lse = lse;
      a.hasQPos = q_pos != nullptr;
      local = readAttnConfig(cfg, &a.cfg);
      if (local == attnSuccess) local = checkKvAttnArgs(p, a);
      if (local == attnSuccess && !p.onDevice()) local = checkHostSinks(a.cfg);
#if ATTN_HAVE_CUDA
      if (local == attnSuccess && p.onDevice()) local = checkDeviceSinks(a.cfg);
#endif
    }
    // The positions are read now, as the call may run later (stream,
    // executor); in a CUDA graph, at each launch, as they advance with every
    // decode step.
    const bool captured = capturedCall(p, stream, &local);
    if (local == attnSuccess && a.hasQPos && !captured) a.qPos.assign(q_pos, q_pos + a.rows());
    const int32_t* launchPos = local == attnSuccess && a.hasQPos && captured ? q_pos : nullptr;
    return call.finish(dispatchCollective(p, stream, captured, "KvAttention", [&p, a, local, launchPos] {
      if (!launchPos) return kvAttention(p, a, local);
      KvAttnArgs atLaunch = a;
      atLaunch.qPos.assign(launchPos, launchPos + a.rows());
      return kvAttention(p, atLaunch, local);
    }));
  });
}

extern "C" attnResult_t attnKvRebalance(attnKvPool_t pool, const attnKvModel_t* model, int pending_requests,
                                        int64_t pending_blocks, int64_t* moved, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    clearThreadLastError();
    KvPool* live = nullptr;
    ATTN_CHECK(livePool("attnKvRebalance", pool, &live));
    KvPool& p = *live;
    attnComm* comm = p.comm();
    ApiCall call(comm);
    ATTN_CHECK(call.finish(checkPoolUsable(call, p, stream)));
    attnResult_t local = model ? attnSuccess : setError(attnInvalidArgument, "model is NULL");
    if (local == attnSuccess && (pending_requests < 0 || pending_blocks < 0))
      local = setError(attnInvalidArgument, "pending_requests = %d, pending_blocks = %lld: negative",
                       pending_requests, (long long)pending_blocks);
    const attnKvModel_t m = model ? *model : attnKvModel_t{};
    const bool captured = capturedCall(p, stream, &local);
    return call.finish(dispatchCollective(p, stream, captured, "KvRebalance", [&p, comm, m, local, pending_requests,
                                                                              pending_blocks, moved]() -> attnResult_t {
      struct Heartbeat {
        attnKvInstance_t inst;
        attnKvModel_t model;
      };
      Report<Heartbeat> mine{int32_t(local), 0, {instanceOf(p, pending_requests, pending_blocks), m}};
      std::vector<Report<Heartbeat>> all;
      ATTN_CHECK(allGatherReports(comm, mine, &all));
      if (local != attnSuccess) return local;
      ATTN_CHECK(firstBadReport(all, comm->rank, "attnKvRebalance"));
      std::vector<attnKvInstance_t> insts;
      ATTN_CHECK(checkKvPlanInput(nullptr, 0, m));  // a bad model is every rank's, not a peer's
      for (size_t r = 0; r < all.size(); ++r) {
        if (std::memcmp(&all[r].body.model, &m, sizeof(m)) != 0)
          return setError(attnInvalidUsage,
                          "attnKvRebalance: rank %d and rank %zu passed different models: every rank must "
                          "plan with the same one", comm->rank, r);
        ATTN_CHECK(checkPeerHeartbeat(p, int(r), all[r].body.inst, m));
        insts.push_back(all[r].body.inst);
      }
      std::vector<attnKvMove_t> plan;
      // Every rank plans the same moves from the same heartbeats; a bad model
      // fails everywhere alike.
      ATTN_CHECK(planKvMoves(insts.data(), int(insts.size()), m, &plan));
      std::vector<attnKvMove_t> mineMoves;
      for (const attnKvMove_t& mv : plan)
        if (mv.src == comm->rank) mineMoves.push_back(mv);
      std::vector<int64_t> g;
      ATTN_CHECK(kvMigrate(p, mineMoves, checkKvMoves(p, mineMoves), &g));
      int64_t sent = 0;
      for (int64_t x : g) sent += x;
      if (moved) *moved = sent;
      return attnSuccess;
    }));
  });
}
