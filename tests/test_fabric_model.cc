// The fabric model as pure functions: tiers between synthetic ranks, the
// proximity order and its groups, default tier figures, the JSON schema
// (round trip, overrides, malformed files) and the text/DOT printers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "topology/fabric_json.h"
#include "topology/fabric_model.h"
#include "topology/fabric_print.h"
#include "topology/json.h"
#include "topology/proximity_order.h"

namespace attn {
namespace {

RankPlace place(int rank, const std::string& host, const std::string& rack, int numa = 0,
                const char* gpu = "") {
  RankPlace p;
  p.rank = rank;
  p.pid = 1000 + rank;
  p.host = host;
  p.rack = rack;
  std::memset(&p.local, 0, sizeof(p.local));
  p.local.numaNode = numa;
  p.local.numaNodes = 2;
  p.local.boundCpus = 4;
  p.local.cores = 32;
  std::strncpy(p.local.gpuBusId, gpu, sizeof(p.local.gpuBusId) - 1);
  std::strncpy(p.local.bestNic, "mlx5_0", sizeof(p.local.bestNic) - 1);
  p.local.nicCount = 2;
  p.local.rdmaNicCount = 1;
  p.local.bestNicGbps = 200;
  return p;
}

// 8 ranks interleaved over 2 racks x 2 hosts each: rank r on rack r%2, host r%4.
FabricModel interleaved() {
  FabricModel m;
  for (int r = 0; r < 8; ++r)
    m.ranks.push_back(place(r, "host" + std::to_string(r % 4), "rack" + std::to_string(r % 2), r / 4));
  applyDefaultTiers(&m, TransportSet{true, true, false});
  m.finalize();
  return m;
}

TEST(FabricModel, TierBetween) {
  FabricModel m;
  m.ranks = {place(0, "a", "r1", 0, "0000:17:00.0"), place(1, "a", "r1", 0, "0000:17:00.0"),
             place(2, "a", "r1", 1, "0000:65:00.0"), place(3, "b", "r1"), place(4, "c", ""),
             place(5, "d", ""), place(6, "e", "r2")};
  m.finalize();
  EXPECT_EQ(m.tierBetween(0, 1), Tier::kDevice);   // same host, same GPU
  EXPECT_EQ(m.tierBetween(0, 2), Tier::kHost);     // same host, other GPU
  EXPECT_EQ(m.tierBetween(0, 3), Tier::kRack);     // other host, same rack
  EXPECT_EQ(m.tierBetween(4, 5), Tier::kCluster);  // racks unknown: each host its own
  EXPECT_EQ(m.tierBetween(3, 6), Tier::kCluster);  // other rack
  EXPECT_EQ(m.tierBetween(3, 4), Tier::kCluster);
  // CPU-only ranks on one host never share a "device".
  FabricModel c;
  c.ranks = {place(0, "a", ""), place(1, "a", "")};
  c.finalize();
  EXPECT_EQ(c.tierBetween(0, 1), Tier::kHost);
}

TEST(ProximityOrder, GroupsRacksThenHostsAndIsDeterministic) {
  FabricModel m = interleaved();
  const std::vector<int> expect = {0, 4, 2, 6, 1, 5, 3, 7};
  EXPECT_EQ(m.order(), expect);
  FabricModel again = interleaved();
  EXPECT_EQ(again.order(), m.order());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.order()[size_t(m.topoRank(r))], r);

  const ProximityGroups& g = m.groups();
  ASSERT_EQ(g.racks.size(), 2u);
  ASSERT_EQ(g.hosts.size(), 4u);
  EXPECT_EQ(g.racks[0], (std::vector<int>{0, 4, 2, 6}));
  EXPECT_EQ(g.hosts[1], (std::vector<int>{2, 6}));
  EXPECT_EQ(g.hostLeaders, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(g.rackOf[5], 1);
  EXPECT_EQ(g.hostOf[7], 3);

  // The ring along the order crosses each slow boundary the fewest times:
  // racks twice in all (out and back), hosts once per host boundary.
  long rackCross = 0, hostCross = 0;
  for (size_t i = 0; i < 8; ++i) {
    Tier t = m.tierBetween(m.order()[i], m.order()[(i + 1) % 8]);
    rackCross += t == Tier::kCluster;
    hostCross += t == Tier::kRack;
  }
  EXPECT_EQ(rackCross, 2);
  EXPECT_EQ(hostCross, 2);
}

TEST(ProximityOrder, PureFunctionOnKeys) {
  // Within a host: NUMA node, then GPU, then rank; unknown racks per host.
  std::vector<ProximityKey> keys = {
      {"x", "h1", 1, "b"}, {"x", "h1", 0, "b"}, {"x", "h1", 0, "a"}, {"y", "h2", 0, ""},
      {"x", "h1", 1, "a"}};
  EXPECT_EQ(proximityOrder(keys), (std::vector<int>{2, 1, 4, 0, 3}));
  EXPECT_TRUE(proximityOrder({}).empty());
  // A host that appears in two racks (inconsistent ids) is two groups, never a crash.
  std::vector<ProximityKey> odd = {{"r1", "h", 0, ""}, {"r2", "h", 0, ""}, {"r1", "h", 0, ""}};
  auto o = proximityOrder(odd);
  EXPECT_EQ(o, (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(proximityGroups(odd, o).hosts.size(), 2u);
}

TEST(FabricModel, DefaultTiersFollowTransports) {
  FabricModel m = interleaved();
  EXPECT_EQ(m.link(Tier::kHost).source, "default shm");
  EXPECT_NE(m.link(Tier::kRack).source.find("tcp"), std::string::npos);
  EXPECT_DOUBLE_EQ(m.link(Tier::kRack).bandwidth, 200e9 / 8 * 0.9);  // the NIC's rate
  EXPECT_DOUBLE_EQ(m.link(Tier::kCluster).bandwidth, m.link(Tier::kRack).bandwidth / 2);
  applyDefaultTiers(&m, TransportSet{true, true, true});
  EXPECT_NE(m.link(Tier::kRack).source.find("ucx"), std::string::npos);
  EXPECT_LT(m.link(Tier::kRack).latency, 10e-6);
  m.ranks[3].local.rdmaNicCount = 0;  // one host without RDMA: TCP for all
  applyDefaultTiers(&m, TransportSet{true, true, true});
  EXPECT_NE(m.link(Tier::kRack).source.find("tcp"), std::string::npos);
  for (int t = 0; t < kTierCount; ++t) EXPECT_GT(m.tiers[t].bandwidth, 0);
}

TEST(FabricJson, RoundTrip) {
  FabricModel m = interleaved();
  m.tiers[1] = {12.5e9, 1.25e-6, "probe"};
  m.ranks[3].pid = 123456789;
  std::string text = fabricToJson(m);
  FabricModel back;
  std::string err;
  ASSERT_TRUE(fabricFromJson(text, &back, &err)) << err << "\n" << text;
  ASSERT_EQ(back.nranks(), m.nranks());
  for (int r = 0; r < m.nranks(); ++r) {
    const RankPlace &a = m.ranks[size_t(r)], &b = back.ranks[size_t(r)];
    EXPECT_EQ(a.host, b.host);
    EXPECT_EQ(a.rack, b.rack);
    EXPECT_EQ(a.pid, b.pid);
    EXPECT_EQ(std::memcmp(&a.local, &b.local, sizeof(a.local)), 0) << "rank " << r;
  }
  for (int t = 0; t < kTierCount; ++t) {
    EXPECT_EQ(back.tiers[t].bandwidth, m.tiers[t].bandwidth);  // exact: %.17g
    EXPECT_EQ(back.tiers[t].latency, m.tiers[t].latency);
    EXPECT_EQ(back.tiers[t].source, m.tiers[t].source);
  }
  EXPECT_EQ(back.order(), m.order());
  EXPECT_EQ(fabricToJson(back), text);
}

TEST(FabricJson, OverridesTiersAndRacks) {
  FabricModel m;
  m.ranks = {place(0, "alpha/boot-1", ""), place(1, "beta/boot-2", ""), place(2, "gamma", ""),
             place(3, "alpha/boot-1", "")};
  applyDefaultTiers(&m, TransportSet{true, true, false});
  m.finalize();
  EXPECT_EQ(m.tierBetween(0, 1), Tier::kCluster);
  std::string err;
  const char* file = R"({
    "attncomm_topology": 1,
    "comment": "two racks",
    "tiers": {"rack": {"bandwidth_Bps": 5e9, "latency_s": 4e-6}, "cluster": {"latency_s": 0.0001}},
    "hosts": {"alpha": {"rack": "R1"}, "beta/boot-2": {"rack": "R1"}},
    "ranks": [{"rank": 2, "rack": "R2"}]
  })";
  ASSERT_TRUE(applyFabricOverrides(file, &m, &err)) << err;
  EXPECT_EQ(m.ranks[0].rack, "R1");  // matched by hostname before '/'
  EXPECT_EQ(m.ranks[1].rack, "R1");
  EXPECT_EQ(m.ranks[2].rack, "R2");
  EXPECT_EQ(m.tierBetween(0, 1), Tier::kRack);
  EXPECT_EQ(m.tierBetween(0, 3), Tier::kHost);
  EXPECT_EQ(m.tierBetween(1, 2), Tier::kCluster);
  EXPECT_EQ(m.link(Tier::kRack).bandwidth, 5e9);
  EXPECT_EQ(m.link(Tier::kRack).latency, 4e-6);
  EXPECT_EQ(m.link(Tier::kRack).source, "file");
  EXPECT_TRUE(m.link(Tier::kRack).fromFile);
  EXPECT_EQ(m.link(Tier::kCluster).latency, 1e-4);
  EXPECT_FALSE(m.link(Tier::kHost).fromFile);
  EXPECT_EQ(m.order(), (std::vector<int>{0, 3, 1, 2}));  // rack R1 (alpha, beta), then R2

  EXPECT_FALSE(applyFabricOverrides(R"({"ranks": [{"rank": 9, "rack": "x"}]})", &m, &err));
  EXPECT_NE(err.find("rank 9"), std::string::npos) << err;
}

TEST(FabricJson, RejectsMalformedFilesClearly) {
  struct Case {
    std::string text, expect;
  };
  std::vector<Case> cases = {
      {"", "expected a value"},
      {"{", "expected a quoted key"},
      {"[1, 2]", "top level: expected an object"},
      {"{\"tiers\": {\"hostt\": {}}}", "unknown tier"},
      {"{\"tiers\": {\"host\": {\"bandwidth_Bps\": -1}}}", "must be > 0"},
      {"{\"tiers\": {\"host\": {\"bandwith_Bps\": 1}}}", "unknown key"},
      {"{\"tiers\": {\"host\": {\"latency_s\": \"fast\"}}}", "expected a number"},
      {"{\"attncomm_topology\": 2}", "not supported"},
      {"{\"speed\": 1}", "unknown top-level key"},
      {"{\"tiers\": {}} x", "unexpected text"},
      {"{\"a\": 1e999}", "out of range"},
      {"{\"a\": \"unterminated", "unterminated string"},
      {"{\"a\": \"bad\\q\"}", "unknown escape"},
      {"{\"a\": 01}", "expected ',' or '}'"},
      {"{\"a\": -}", "malformed number"},
      {"{\"a\": \"\\ud800\"}", "surrogate"},
      {std::string(10000, '['), "nested deeper"},
      {"{\"hosts\": {\"h\": {\"rack\": 5}}}", "hosts.h.rack: expected a string"},
      {"{\"ranks\": [{\"rank\": 0.5}]}", "expected an integer"},
      {"{\"ranks\": [{\"host\": \"h\"}]}", "missing \"rank\""},
      {"{\"ranks\": [{\"rank\": 0, \"host\": \"" + std::string(100, 'h') + "\"}]}", "longer than"},
  };
  for (const Case& c : cases) {
    FabricModel m = interleaved();
    std::string err;
    EXPECT_FALSE(applyFabricOverrides(c.text, &m, &err)) << c.text.substr(0, 80);
    EXPECT_NE(err.find(c.expect), std::string::npos) << "input: " << c.text.substr(0, 80) << "\nerror: " << err;
  }
  // Whole-model loads also need consistent ranks.
  std::vector<Case> loads = {
      {"{}", "ranks: missing"},
      {"{\"ranks\": [{\"rank\": 0, \"host\": \"a\"}, {\"rank\": 0, \"host\": \"b\"}]}", "listed twice"},
      {"{\"ranks\": [{\"rank\": 1, \"host\": \"a\"}]}", "out of range"},
      {"{\"ranks\": [{\"rank\": 0}]}", "has no host"},
  };
  for (const Case& c : loads) {
    FabricModel m;
    std::string err;
    EXPECT_FALSE(fabricFromJson(c.text, &m, &err)) << c.text;
    EXPECT_NE(err.find(c.expect), std::string::npos) << "input: " << c.text << "\nerror: " << err;
  }
  // The error names the line and column.
  FabricModel m;
  std::string err;
  EXPECT_FALSE(fabricFromJson("{\n  \"ranks\": [\n    {\"rank\": 0,,}\n  ]\n}", &m, &err));
  EXPECT_NE(err.find("line 3, column"), std::string::npos) << err;
}

TEST(Json, ParsesStringsAndNumbers) {
  JsonValue v;
  std::string err;
  ASSERT_TRUE(parseJson(R"({"s": "a\"b\\c\n\u00e9\ud83d\ude00", "n": -1.5e3, "t": true, "z": null, "a": []})", &v, &err))
      << err;
  EXPECT_EQ(v.find("s")->string, "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.find("n")->number, -1500);
  EXPECT_TRUE(v.find("t")->boolean);
  EXPECT_EQ(v.find("z")->kind, JsonValue::kNull);
  EXPECT_EQ(v.find("a")->kind, JsonValue::kArray);
  EXPECT_EQ(v.find("missing"), nullptr);
  JsonValue back;
  ASSERT_TRUE(parseJson(jsonQuote(v.find("s")->string), &back, &err)) << err;
  EXPECT_EQ(back.string, v.find("s")->string);
  EXPECT_EQ(jsonNumber(3), "3");
  EXPECT_EQ(std::stod(jsonNumber(0.1)), 0.1);
}

TEST(FabricPrint, TextAndDot) {
  FabricModel m = interleaved();
  std::string text = fabricToText(m);
  EXPECT_NE(text.find("8 rank(s), 4 host(s), 2 rack(s)"), std::string::npos) << text;
  for (const char* tier : {"device", "host", "rack", "cluster"}) EXPECT_NE(text.find(tier), std::string::npos);
  EXPECT_NE(text.find("host leaders: 0 2 1 3"), std::string::npos) << text;
  std::string dot = fabricAsGraphviz(m);
  EXPECT_EQ(dot.rfind("graph attncomm_topology {", 0), 0u);
  EXPECT_NE(dot.find("subgraph cluster_rack1"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_host3"), std::string::npos);
  EXPECT_NE(dot.find("r6 -- r1 [color=red"), std::string::npos) << dot;  // the rack crossing
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '{'), std::count(dot.begin(), dot.end(), '}'));
}

}  // namespace
}  // namespace attn
