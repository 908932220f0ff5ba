// RDMA devices through libibverbs: which devices exist, their active ports,
// link layer and rate. Merged into the NICs that hwloc/sysfs found (by
// device name), or added. Without verbs (or without devices) it says why in
// rdmaNote and leaves the rest alone.
#include "topology/local_view.h"

#if ATTN_HAVE_VERBS
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

namespace attn {

namespace {

// ibv_port_attr.active_width codes -> lanes.
int lanes(uint8_t width) {
  switch (width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

// ibv_port_attr.active_speed codes -> Gbit/s per lane (SDR .. NDR).
double laneGbps(uint8_t speed) {
  switch (speed) {
    case 1: return 2.5;
    case 2: return 5.0;
    case 4: return 10.0;
    case 8: return 10.0;   // FDR10
    case 16: return 14.0;  // FDR
    case 32: return 25.0;  // EDR
    case 64: return 50.0;  // HDR
    case 128: return 100.0;  // NDR
    default: return 0.0;
  }
}

}  // namespace

void discoverVerbs(MachineView* m) {
  int num = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (!list || num == 0) {
    m->rdmaNote = std::string("no RDMA devices (libibverbs: ") +
                  (list ? "no devices" : std::strerror(errno ? errno : ENODEV)) + ")";
    if (list) ibv_free_device_list(list);
    return;
  }
  int active = 0;
  for (int i = 0; i < num; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    NicInfo* nic = nullptr;
    for (NicInfo& n : m->nics)
      if (n.rdmaDevice == name) nic = &n;
    if (!nic) {
      m->nics.emplace_back();
      nic = &m->nics.back();
      nic->rdmaDevice = name;
      nic->hopsToGpu.assign(m->gpus.size(), -1);
    }
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr dev;
    if (ibv_query_device(ctx, &dev) == 0) {
      for (int p = 1; p <= dev.phys_port_cnt; ++p) {
        ibv_port_attr pa;
        if (ibv_query_port(ctx, uint8_t(p), &pa) != 0 || pa.state != IBV_PORT_ACTIVE) continue;
        nic->activePorts++;
        nic->rdma = true;
        nic->linkLayer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand";
        double rate = lanes(pa.active_width) * laneGbps(pa.active_speed);
        if (rate > nic->rateGbps) nic->rateGbps = rate;
      }
    }
    ibv_close_device(ctx);
    active += nic->rdma ? 1 : 0;
  }
  ibv_free_device_list(list);
  if (active == 0) m->rdmaNote = "no RDMA devices with an active port";
}

}  // namespace attn

#else  // !ATTN_HAVE_VERBS

namespace attn {
void discoverVerbs(MachineView* m) {
  m->rdmaNote = "no RDMA devices known (built without libibverbs)";
}
}  // namespace attn

#endif
