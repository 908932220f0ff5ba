#include "src/core/comm.h"

#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include "src/core/auth.h"
#include "src/core/error.h"
#include "topology/host_identity.h"
#include "src/core/log.h"
#include "src/core/topo_init.h"
#include "src/core/topo_settings.h"
#include "src/core/transport_registry.h"

namespace attn {
namespace {

// What each rank publishes at init (all-gathered over the bootstrap).
struct RankCard {
  PeerInfo info;
  uint32_t transportMask;
  uint32_t version;
};

// Transports in the order every rank connects them, by registered name
// (src/core/transport_registry.h); one this build lacks is left out.
struct TransportSlot {
  uint32_t bit;
  TransportMaker create;
};
// UCX comes first: when asked for, it serves every peer (same host or not).
const std::vector<TransportSlot>& transportSlots() {
  static const std::vector<TransportSlot> slots = [] {
    std::vector<TransportSlot> v;
    const std::pair<uint32_t, const char*> order[] = {
        {kTransportUcx, "ucx"}, {kTransportShm, "shm"}, {kTransportTcp, "tcp"}};
    for (const auto& [bit, name] : order)
      if (TransportMaker make = findTransport(name)) v.push_back({bit, make});
    return v;
  }();
  return slots;
}

}  // namespace

bool sameHost(const attnComm* comm, int peer) {
  return comm->peers[peer].hostHash == comm->peers[comm->rank].hostHash;
}

std::string rankPrefix(int rank) {
  const std::string host = thisHostIdentity();
  return "rank " + std::to_string(rank) + " (host " + host.substr(0, host.find('/')) + ", pid " +
         std::to_string(getpid()) + ")";
}

attnResult_t commInit(attnComm* comm, const attnUniqueId& id, int nranks, int rank) {
  comm->rank = rank;
  comm->nranks = nranks;
  comm->id = id;
  const std::string host = thisHostIdentity();
  ErrorContext ctx(comm->prefix);

  ATTN_CHECK(Bootstrap::create(id, rank, nranks, comm->config.timeoutMs, &comm->abortFlag,
                               &comm->bootstrap));

  std::vector<RankCard> cards(nranks);
  RankCard& me = cards[rank];
  me = RankCard{};
  me.info.rank = rank;
  me.info.pid = getpid();
  std::strncpy(me.info.hostId, host.c_str(), sizeof(me.info.hostId) - 1);
  me.info.hostHash = hash64(host.data(), host.size());
  const std::string rack = thisRackIdentity();
  std::strncpy(me.info.rackId, rack.c_str(), sizeof(me.info.rackId) - 1);
  me.info.rackHash = hash64(rack.data(), rack.size());
  // Keyed by the secret: the hash names /dev/shm segments anyone on the
  // host can list, and must tell nothing of the id it comes from.
  const auth::Mac idMac = auth::prove(comm->bootstrap->secret(), "attncomm communicator",
                                      {auth::bytesOf(id)});
  std::memcpy(&me.info.commHash, idMac.bytes, sizeof(me.info.commHash));
  me.transportMask = comm->config.transports;
  me.version = ATTN_VERSION_CODE;
  ATTN_CHECK(comm->bootstrap->allGather(cards.data(), sizeof(RankCard)));

  uint32_t mask = ~0u;
  comm->peers.resize(nranks);
  for (int r = 0; r < nranks; ++r) {
    if (cards[r].version != ATTN_VERSION_CODE)
      return setError(attnInvalidUsage, "rank %d runs attncomm version %u, this rank %u",
                      r, cards[r].version, (unsigned)ATTN_VERSION_CODE);
    if (cards[r].info.commHash != me.info.commHash)
      return setError(attnInvalidUsage, "rank %d joined with another unique id", r);
    comm->peers[r] = cards[r].info;
    mask &= cards[r].transportMask;
  }
  // Fabric model and proximity order (rings follow it): src/core/topo_init.cc.
  ATTN_CHECK(topoBuild(comm, mask));

  // Choose one transport per peer: shared memory on the same host, else TCP.
  std::vector<int> slotOfPeer(nranks, -1);
  const std::vector<TransportSlot>& slots = transportSlots();
  std::vector<std::vector<int>> peersOfSlot(slots.size());
  for (int p = 0; p < nranks; ++p) {
    if (p == rank) continue;
    int chosen = -1;
    for (size_t s = 0; s < slots.size(); ++s) {
      uint32_t bit = slots[s].bit;
      if (!(mask & bit)) continue;
      if (bit == kTransportShm && !sameHost(comm, p)) continue;
      chosen = static_cast<int>(s);
      break;
    }
    if (chosen < 0)
      return setError(attnInvalidUsage,
                      "no allowed transport reaches peer %d (allowed on all ranks: %s; peer on %s)",
                      p, transportListString(mask).c_str(),
                      sameHost(comm, p) ? "this host" : "another host");
    slotOfPeer[p] = chosen;
    peersOfSlot[chosen].push_back(p);
  }

  TransportContext tctx;
  tctx.rank = rank;
  tctx.nranks = nranks;
  tctx.bootstrap = comm->bootstrap.get();
  tctx.peers = comm->peers.data();
  tctx.timeoutMs = comm->config.timeoutMs;
  tctx.abortFlag = &comm->abortFlag;

  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<Connection>> conns(nranks);
  std::vector<int> transportOfPeer(nranks, -1);
  for (size_t s = 0; s < slots.size(); ++s) {
    if (!(mask & slots[s].bit)) continue;  // the same on every rank
    auto t = slots[s].create();
    std::vector<std::unique_ptr<Connection>> made;
    ATTN_CHECK(t->connect(tctx, peersOfSlot[s], &made));
    if (made.size() != peersOfSlot[s].size())
      return setError(attnInternalError, "transport %s made %zu connections for %zu peers",
                      t->name(), made.size(), peersOfSlot[s].size());
    for (size_t i = 0; i < made.size(); ++i) {
      int p = peersOfSlot[s][i];
      conns[p] = std::move(made[i]);
      transportOfPeer[p] = static_cast<int>(transports.size());
    }
    ATTN_INFO(kLogInit, "transport %s: %zu peer(s)", t->name(), peersOfSlot[s].size());
    transports.push_back(std::move(t));
  }

  comm->engine = std::make_unique<Engine>(rank, nranks, comm->config.timeoutMs, &comm->abortFlag);
  comm->engine->attach(std::move(transports), std::move(conns), std::move(transportOfPeer));
  ATTN_CHECK(topoFinish(comm));  // probe (ATTN_TOPO_PROBE), dump, log
  ATTN_CHECK(comm->bootstrap->barrier());
  ATTN_INFO(kLogInit, "communicator ready: rank %d of %d, transports %s, timeout %d ms%s",
            rank, nranks, transportListString(mask).c_str(), comm->config.timeoutMs,
            comm->config.checkSignatures ? ", signature checks on" : "");
  comm->ready.store(true, std::memory_order_release);
  return attnSuccess;
}

void commFree(attnComm* comm) {
  comm->executor.reset();  // runs what is queued first
  if (comm->engine) comm->engine->closeAll();
  comm->engine.reset();
  if (comm->bootstrap) comm->bootstrap->close();
  comm->bootstrap.reset();
}

}  // namespace attn
