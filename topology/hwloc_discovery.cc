// Machine discovery with hwloc: NUMA nodes and cores, PCI GPUs (NVIDIA/AMD
// display or 3D controllers, named by their CUDA/NVML/RSMI osdevs where the
// hwloc plugins exist), NICs (OpenFabrics and network osdevs, merged per PCI
// device) with their NUMA locality and PCI-tree distance to every GPU.
#include "topology/local_view.h"

#if ATTN_HAVE_HWLOC
#include <hwloc.h>

#include <cstdio>
#include <map>

namespace attn {

namespace {

std::string busIdOf(hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain,
                pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

int numaOf(hwloc_topology_t t, hwloc_obj_t obj) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, obj);
  if (!anc || !anc->nodeset || hwloc_bitmap_iszero(anc->nodeset)) return -1;
  // A device hanging off the machine root (no NUMA affinity) sees every node.
  if (hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

int depthOf(hwloc_obj_t o) {
  int d = 0;
  for (; o && o->parent; o = o->parent) ++d;
  return d;
}

// Edges on the tree path between two objects (through bridges and, for
// devices behind different host bridges, the CPU side).
int hops(hwloc_obj_t a, hwloc_obj_t b) {
  if (!a || !b) return -1;
  int da = depthOf(a), db = depthOf(b), n = 0;
  while (da > db) a = a->parent, --da, ++n;
  while (db > da) b = b->parent, --db, ++n;
  while (a != b && a && b) a = a->parent, b = b->parent, n += 2;
  return a == b ? n : -1;
}

bool isGpu(hwloc_obj_t pci) {
  unsigned cls = pci->attr->pcidev.class_id, vendor = pci->attr->pcidev.vendor_id;
  bool display = cls == 0x0300 || cls == 0x0302 || cls == 0x0380 || cls == 0x1200;
  return display && (vendor == 0x10de || vendor == 0x1002);
}

std::vector<int> cpusOf(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  if (!set) return cpus;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) cpus.push_back(i);
  return cpus;
}

}  // namespace

bool discoverWithHwloc(MachineView* m) {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) return false;
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#if HWLOC_API_VERSION >= 0x00020100
  // GPUs are named by the cuda/nvml/rsmi plugins. The OpenCL and GL ones add
  // nothing we read, and cost: OpenCL discovery loads every installed vendor
  // ICD into this process, GL discovery tries to open X displays.
  hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
  hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "gl");
#endif
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    return false;
  }
#ifdef HWLOC_VERSION
  m->source = "hwloc " HWLOC_VERSION;
#else
  m->source = "hwloc";
#endif
  m->thisSystem = hwloc_topology_is_thissystem(t) != 0;
  m->cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  m->pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n));) {
    NumaInfo ni;
    ni.os = int(n->os_index);
    ni.cpus = cpusOf(n->cpuset);
    m->numa.push_back(ni);
  }

  std::vector<hwloc_obj_t> gpuObjs;
  for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_pcidev(t, p));) {
    if (!isGpu(p)) continue;
    GpuInfo g;
    g.busId = busIdOf(p);
    g.numaNode = numaOf(t, p);
    for (hwloc_obj_t c = p->io_first_child; c; c = c->next_sibling)
      if (c->type == HWLOC_OBJ_OS_DEVICE && c->name) g.name += (g.name.empty() ? "" : " ") + std::string(c->name);
    if (g.name.empty()) {
      char id[16];
      std::snprintf(id, sizeof(id), "%04x:%04x", p->attr->pcidev.vendor_id, p->attr->pcidev.device_id);
      g.name = id;
    }
    m->gpus.push_back(g);
    gpuObjs.push_back(p);
  }

  // One NIC per PCI device: a ConnectX shows both "mlx5_0" (OpenFabrics)
  // and "ib0"/"ens1f0" (network) under the same function.
  std::map<hwloc_obj_t, size_t> nicOfParent;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(t, o));) {
    auto type = o->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    hwloc_obj_t pci = o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE ? o->parent : nullptr;
    size_t idx;
    auto it = pci ? nicOfParent.find(pci) : nicOfParent.end();
    if (it != nicOfParent.end()) {
      idx = it->second;
    } else {
      idx = m->nics.size();
      m->nics.emplace_back();
      NicInfo& n = m->nics.back();
      if (pci) {
        nicOfParent[pci] = idx;
        n.busId = busIdOf(pci);
      }
      n.numaNode = numaOf(t, o);
      for (hwloc_obj_t g : gpuObjs) n.hopsToGpu.push_back(pci ? hops(pci, g) : -1);
    }
    NicInfo& n = m->nics[idx];
    if (type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      n.rdmaDevice = o->name ? o->name : "";
    } else if (n.netdev.empty()) {
      n.netdev = o->name ? o->name : "";
      n.rateGbps = netdevRateGbps(n.netdev);
    }
  }
  hwloc_topology_destroy(t);
  return true;
}

}  // namespace attn

#else  // !ATTN_HAVE_HWLOC

namespace attn {
bool discoverWithHwloc(MachineView*) { return false; }
}  // namespace attn

#endif
