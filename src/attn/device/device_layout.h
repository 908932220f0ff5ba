// A device call's layout (attnSeqLayout_t), read where it lives. Arrays in
// pageable host memory are copied at the call: the caller may reuse them
// once it returns. Arrays in device, managed or pinned host memory are read
// when the call runs on the proxy, in stream order like q, k and v: a CUDA
// graph captured once then serves every decode step as positions and
// lengths advance (an engine updates them on the device before a replay).
// Plain C++ (no CUDA headers); defined only in CUDA builds, an empty class
// in the others (they have no device communicators).
#pragma once

#include <cstdint>
#include <memory>

#include "attncomm.h"
#include "src/attn/plan_call.h"

struct attnComm;

namespace attn {

#if ATTN_HAVE_CUDA
class DeviceCallLayout {
 public:
  // At the call, after checkCallShape: where the arrays live (all in
  // pageable host memory, or all where the GPU reads them; a mix is
  // attnInvalidArgument naming the arrays). Host arrays are checked
  // (checkLayoutRows) and copied now; *qRows / *kvRows are their counts,
  // -1 for a layout read when the call runs.
  attnResult_t capture(const void* q, const void* k, const void* v, const void* out, const attnSeqLayout_t& lay,
                       const attnAttnConfig_t& cfg, int64_t* qRows, int64_t* kvRows);
  bool readAtRun() const { return atRun_; }
  // When the call runs, on comm's proxy thread: the layout to plan with,
  // in host memory. One read at the call's turn: the offsets, then as many
  // positions as they count, checked as a host layout is at the call. A
  // bad one fails here (the caller refuses the call, so the peers fail it
  // too). Valid until the next resolve of a copy of this object.
  attnResult_t resolve(attnComm* comm, const attnSeqLayout_t** layout, int64_t* qRows, int64_t* kvRows) const;

 private:
  attnSeqLayout_t user_{};
  const void* q_ = nullptr;
  const void* k_ = nullptr;
  const void* v_ = nullptr;
  const void* out_ = nullptr;
  int causal_ = 0, windowLeft_ = -1, windowRight_ = -1;
  bool atRun_ = false;
  int64_t qRows_ = 0, kvRows_ = 0;
  // Host layouts: the copy made at the call. Read at run: the proxy's copy,
  // rewritten by each run (runs of one call, graph replays, are serial).
  std::shared_ptr<LayoutCopy> copy_;
};

// cfg.sinks, if set, is memory the GPU reads (device, managed, pinned):
// attnInvalidArgument for pageable host memory.
attnResult_t checkDeviceSinks(const attnAttnConfig_t& cfg);
#else
class DeviceCallLayout {};
#endif

}  // namespace attn
