// NCCL topology files (NCCL_TOPO_FILE, ATTN_NCCL_TOPO_FILE): the XML that
// clouds publish for VMs whose PCI tree is virtualised (Azure's ND H100 v5
// and others). Parsed with libxml2 into the MachineView that hwloc / sysfs
// discovery fill: NUMA nodes (<cpu numaid affinity>), GPUs (PCI class
// 0x03..), NICs (class 0x02.. or a <nic><net name speed> child) with the
// PCI-tree distance of every NIC to every GPU, so pairing and NUMA placement
// follow the file. The file is untrusted: sizes, depth, counts and lengths
// are bounded, and every error is one line that names the file and line.
#pragma once

#include <string>

#include "topology/local_view.h"

namespace attn {

// Bounds on a file (NCCL's own: 255-byte strings, 256 nodes per host).
struct NcclTopoLimits {
  static constexpr size_t kMaxBytes = 1 << 20;
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxElements = 4096;
  static constexpr int kMaxAttrs = 32;
  static constexpr size_t kMaxAttrLen = 255;
  static constexpr int kMaxNuma = 64;
  static constexpr int kMaxNumaId = 1023;
  static constexpr int kMaxCpus = 8192;
  static constexpr int kMaxGpus = 64;
  static constexpr int kMaxNics = 128;
};

// True when built with libxml2; without it every parse fails saying so.
bool ncclTopoXmlAvailable();

// Parses `text`; `name` (the path) prefixes errors ("f.xml:12: ..."). On
// success `out` holds the file's NUMA nodes, GPUs and NICs (hopsToGpu set,
// source "NCCL topology <name>"); cores/pus stay 0 (the file has none).
bool parseNcclTopoXml(const std::string& text, const std::string& name, MachineView* out,
                      std::string* err);
// Reads `path` (at most kMaxBytes) and parses it.
bool loadNcclTopoFile(const std::string& path, MachineView* out, std::string* err);

// Lays a parsed file over the discovered machine (nccl_topo_merge.cc): the
// file's NUMA nodes, GPUs and NICs replace what the (virtualised) PCI scan
// saw; devices are matched by PCI bus id (then NIC name) to keep their live
// names and link rates; live devices the file does not list are kept after
// the file's. Cores and PUs stay the live ones.
void overlayNcclTopo(const MachineView& file, MachineView* live);

// "0000ffff,ffffffff" (32-bit words, most significant first, as in
// /sys/.../cpumap and NCCL's affinity) -> CPU indices. False on bad text or
// more than NcclTopoLimits::kMaxCpus bits.
bool parseCpuMask(const std::string& mask, std::vector<int>* cpus);

}  // namespace attn
