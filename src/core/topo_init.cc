#include "src/core/topo_init.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/settings.h"
#include "src/core/topo_settings.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "topology/fabric_json.h"
#include "topology/fabric_model.h"
#include "topology/fabric_print.h"
#include "topology/host_identity.h"
#include "topology/local_view.h"

namespace attn {

namespace {

constexpr uint32_t kTagTopoFile = 0x54500001u;  // "TP": the override file from rank 0

// Rank 0 reads ATTN_TOPO_FILE and sends it (or its error) to every rank, so
// all ranks apply the same overrides even where the file is not visible.
attnResult_t shareTopoFile(attnComm* comm, bool* present, std::string* text) {
  struct Header {
    int64_t status;  // 0 none, 1 file follows, -1 error text follows
    int64_t bytes;
  } h{0, 0};
  std::string payload;
  Bootstrap& b = *comm->bootstrap;
  if (comm->rank == 0) {
    if (auto path = settingString(Setting::kTopoFile)) {
      std::string err;
      if (readTextFile(*path, &payload, &err)) {
        h.status = 1;
      } else {
        h.status = -1;
        payload = "ATTN_TOPO_FILE: " + err;
      }
      h.bytes = int64_t(payload.size());
    }
    for (int r = 1; r < comm->nranks; ++r) {
      ATTN_CHECK(b.send(r, kTagTopoFile, &h, sizeof(h)));
      if (h.bytes) ATTN_CHECK(b.send(r, kTagTopoFile + 1, payload.data(), size_t(h.bytes)));
    }
  } else {
    ATTN_CHECK(b.recv(0, kTagTopoFile, &h, sizeof(h)));
    if (h.bytes < 0 || h.bytes > (int64_t(64) << 20))
      return setError(attnInternalError, "topology file from rank 0 has a bad size %lld", (long long)h.bytes);
    payload.resize(size_t(h.bytes));
    if (h.bytes) ATTN_CHECK(b.recv(0, kTagTopoFile + 1, payload.data(), size_t(h.bytes)));
  }
  if (h.status < 0)
    return setError(attnInvalidArgument, "%s (read by rank 0)", payload.c_str());
  *present = h.status == 1;
  *text = std::move(payload);
  return attnSuccess;
}

void logSummary(const attnComm* comm, const FabricModel& m) {
  if (!logEnabled(LogLevel::kInfo, kLogTopo)) return;
  std::string tiers, order;
  for (int i = 0; i < kTierCount; ++i)
    tiers += std::string(i ? ", " : "") + tierName(Tier(i)) + " " + formatBandwidth(m.tiers[i].bandwidth) +
             " " + formatLatency(m.tiers[i].latency);
  for (size_t i = 0; i < m.order().size() && i < 64; ++i) {
    if (i) order += ' ';
    order += std::to_string(m.order()[i]);
  }
  if (m.order().size() > 64) order += " ...";
  ATTN_INFO(kLogTopo, "topology: %d rank(s), %zu host(s), %zu rack(s); topo rank %d; tiers: %s; order: %s",
            m.nranks(), m.groups().hosts.size(), m.groups().racks.size(), m.topoRank(comm->rank),
            tiers.c_str(), order.c_str());
  if (logEnabled(LogLevel::kTrace, kLogTopo)) ATTN_TRACE(kLogTopo, "local view:\n%s", m.localText.c_str());
}

}  // namespace

attnResult_t topoBuild(attnComm* comm, uint32_t transportMask) {
  const int n = comm->nranks;
  LocalView local = discoverLocalView(discoveryOptionsFromEnv());
  // The machine view is discovered once per process (topology/), so are its
  // warnings said: once, not per communicator.
  static std::once_flag warned;
  std::call_once(warned, [&] {
    for (const std::string& w : local.machine.warnings) ATTN_WARN(kLogTopo, "%s", w.c_str());
  });
  if (!local.hasRdma())
    ATTN_INFO(kLogTopo, "%s; using sockets/shared memory", local.machine.rdmaNote.empty()
                                                              ? "no RDMA devices" : local.machine.rdmaNote.c_str());
  std::vector<LocalSummary> all(static_cast<size_t>(n));
  all[size_t(comm->rank)] = summarize(local);
  ATTN_CHECK(comm->bootstrap->allGather(all.data(), sizeof(LocalSummary)));

  auto m = std::make_shared<FabricModel>();
  m->selfRank = comm->rank;
  m->localText = describeLocalView(local);
  m->ranks.resize(size_t(n));
  for (int r = 0; r < n; ++r) {
    RankPlace& p = m->ranks[size_t(r)];
    const PeerInfo& pi = comm->peers[size_t(r)];
    p.rank = r;
    p.pid = pi.pid;
    p.host.assign(pi.hostId, strnlen(pi.hostId, sizeof(pi.hostId)));
    p.rack.assign(pi.rackId, strnlen(pi.rackId, sizeof(pi.rackId)));
    p.local = all[size_t(r)];
    p.local.gpuBusId[sizeof(p.local.gpuBusId) - 1] = '\0';  // never trust a peer's NUL
    p.local.bestNic[sizeof(p.local.bestNic) - 1] = '\0';
  }
  TransportSet ts;
  ts.shm = transportMask & kTransportShm;
  ts.tcp = transportMask & kTransportTcp;
  ts.ucx = transportMask & kTransportUcx;
  applyDefaultTiers(m.get(), ts);
  m->finalize();

  bool present = false;
  std::string text, err;
  ATTN_CHECK(shareTopoFile(comm, &present, &text));
  if (present) {
    if (!applyFabricOverrides(text, m.get(), &err))
      return setError(attnInvalidArgument, "ATTN_TOPO_FILE %s: %s",
                      settingString(Setting::kTopoFile).value_or("(rank 0's)").c_str(), err.c_str());
    // The file may assign racks: peers carry them too (the collectives read them).
    for (int r = 0; r < n; ++r) {
      PeerInfo& pi = comm->peers[size_t(r)];
      const std::string& rack = m->ranks[size_t(r)].rack;
      std::memset(pi.rackId, 0, sizeof(pi.rackId));
      std::strncpy(pi.rackId, rack.c_str(), sizeof(pi.rackId) - 1);
      pi.rackHash = hash64(rack.data(), rack.size());
    }
  }
  comm->topoOrder = m->order();
  comm->fabric = std::move(m);
  return attnSuccess;
}

attnResult_t topoFinish(attnComm* comm) {
  if (settingBool<Setting::kTopoProbe>()) ATTN_CHECK(topoProbe(comm));
  const FabricModel& m = *comm->fabric;
  if (comm->rank == 0) {
    if (auto path = settingString(Setting::kTopoDumpFile)) {
      std::ofstream out(*path, std::ios::binary | std::ios::trunc);
      out << fabricToJson(m);
      out.close();
      if (!out)
        ATTN_WARN(kLogTopo, "ATTN_TOPO_DUMP_FILE: cannot write %s: %s", path->c_str(), std::strerror(errno));
      else
        ATTN_INFO(kLogTopo, "topology written to %s", path->c_str());
    }
  }
  logSummary(comm, m);
  return attnSuccess;
}

}  // namespace attn
