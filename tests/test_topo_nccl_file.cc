// NCCL topology files (topology/nccl_topo_xml.*): Azure's published files
// and small hand-written ones give the right GPU-NIC pairs and NUMA nodes;
// malformed or hostile files give one-line errors with the file and line;
// the file lays over a discovered machine; HWLOC_XMLFILE that hwloc cannot
// load is reported instead of passed over.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "src/core/topo_settings.h"
#include "topology/local_view.h"
#include "topology/nccl_topo_xml.h"

namespace {

const std::string kData = std::string(ATTN_SOURCE_DIR) + "/tests/data/";

#define NEED_LIBXML2() \
  if (!attn::ncclTopoXmlAvailable()) GTEST_SKIP() << "built without libxml2"

attn::MachineView parse(const std::string& text) {
  attn::MachineView m;
  std::string err;
  EXPECT_TRUE(attn::parseNcclTopoXml(text, "t.xml", &m, &err)) << err;
  return m;
}

std::string parseError(const std::string& text) {
  attn::MachineView m;
  std::string err;
  EXPECT_FALSE(attn::parseNcclTopoXml(text, "t.xml", &m, &err)) << text;
  return err;
}

std::string nicOf(const attn::MachineView& m, size_t gpu) {
  std::vector<int> p = attn::pairGpusWithNics(m);
  return p[gpu] < 0 ? "none" : m.nics[size_t(p[gpu])].name();
}

TEST(NcclTopo, AzureNdv5PairsEachGpuWithTheNicUnderItsSwitch) {
  NEED_LIBXML2();
  attn::MachineView m;
  std::string err;
  ASSERT_TRUE(attn::loadNcclTopoFile(kData + "azure-ndv5-topo.xml", &m, &err)) << err;
  ASSERT_EQ(m.gpus.size(), 8u);
  ASSERT_EQ(m.nics.size(), 8u);
  ASSERT_EQ(m.numa.size(), 2u);
  EXPECT_EQ(m.numa[0].os, 0);
  EXPECT_EQ(m.numa[0].cpus.size(), 48u);
  EXPECT_EQ(m.numa[0].cpus.back(), 47);  // "00000000,0000ffff,ffffffff": CPUs 0-47
  EXPECT_EQ(m.numa[1].cpus.front(), 48);  // "ffffffff,ffff0000,00000000": CPUs 48-95
  EXPECT_EQ(m.numa[1].cpus.back(), 95);
  const char* gpus[] = {"0001", "0002", "0003", "0008", "0009", "000a", "000b", "000c"};
  std::vector<int> pairs = attn::pairGpusWithNics(m);
  for (size_t g = 0; g < 8; ++g) {
    EXPECT_EQ(m.gpus[g].busId, std::string(gpus[g]) + ":00:00.0");
    EXPECT_EQ(m.gpus[g].numaNode, g < 4 ? 0 : 1);
    ASSERT_EQ(pairs[g], int(g));
    EXPECT_EQ(m.nics[g].busId, "010" + std::to_string(g + 1) + ":00:00.0");
    EXPECT_EQ(m.nics[g].hopsToGpu[g], 2);
    EXPECT_EQ(m.nics[g].numaNode, m.gpus[g].numaNode);
    EXPECT_EQ(m.nics[g].linkLayer, "InfiniBand");
  }
  EXPECT_EQ(m.nics[0].hopsToGpu[1], 4);  // another switch on the same CPU
  EXPECT_EQ(m.nics[0].hopsToGpu[7], 6);  // across the CPUs
}

TEST(NcclTopo, AzureNdv4SharesTwoNicsBetweenTwoGpusPerSwitch) {
  NEED_LIBXML2();
  attn::MachineView m;
  std::string err;
  ASSERT_TRUE(attn::loadNcclTopoFile(kData + "azure-ndv4-topo.xml", &m, &err)) << err;
  ASSERT_EQ(m.gpus.size(), 8u);
  ASSERT_EQ(m.numa.size(), 4u);
  std::vector<int> pairs = attn::pairGpusWithNics(m);
  for (size_t g = 0; g < 8; ++g) EXPECT_EQ(pairs[g], int(g)) << "GPU " << m.gpus[g].busId;
}

TEST(NcclTopo, PairsByDeepestCommonSwitch) {
  NEED_LIBXML2();
  // NICs listed before GPUs and in the other order; nested switches.
  attn::MachineView m = parse(R"(<system version="1">
  <cpu numaid="0" affinity="0000000f">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x060400">
        <pci busid="0000:13:00.0" class="0x020000"><nic><net name="eth1" dev="1" speed="100000" port="0"/></nic></pci>
        <pci busid="0000:12:00.0" class="0x030200"/>
      </pci>
      <pci busid="0000:21:00.0" class="0x060400">
        <pci busid="0000:23:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0" speed="400000" port="1" gdr="1"/></nic></pci>
        <pci busid="0000:22:00.0" class="0x030200"/>
      </pci>
    </pci>
  </cpu>
</system>)");
  ASSERT_EQ(m.gpus.size(), 2u);
  ASSERT_EQ(m.nics.size(), 2u);
  EXPECT_EQ(nicOf(m, 0), "eth1");
  EXPECT_EQ(nicOf(m, 1), "mlx5_0");
  EXPECT_EQ(m.nics[0].netdev, "eth1");
  EXPECT_EQ(m.nics[0].rateGbps, 100.0);
  EXPECT_EQ(m.nics[1].rdmaDevice, "mlx5_0");
  EXPECT_EQ(m.nics[1].rateGbps, 400.0);
  EXPECT_EQ(m.nics[1].hopsToGpu[0], 4);
  EXPECT_EQ(m.numa[0].cpus, (std::vector<int>{0, 1, 2, 3}));
}

TEST(NcclTopo, GpuWithoutANicUnderItsSwitchFallsBackToItsNumaNode) {
  NEED_LIBXML2();
  attn::MachineView m = parse(R"(<system version="1">
  <cpu numaid="0" affinity="00ff">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x030200"/>
      <pci busid="0000:12:00.0" class="0x020700"/>
    </pci>
    <pci busid="0000:20:00.0" class="0x060400">
      <pci busid="0000:21:00.0" class="0x030200"/>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ff00">
    <pci busid="0000:40:00.0" class="0x060400">
      <pci busid="0000:41:00.0" class="0x020700"/>
    </pci>
  </cpu>
</system>)");
  ASSERT_EQ(m.gpus.size(), 2u);
  ASSERT_EQ(m.nics.size(), 2u);
  EXPECT_EQ(nicOf(m, 0), "0000:12:00.0");  // same switch
  EXPECT_EQ(nicOf(m, 1), "0000:12:00.0");  // no NIC under 20:00.0: the NIC on NUMA node 0
  EXPECT_EQ(m.nics[1].numaNode, 1);

  // Without PCI distances (sysfs) the NUMA node decides alone.
  attn::MachineView s;
  s.gpus = {{"0000:11:00.0", "g0", 0}, {"0000:41:00.0", "g1", 1}};
  s.nics.resize(2);
  s.nics[0].netdev = "eth0", s.nics[0].numaNode = 1, s.nics[0].hopsToGpu = {-1, -1};
  s.nics[1].netdev = "eth1", s.nics[1].numaNode = 0, s.nics[1].hopsToGpu = {-1, -1};
  EXPECT_EQ(nicOf(s, 0), "eth1");
  EXPECT_EQ(nicOf(s, 1), "eth0");
}

TEST(NcclTopo, NicUnderTheCpuAndUnknownElementsAreTolerated) {
  NEED_LIBXML2();
  attn::MachineView m = parse(R"(<?xml version="1.0"?>
<system version="1" name="x">
  <cpu numaid="0" affinity="1" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:17:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="90" rank="0" gdr="1"><nvlink target="0000:05:00.0" count="18" tclass="0x068000"/></gpu>
    </pci>
    <nic><net name="mlx5_bond_0" dev="0" speed="-1" port="1" guid="0x1" maxconn="131072" gdr="1"/></nic>
    <future thing="1"><deeper/></future>
  </cpu>
</system>)");
  ASSERT_EQ(m.gpus.size(), 1u);
  ASSERT_EQ(m.nics.size(), 1u);
  EXPECT_EQ(m.nics[0].rdmaDevice, "mlx5_bond_0");
  EXPECT_EQ(m.nics[0].rateGbps, 0.0);  // speed -1: unknown
  EXPECT_EQ(m.nics[0].busId, "");
  EXPECT_EQ(m.nics[0].hopsToGpu[0], 2);  // both hang off the CPU
}

struct Bad {
  std::string text, want;
};

TEST(NcclTopo, MalformedFilesGiveLineNumberedOneLineErrors) {
  NEED_LIBXML2();
  const std::string sys = "<system version=\"1\">\n";
  std::string deep = sys + "<cpu numaid=\"0\">\n";
  for (int i = 0; i < 40; ++i) deep += "<pci busid=\"0000:" + std::string(i < 16 ? "0" : "") + [&] {
    char b[8];
    std::snprintf(b, sizeof(b), "%x", i);
    return std::string(b);
  }() + ":00.0\" class=\"0x060400\">\n";
  for (int i = 0; i < 40; ++i) deep += "</pci>\n";
  deep += "</cpu></system>\n";
  std::string many = sys + "<cpu numaid=\"0\">\n";
  for (int i = 0; i < 5000; ++i) many += "<x/>\n";
  many += "</cpu></system>\n";
  std::string gpus = sys + "<cpu numaid=\"0\">\n";
  for (int i = 0; i < 70; ++i) {
    char b[96];
    std::snprintf(b, sizeof(b), "<pci busid=\"0000:%02x:00.0\" class=\"0x030200\"/>\n", i);
    gpus += b;
  }
  gpus += "</cpu></system>\n";
  const std::vector<Bad> bad = {
      {"", "t.xml:"},
      {sys + "<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\" class=\"0x0302\">\n</cpu>", "t.xml:4: "},
      {"<topology/>", "t.xml:1: root element is <topology>"},
      {"<system>\n</system>", "t.xml:1: <system> has no version"},
      {"<system version=\"2\"/>", "only version 1"},
      {sys + "<cpu/>\n</system>", "t.xml:2: <cpu> has no numaid"},
      {sys + "<cpu numaid=\"-1\"/>\n</system>", "t.xml:2: <cpu numaid=\"-1\">: not a NUMA node"},
      {sys + "<cpu numaid=\"0\"/>\n<cpu numaid=\"0\"/>\n</system>", "t.xml:3: <cpu numaid=\"0\"> appears twice"},
      {sys + "<cpu numaid=\"0\" affinity=\"xyz\"/>\n</system>", "t.xml:2: <cpu affinity=\"xyz\">"},
      {sys + "<cpu numaid=\"0\" affinity=\"" + std::string(300, 'f') + "\"/>\n</system>", "longer than 255"},
      {sys + "<cpu numaid=\"0\">\n<pci busid=\"17:00.0\" class=\"0x0302\"/>\n</cpu></system>",
       "t.xml:3: <pci busid=\"17:00.0\">: not a PCI bus id"},
      {sys + "<cpu numaid=\"0\">\n<pci busid=\"0000:17:00.0\"/>\n</cpu></system>",
       "t.xml:3: <pci busid=\"0000:17:00.0\"> has no class"},
      {sys + "<cpu numaid=\"0\">\n<pci busid=\"0000:17:00.0\" class=\"gpu\"/>\n</cpu></system>",
       "class is not a hex number"},
      {sys + "<cpu numaid=\"0\">\n<pci busid=\"0000:17:00.0\" class=\"0x0302\"/>\n"
             "<pci busid=\"0000:17:00.0\" class=\"0x0207\"/>\n</cpu></system>",
       "t.xml:4: <pci busid=\"0000:17:00.0\"> appears twice"},
      {sys + "<cpu numaid=\"0\">\n<nic><net name=\"a b\"/></nic>\n</cpu></system>", "t.xml:3: <net name=\"a b\">"},
      {sys + "<cpu numaid=\"0\">\n<nic><net name=\"a\" speed=\"fast\"/></nic>\n</cpu></system>", "not a speed"},
      {"<!DOCTYPE l [<!ENTITY a \"aaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;\">]>\n<system version=\"&b;\"/>",
       "t.xml:1: <!DOCTYPE is not allowed"},
      {deep, "nested deeper than 32"},
      {many, "more than 4096 elements"},
      {gpus, "more than 64 GPUs"},
  };
  for (const Bad& b : bad) {
    std::string err = parseError(b.text);
    EXPECT_NE(err.find(b.want), std::string::npos) << "error: " << err << "\nwanted: " << b.want;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    EXPECT_EQ(err.rfind("t.xml:", 0), 0u) << err;
  }
  attn::MachineView m;
  std::string err;
  EXPECT_FALSE(attn::loadNcclTopoFile("/nonexistent/topo.xml", &m, &err));
  EXPECT_NE(err.find("/nonexistent/topo.xml: cannot open"), std::string::npos) << err;
}

TEST(NcclTopo, CpuMasks) {
  std::vector<int> c;
  ASSERT_TRUE(attn::parseCpuMask("00000001,80000000", &c));
  EXPECT_EQ(c, (std::vector<int>{31, 32}));
  EXPECT_FALSE(attn::parseCpuMask("", &c));
  EXPECT_FALSE(attn::parseCpuMask("1,,2", &c));
  EXPECT_FALSE(attn::parseCpuMask("123456789", &c));
  EXPECT_FALSE(attn::parseCpuMask(std::string(300 * 9, ','), &c));
}

TEST(NcclTopo, OverlayKeepsLiveNamesAndDevices) {
  NEED_LIBXML2();
  attn::MachineView file;
  std::string err;
  ASSERT_TRUE(attn::loadNcclTopoFile(kData + "azure-ndv5-topo.xml", &file, &err)) << err;
  // A VM's own scan: flat PCI tree, no distances, plus an Ethernet NIC.
  attn::MachineView live;
  live.source = "sysfs";
  live.cores = 96;
  live.pus = 96;
  live.numa = {{0, {0, 1}}};
  live.gpus = {{"0002:00:00.0", "10de:2330", -1}, {"00ff:00:00.0", "10de:2330", -1}};
  attn::NicInfo ib;
  ib.busId = "0102:00:00.0", ib.rdmaDevice = "mlx5_ib1", ib.netdev = "ib1", ib.rateGbps = 400;
  ib.hopsToGpu = {-1, -1};
  attn::NicInfo eth;
  eth.busId = "7870:00:00.0", eth.netdev = "eth0", eth.rateGbps = 100, eth.hopsToGpu = {-1, 3};
  live.nics = {ib, eth};
  attn::overlayNcclTopo(file, &live);
  EXPECT_EQ(live.cores, 96);
  EXPECT_EQ(live.source, "sysfs + NCCL topology " + kData + "azure-ndv5-topo.xml");
  ASSERT_EQ(live.numa.size(), 2u);
  ASSERT_EQ(live.gpus.size(), 9u);  // the file's 8, then the live one it lacks
  EXPECT_EQ(live.gpus[1].name, "10de:2330");
  EXPECT_EQ(live.gpus[8].busId, "00ff:00:00.0");
  ASSERT_EQ(live.nics.size(), 9u);
  EXPECT_EQ(live.nics[1].rdmaDevice, "mlx5_ib1");
  EXPECT_EQ(live.nics[1].netdev, "ib1");
  EXPECT_EQ(live.nics[1].rateGbps, 400.0);
  EXPECT_EQ(live.nics[8].netdev, "eth0");
  for (const attn::NicInfo& n : live.nics) EXPECT_EQ(n.hopsToGpu.size(), 9u);
  EXPECT_EQ(live.nics[8].hopsToGpu[8], 3);  // live distance between live devices
  EXPECT_EQ(live.nics[8].hopsToGpu[0], -1);
  EXPECT_EQ(nicOf(live, 1), "mlx5_ib1");
  EXPECT_EQ(nicOf(live, 8), "eth0");
}

TEST(NcclTopo, DiscoveryUsesTheFileOrSaysWhyNot) {
  attn::DiscoveryOptions o;
  o.ncclTopoFile = kData + "azure-ndv5-topo.xml";
  o.ncclTopoVar = "ATTN_NCCL_TOPO_FILE";
  attn::MachineView m = attn::discoverMachine(o);
  if (!attn::ncclTopoXmlAvailable()) {
    ASSERT_FALSE(m.warnings.empty());
    EXPECT_NE(m.warnings[0].find("built without libxml2"), std::string::npos) << m.warnings[0];
    return;
  }
  EXPECT_TRUE(m.warnings.empty()) << m.warnings[0];
  EXPECT_GE(m.gpus.size(), 8u);
  EXPECT_EQ(m.numa.size(), 2u);
  EXPECT_GE(m.pus, 1);
  o.ncclTopoFile = "/nonexistent/ndv5.xml";
  m = attn::discoverMachine(o);
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_EQ(m.warnings[0].rfind("ATTN_NCCL_TOPO_FILE not used: /nonexistent/ndv5.xml: cannot open", 0), 0u)
      << m.warnings[0];
}

TEST(NcclTopo, EnvironmentNamesTheFile) {
  unsetenv("ATTN_NCCL_TOPO_FILE");
  setenv("NCCL_TOPO_FILE", "/a.xml", 1);
  attn::DiscoveryOptions o = attn::discoveryOptionsFromEnv();
  EXPECT_EQ(o.ncclTopoFile, "/a.xml");
  EXPECT_EQ(o.ncclTopoVar, "NCCL_TOPO_FILE");
  setenv("ATTN_NCCL_TOPO_FILE", "/b.xml", 1);
  o = attn::discoveryOptionsFromEnv();
  EXPECT_EQ(o.ncclTopoFile, "/b.xml");
  setenv("ATTN_NCCL_TOPO_FILE", "none", 1);
  EXPECT_EQ(attn::discoveryOptionsFromEnv().ncclTopoFile, "");
  unsetenv("ATTN_NCCL_TOPO_FILE");
  unsetenv("NCCL_TOPO_FILE");
}

TEST(NcclTopo, HwlocXmlFileThatHwlocCannotLoadIsReported) {
  const std::string bad = "/tmp/attn_hwloc_bad_" + std::to_string(getpid()) + ".xml";
  std::ofstream(bad) << "<topology><object type=\"Machine\"\n";  // cut short
  setenv("HWLOC_XMLFILE", bad.c_str(), 1);  // hwloc reads it from the environment
  attn::DiscoveryOptions o;
  o.hwlocXmlFile = bad;
  attn::MachineView m = attn::discoverMachine(o);
  unsetenv("HWLOC_XMLFILE");
  std::remove(bad.c_str());
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_EQ(m.warnings[0].rfind("HWLOC_XMLFILE=" + bad + ": hwloc could not load it", 0), 0u) << m.warnings[0];
  EXPECT_FALSE(m.numa.empty());  // this machine, discovered instead
  EXPECT_TRUE(attn::discoverMachine(attn::DiscoveryOptions{}).warnings.empty());
}

}  // namespace
