// What one rank sees of its machine: NUMA nodes and cores, GPUs, NICs (with
// PCI bus ids, link rates, RDMA capability and distance to the rank's GPU /
// NUMA node). Filled by hwloc (hwloc_discovery.cc) or, without hwloc, by
// sysfs (sysfs_discovery.cc); libibverbs adds RDMA ports and rates
// (verbs_discovery.cc). An NCCL topology file (nccl_topo_xml.*) can replace
// the PCI tree where the VM's own is virtualised.
//
// The machine part is discovered once per process (hwloc's I/O scan is the
// slow part and thread ranks share a process); the rank part (CPU binding,
// NUMA node, chosen GPU) is computed per call from the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {

struct NumaInfo {
  int os = -1;               // OS index (node<os> in sysfs)
  std::vector<int> cpus;     // OS indices of its processing units
};

struct GpuInfo {
  std::string busId;         // "0000:17:00.0"
  std::string name;          // osdev names ("cuda0 nvml0") or the PCI id
  int numaNode = -1;         // local NUMA node, -1 unknown
};

struct NicInfo {
  std::string busId;         // PCI bus id; "" for a NIC seen only by name
  std::string netdev;        // network interface ("eth0"), may be ""
  std::string rdmaDevice;    // OpenFabrics / verbs device ("mlx5_0"), may be ""
  std::string linkLayer;     // "InfiniBand", "Ethernet" (verbs), else ""
  double rateGbps = 0;       // best active port (verbs) or netdev speed; 0 unknown
  int activePorts = 0;       // verbs ports in ACTIVE state
  bool rdma = false;         // verbs device with an active port
  int numaNode = -1;         // local NUMA node, -1 unknown
  std::vector<int> hopsToGpu;  // PCI-tree hops to each MachineView::gpus[i], -1 unknown
  // Device name; a NIC known only from a topology file goes by its bus id.
  std::string name() const { return !rdmaDevice.empty() ? rdmaDevice : !netdev.empty() ? netdev : busId; }
};

// The machine, as seen by this process (shared by its thread ranks).
struct MachineView {
  std::string source;        // "hwloc 2.9.0" or "sysfs"
  int cores = 0;             // physical cores of the machine
  int pus = 0;               // processing units (hardware threads)
  std::vector<NumaInfo> numa;
  std::vector<GpuInfo> gpus;
  std::vector<NicInfo> nics;
  std::string rdmaNote;      // why there is no RDMA ("no RDMA devices (...)"), or ""
  bool thisSystem = true;    // false when hwloc loaded an XML file (HWLOC_XMLFILE)
  std::vector<std::string> warnings;  // what discovery could not honour (logged once)
};

// Where discovery may look besides this machine. The caller fills it (the
// library from the environment: src/core/topo_settings.h); tests and tools
// pass their own.
struct DiscoveryOptions {
  std::string ncclTopoFile;  // ATTN_NCCL_TOPO_FILE, else NCCL_TOPO_FILE ("" none)
  std::string ncclTopoVar;   // which variable named it (for messages)
  std::string hwlocXmlFile;  // HWLOC_XMLFILE: hwloc reads it itself; we check it did
  bool hwlocThisSystem = false;  // HWLOC_THISSYSTEM=1: hwloc cannot tell us
};
// Discovers the machine now (not cached); warnings land in m.warnings.
MachineView discoverMachine(const DiscoveryOptions& opts);

// One rank's view: the machine plus where this rank sits in it.
struct LocalView {
  MachineView machine;
  std::vector<int> boundCpus;  // this thread's CPU affinity (OS indices)
  int numaNode = -1;           // NUMA node of the binding (or of the current CPU)
  bool numaBound = false;      // the binding lies within one NUMA node
  int gpu = -1;                // index in machine.gpus: first GPU on numaNode, else 0; -1 none
  int bestNic = -1;            // index in machine.nics: see pickBestNic
  bool hasRdma() const;
};

// Fixed-size POD summary of a LocalView: what travels in the init
// all-gather (every rank learns every rank's summary).
struct LocalSummary {
  int32_t numaNode;
  int32_t numaNodes;
  int32_t boundCpus;
  int32_t cores;
  int32_t gpuCount;
  int32_t nicCount;
  int32_t rdmaNicCount;
  int32_t numaBound;
  double bestNicGbps;
  char gpuBusId[24];     // the rank's GPU ("" none)
  char bestNic[32];      // name of the best NIC ("" none)
};

// Discovers the machine (once per process, with the options of the first
// call; its warnings are logged once) and this thread's place in it.
LocalView discoverLocalView(const DiscoveryOptions& opts);
// The machine part only, cached (the first call's options). Never fails:
// unknown parts stay empty.
const MachineView& machineView(const DiscoveryOptions& opts);

// GPU -> NIC pairing (gpu_nic_pairing.cc): for each GPU, the index of its
// NIC, or -1 when there is none. The nearest NIC in the PCI tree (under the
// same switch first, as NCCL pairs them), else one on the GPU's NUMA node;
// equally near NICs are shared out (RDMA first, then the least used).
std::vector<int> pairGpusWithNics(const MachineView& m);

LocalSummary summarize(const LocalView& v);
// Multi-line human description (used by attn_topo and TRACE logs).
std::string describeLocalView(const LocalView& v);
// Compact CPU list ("0-3,8,10-11").
std::string cpuListString(const std::vector<int>& cpus);
// Parses "0-3,8" (sysfs cpulist). Malformed parts are skipped.
std::vector<int> parseCpuList(const std::string& s);

// Fillers (one file each). Return false when the facility is absent.
bool discoverWithHwloc(MachineView* m);   // hwloc_discovery.cc
bool discoverWithSysfs(MachineView* m);   // sysfs_discovery.cc
void discoverVerbs(MachineView* m);       // verbs_discovery.cc: RDMA ports, rates, rdmaNote

// sysfs helpers (sysfs_discovery.cc): first line of a file ("" if absent),
// and a network interface's link speed in Gbit/s (0 unknown, e.g. virtio).
std::string readFirstLine(const std::string& path);
double netdevRateGbps(const std::string& ifname);

}  // namespace attn
