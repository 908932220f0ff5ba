// Topology on real communicators: local discovery, the proximity rank and
// splits by locality on processes with per-rank ATTN_HOSTID / ATTN_RACKID,
// ATTN_TOPO_FILE overrides (and refusal of a bad file), ATTN_TOPO_DUMP_FILE,
// the probe, and attnCommTopoDump's buffer contract.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/topo_settings.h"
#include "support/multirank.h"
#include "topology/fabric_json.h"
#include "topology/fabric_model.h"
#include "topology/local_view.h"

using namespace attn_test;

namespace {

std::string tempPath(const char* name) {
  return std::string("/tmp/attn_topo_test_") + std::to_string(getpid()) + "_" + name;
}

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string dump(attnComm_t comm, int format) {
  size_t size = 0;
  EXPECT_EQ(attnCommTopoDump(comm, format, nullptr, &size), attnSuccess);
  std::string s(size, '\0');
  EXPECT_EQ(attnCommTopoDump(comm, format, s.data(), &size), attnSuccess) << attnGetLastError(comm);
  s.resize(size ? size - 1 : 0);
  return s;
}

TEST(Topology, LocalViewIsSane) {
  attn::LocalView v = attn::discoverLocalView(attn::discoveryOptionsFromEnv());
  const attn::MachineView& m = v.machine;
  EXPECT_FALSE(m.source.empty());
  EXPECT_GE(m.pus, 1);
  EXPECT_GE(m.cores, 1);
  EXPECT_LE(m.cores, m.pus);
  ASSERT_FALSE(m.numa.empty());
  for (const attn::NumaInfo& n : m.numa) EXPECT_FALSE(n.cpus.empty()) << "NUMA node " << n.os;
  EXPECT_FALSE(v.boundCpus.empty());
  EXPECT_GE(v.numaNode, 0);
  EXPECT_LT(v.gpu, int(m.gpus.size()));
  EXPECT_LT(v.bestNic, int(m.nics.size()));
  for (const attn::NicInfo& n : m.nics) {
    EXPECT_FALSE(n.name().empty());
    EXPECT_EQ(n.hopsToGpu.size(), m.gpus.size());
    EXPECT_GE(n.rateGbps, 0);
  }
  std::string text = attn::describeLocalView(v);
  if (!v.hasRdma()) EXPECT_NE(text.find("RDMA: no RDMA devices"), std::string::npos) << text;
  attn::LocalSummary s = attn::summarize(v);
  EXPECT_EQ(s.numaNode, v.numaNode);
  EXPECT_EQ(s.gpuCount, int(m.gpus.size()));
  EXPECT_EQ(s.nicCount, int(m.nics.size()));
  EXPECT_EQ(s.boundCpus, int(v.boundCpus.size()));
}

TEST(Topology, SysfsFallbackIsSane) {
  attn::MachineView m;
  ASSERT_TRUE(attn::discoverWithSysfs(&m));
  EXPECT_EQ(m.source, "sysfs");
  EXPECT_GE(m.pus, 1);
  ASSERT_FALSE(m.numa.empty());
  EXPECT_FALSE(m.numa[0].cpus.empty());
}

TEST(Topology, CpuLists) {
  EXPECT_EQ(attn::cpuListString({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(attn::parseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(attn::parseCpuList("garbage,5-2").empty());
}

// 8 processes interleaved over 2 racks x 2 hosts: rank r on rack r%2, host r%4.
TEST(Topology, ProximityRankAndSplitTypesOnProcesses) {
  RunOptions opts;
  opts.child_setup = [](int rank) {
    setenv("ATTN_HOSTID", ("host" + std::to_string(rank % 4)).c_str(), 1);
    setenv("ATTN_RACKID", ("rack" + std::to_string(rank % 2)).c_str(), 1);
  };
  RunProcesses(8, [](int rank, int n, attnComm_t& comm) {
    const std::vector<int> order = {0, 4, 2, 6, 1, 5, 3, 7};
    auto pos = [&](const std::vector<int>& v) { return int(std::find(v.begin(), v.end(), rank) - v.begin()); };
    int topo = -1;
    ATTN_ASSERT_OK(comm, attnCommTopoRank(comm, &topo));
    EXPECT_EQ(topo, pos(order));
    EXPECT_EQ(comm->topoOrder, order);
    EXPECT_EQ(comm->fabric->tierBetween(0, 4), attn::Tier::kHost);
    EXPECT_EQ(comm->fabric->tierBetween(0, 2), attn::Tier::kRack);
    EXPECT_EQ(comm->fabric->tierBetween(0, 1), attn::Tier::kCluster);

    struct Want {
      int type;
      std::vector<int> members;  // old ranks, in new-rank order; empty: NULL
    };
    const std::vector<std::vector<int>> hosts = {{0, 4}, {2, 6}, {1, 5}, {3, 7}};
    const std::vector<std::vector<int>> racks = {{0, 4, 2, 6}, {1, 5, 3, 7}};
    const std::vector<int> leaders = {0, 2, 1, 3};
    std::vector<Want> wants = {
        {attnSplitTypeHost, hosts[size_t((rank % 4) == 0 ? 0 : (rank % 4) == 2 ? 1 : (rank % 4) == 1 ? 2 : 3)]},
        {attnSplitTypeRack, racks[size_t(rank % 2)]},
        {attnSplitTypeHostLeaders, rank < 4 ? leaders : std::vector<int>{}},
        {attnSplitTypeProximity, order},
    };
    for (const Want& w : wants) {
      attnComm_t sub = nullptr;
      ATTN_ASSERT_OK(comm, attnCommSplitType(comm, w.type, 0, &sub, nullptr));
      if (w.members.empty()) {
        EXPECT_EQ(sub, nullptr) << "type " << w.type;
        continue;
      }
      ASSERT_NE(sub, nullptr) << "type " << w.type;
      int count = 0, me = -1;
      ATTN_EXPECT_OK(sub, attnCommCount(sub, &count));
      ATTN_EXPECT_OK(sub, attnCommUserRank(sub, &me));
      EXPECT_EQ(count, int(w.members.size())) << "type " << w.type;
      EXPECT_EQ(me, pos(w.members)) << "type " << w.type;
      // The sub-communicator's own proximity order is the identity: its
      // ranks were numbered in proximity order already.
      int subTopo = -1;
      ATTN_EXPECT_OK(sub, attnCommTopoRank(sub, &subTopo));
      EXPECT_EQ(subTopo, me) << "type " << w.type;
      ATTN_EXPECT_OK(sub, attnCommDestroy(sub));
    }
    attnComm_t bad = nullptr;
    EXPECT_EQ(attnCommSplitType(comm, 42, 0, &bad, nullptr), attnInvalidArgument);
    (void)n;
  }, opts);
}

TEST(Topology, SplitTypeKeyOrdersFirst) {
  RunThreads(3, [](int rank, int, attnComm_t& comm) {
    attnComm_t sub = nullptr;
    ATTN_ASSERT_OK(comm, attnCommSplitType(comm, attnSplitTypeHost, -rank, &sub, nullptr));
    int me = -1;
    ATTN_EXPECT_OK(sub, attnCommUserRank(sub, &me));
    EXPECT_EQ(me, 2 - rank);  // larger rank, smaller key: first
    attnCommDestroy(sub);
  });
}

TEST(Topology, FileOverridesTiersAndRacksAndDumpLoadsBack) {
  const std::string file = tempPath("override.json"), out = tempPath("dump.json");
  writeText(file, R"({"attncomm_topology": 1,
    "tiers": {"host": {"bandwidth_Bps": 1234567, "latency_s": 0.002}},
    "ranks": [{"rank": 0, "rack": "A"}, {"rank": 2, "rack": "B"}]})");
  RunOptions opts;
  opts.env = {{"ATTN_TOPO_FILE", file}, {"ATTN_TOPO_DUMP_FILE", out}};
  std::vector<std::string> dumps(3);
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    const attn::FabricModel& m = *comm->fabric;
    EXPECT_EQ(m.link(attn::Tier::kHost).bandwidth, 1234567);
    EXPECT_EQ(m.link(attn::Tier::kHost).latency, 0.002);
    EXPECT_EQ(m.link(attn::Tier::kHost).source, "file");
    EXPECT_STREQ(comm->peers[0].rackId, "A");  // the collectives see the file's racks
    EXPECT_STREQ(comm->peers[2].rackId, "B");
    EXPECT_EQ(m.tierBetween(0, 2), attn::Tier::kHost);  // racks do not split a host
    dumps[size_t(rank)] = dump(comm, attnTopoFormatJson);
  }, opts);
  EXPECT_EQ(dumps[0], dumps[1]);
  EXPECT_EQ(dumps[0], dumps[2]);
  std::string text, err;
  ASSERT_TRUE(attn::readTextFile(out, &text, &err)) << err;
  EXPECT_EQ(text, dumps[0]);
  attn::FabricModel back;
  ASSERT_TRUE(attn::fabricFromJson(text, &back, &err)) << err;
  EXPECT_EQ(back.nranks(), 3);
  EXPECT_EQ(back.link(attn::Tier::kHost).bandwidth, 1234567);
  EXPECT_EQ(back.ranks[2].rack, "B");
  unlink(file.c_str());
  unlink(out.c_str());
}

TEST(Topology, BadFileFailsInitWithClearError) {
  const std::string file = tempPath("bad.json");
  writeText(file, "{\"tiers\": {\"rack\": {\"bandwidth_Bps\": 0}}}");
  for (const std::string& path : {file, tempPath("missing.json")}) {
    attn_test::ScopedEnv env({{"ATTN_TOPO_FILE", path}});
    attnComm_t comms[2] = {nullptr, nullptr};
    EXPECT_NE(attnCommInitAll(comms, 2, nullptr), attnSuccess);
    std::string err = attnGetLastError(nullptr);
    EXPECT_NE(err.find("ATTN_TOPO_FILE"), std::string::npos) << err;
    EXPECT_NE(err.find(path == file ? "must be > 0" : "cannot open"), std::string::npos) << err;
  }
  unlink(file.c_str());
}

TEST(Topology, ProbeGivesEveryRankTheSameFigures) {
  RunOptions opts;
  opts.env = {{"ATTN_TOPO_PROBE", "1"}};
  std::vector<std::string> dumps(3);
  RunThreads(3, [&](int rank, int, attnComm_t& comm) {
    const attn::TierLink& host = comm->fabric->link(attn::Tier::kHost);
    EXPECT_EQ(host.source, "probe");
    EXPECT_GT(host.bandwidth, 0);
    EXPECT_GT(host.latency, 0);
    EXPECT_EQ(comm->fabric->link(attn::Tier::kRack).source.find("probe"), std::string::npos);
    dumps[size_t(rank)] = dump(comm, attnTopoFormatJson);
  }, opts);
  EXPECT_EQ(dumps[0], dumps[1]);
  EXPECT_EQ(dumps[0], dumps[2]);
}

TEST(Topology, DumpBufferContract) {
  RunThreads(1, [](int, int, attnComm_t& comm) {
    size_t size = 0;
    ATTN_ASSERT_OK(comm, attnCommTopoDump(comm, attnTopoFormatText, nullptr, &size));
    ASSERT_GT(size, 1u);
    std::vector<char> small(4, 'x');
    size_t cap = small.size();
    EXPECT_EQ(attnCommTopoDump(comm, attnTopoFormatText, small.data(), &cap), attnInvalidArgument);
    EXPECT_EQ(cap, size);
    EXPECT_EQ(small[0], 'x');
    EXPECT_NE(std::string(attnGetLastError(comm)).find("too small"), std::string::npos);
    EXPECT_EQ(attnCommTopoDump(comm, 7, nullptr, &size), attnInvalidArgument);
    EXPECT_EQ(attnCommTopoDump(comm, attnTopoFormatText, nullptr, nullptr), attnInvalidArgument);
    std::string text = dump(comm, attnTopoFormatText);
    EXPECT_NE(text.find("local view of rank 0"), std::string::npos) << text;
    EXPECT_NE(dump(comm, attnTopoFormatDot).find("graph attncomm_topology"), std::string::npos);
    int topo = -1;
    ATTN_EXPECT_OK(comm, attnCommTopoRank(comm, &topo));
    EXPECT_EQ(topo, 0);
    EXPECT_EQ(attnCommTopoRank(comm, nullptr), attnInvalidArgument);
  });
}

}  // namespace
