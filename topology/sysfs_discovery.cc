// Machine discovery without hwloc: NUMA nodes and CPUs, GPUs and NICs from
// Linux sysfs. No PCI-tree distances (hopsToGpu stays -1).
#include "topology/local_view.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

namespace attn {

namespace {

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// PCI bus id of a sysfs device link ("../../../0000:00:03.0/virtio0" ->
// the last component that looks like a bus id).
std::string busIdOfLink(const std::string& link) {
  char buf[4096];
  ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, size_t(n)), best;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    std::string part = path.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (part.size() == 12 && part[4] == ':' && part[7] == ':' && part[10] == '.') best = part;
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return best;
}

int numaOfPci(const std::string& busId) {
  std::string s = readFirstLine("/sys/bus/pci/devices/" + busId + "/numa_node");
  return s.empty() ? -1 : std::atoi(s.c_str());
}

}  // namespace

std::string readFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

double netdevRateGbps(const std::string& ifname) {
  std::string s = readFirstLine("/sys/class/net/" + ifname + "/speed");  // Mbit/s
  long mbps = s.empty() ? -1 : std::strtol(s.c_str(), nullptr, 10);
  return mbps > 0 ? double(mbps) / 1000.0 : 0.0;
}

bool discoverWithSysfs(MachineView* m) {
  m->source = "sysfs";
  for (const std::string& d : listDir("/sys/devices/system/node")) {
    if (d.rfind("node", 0) != 0 || d.size() < 5) continue;
    NumaInfo n;
    n.os = std::atoi(d.c_str() + 4);
    n.cpus = parseCpuList(readFirstLine("/sys/devices/system/node/" + d + "/cpulist"));
    m->numa.push_back(n);
  }
  std::sort(m->numa.begin(), m->numa.end(),
            [](const NumaInfo& a, const NumaInfo& b) { return a.os < b.os; });
  std::vector<int> online = parseCpuList(readFirstLine("/sys/devices/system/cpu/online"));
  m->pus = int(online.size());
  std::set<std::pair<std::string, std::string>> cores;
  for (int c : online) {
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    cores.insert({readFirstLine(base + "physical_package_id"), readFirstLine(base + "core_id")});
  }
  m->cores = int(cores.size());
  if (m->numa.empty()) {  // kernel without NUMA: one node with every CPU
    NumaInfo n;
    n.os = 0;
    n.cpus = online;
    m->numa.push_back(n);
  }

  for (const std::string& dev : listDir("/sys/bus/pci/devices")) {
    std::string base = "/sys/bus/pci/devices/" + dev + "/";
    unsigned long cls = std::strtoul(readFirstLine(base + "class").c_str(), nullptr, 16) >> 8;
    unsigned long vendor = std::strtoul(readFirstLine(base + "vendor").c_str(), nullptr, 16);
    bool display = cls == 0x0300 || cls == 0x0302 || cls == 0x0380 || cls == 0x1200;
    if (!display || (vendor != 0x10de && vendor != 0x1002)) continue;
    GpuInfo g;
    g.busId = dev;
    g.name = readFirstLine(base + "vendor").substr(2) + ":" + readFirstLine(base + "device").substr(2);
    g.numaNode = numaOfPci(dev);
    m->gpus.push_back(g);
  }

  for (const std::string& ib : listDir("/sys/class/infiniband")) {
    NicInfo n;
    n.rdmaDevice = ib;
    n.busId = busIdOfLink("/sys/class/infiniband/" + ib + "/device");
    n.numaNode = n.busId.empty() ? -1 : numaOfPci(n.busId);
    n.hopsToGpu.assign(m->gpus.size(), -1);
    m->nics.push_back(n);
  }
  for (const std::string& ifname : listDir("/sys/class/net")) {
    // Physical interfaces only: they have a device link (lo, veth, ifb do not).
    std::string bus = busIdOfLink("/sys/class/net/" + ifname + "/device");
    if (bus.empty()) continue;
    auto same = std::find_if(m->nics.begin(), m->nics.end(),
                             [&](const NicInfo& n) { return n.busId == bus; });
    NicInfo* n = same != m->nics.end() ? &*same : nullptr;
    if (!n) {
      m->nics.emplace_back();
      n = &m->nics.back();
      n->busId = bus;
      n->numaNode = numaOfPci(bus);
      n->hopsToGpu.assign(m->gpus.size(), -1);
    }
    if (n->netdev.empty()) {
      n->netdev = ifname;
      n->rateGbps = netdevRateGbps(ifname);
    }
  }
  return true;
}

}  // namespace attn
