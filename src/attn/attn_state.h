// Per-communicator state of the attention collectives: the kernel in use,
// the cost model's rates, a worker pool for the built-in kernel, and the
// figures of the last call (read by perf/).
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "attncomm.h"
#include "src/core/shareable_memory.h"

namespace attn {
namespace cpu { class WorkerPool; }

// Figures of one attnRingAttention / attnLevelAttention call on this rank.
struct AttnCallStats {
  attnAttnMode_t mode = attnModeAuto;  // the mode that ran
  double totalUs = 0;    // the whole call
  double computeUs = 0;  // in the attention kernel (and merges)
  double waitUs = 0;     // blocked on communication after computing
  // Stages of totalUs besides compute and wait (perf's --breakdown):
  double planUs = 0;     // planCall: the layout, the card exchange, AUTO's choice
  double setupUs = 0;    // the accumulator sized and cleared
  double outputUs = 0;   // out in the call's dtype, the LSE in its convention
  int64_t rowsSent = 0;  // key rows sent to peers (attnLevelAttention)
  uint64_t bytesSent = 0;  // bytes this rank sent to peers (blocks, queries, partials)
};

struct AttnState {
  // The engine's kernel (attnCommSetAttnKernel[Ex]) and what its partial
  // is: the dtype of out, the convention of lse (folded as they are).
  attnAttnKernelFn userKernel = nullptr;
  void* userData = nullptr;
  attnDataType_t userOutDtype = attnFloat32;
  attnLseBase_t userLseBase = attnLseNatural;
  attnLseLayout_t userLseLayout = attnLseTokenMajor;
  // The header version the kernel was registered from through
  // attnCommSetAttnKernelEx (0: attnCommSetAttnKernel): what it can read of
  // cfg. Since 0.3 window and softcap, since 0.4 head_dim_v.
  unsigned userKernelVersion = 0;
  // Whether that kernel writes what the accumulators hold (fp32, natural,
  // token-major), so its partial may land in one directly.
  bool kernelWritesAccumulatorForm() const {
    return userOutDtype == attnFloat32 && userLseBase == attnLseNatural && userLseLayout == attnLseTokenMajor;
  }
  // Rates by (dtype, head_dim) of the kernel; link rates once.
  bool haveLink = false;
  double linkGBps = 0, linkLatencyUs = 0, interference = 0;
  std::map<int, double> kernelTflops;
  std::map<int, bool> kernelTimedOnDevice;  // by the same key: the CUDA kernel, not the CPU one
  bool modelOverridden = false;
  attnCostModel_t override{};
  std::unique_ptr<cpu::WorkerPool> pool;
  int kernelThreads = 1;
  AttnCallStats last;
  bool skipCompute = false;  // perf: time the communication alone
  // The two blocks a ring rotates (pass-KV, pass-Q), kept between calls in
  // shareable memory so same-host peer processes map them once.
  ShareableBuffer rotation[2];
  // What a rank sends to several peers at once: ship-Q's query block and
  // the partials pass-Q and ship-Q send home, in per-peer slots (PeerSlots).
  ShareableBuffer outgoing;

  AttnState();
  ~AttnState();
};

AttnState& attnStateOf(struct ::attnComm* comm);

// The engine's kernel writes 16-bit partials only in the call's own dtype:
// else attnInvalidArgument naming both (attn_call.cc), before it runs.
attnResult_t checkKernelOut(const AttnState& st, const attnAttnConfig_t& cfg);

}  // namespace attn
