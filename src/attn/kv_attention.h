// Attention over a distributed KV cache (Infinite-LLM DistAttention): query
// shipping to the ranks that hold a request's blocks, MicroAttention there,
// merge-on-receive at the owner.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/pack.h"
#include "src/attn/kv_pool.h"
#include "src/attn/kv_wire.h"  // KvQueryHeader

namespace attn {

struct KvAttnArgs {
  std::vector<int64_t> reqs;
  std::vector<int32_t> qOffsets;  // [reqs + 1], from 0
  const void* q = nullptr;        // the pool's memory kind (device pointers on a device pool)
  std::vector<int32_t> qPos;      // [rows] copied at the call; empty when none were given
  bool hasQPos = false;
  void* out = nullptr;
  float* lse = nullptr;
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  int32_t rows() const { return qOffsets.empty() ? 0 : qOffsets.back(); }
};

struct KvServedRequest {
  int32_t rows = 0;
  const int32_t* pos = nullptr;  // [rows] host (aligned copy)
  const char* q = nullptr;       // [rows, Hq, D] host bytes in the pool's dtype
  std::vector<int64_t> slots;    // its blocks here, by slot, with their tokens
  std::vector<int32_t> tokens;
};

// One peer's queries to serve: its header, its requests here and their
// rows in all; `result` receives fp32 O [rows, Hq, D] of every request in
// turn, then LSE [rows, Hq] (host).
struct KvServeBatch {
  int peer = -1;
  KvQueryHeader h{};
  std::vector<KvServedRequest> reqs;
  int64_t rows = 0;
  std::vector<float>* result = nullptr;
};

// This rank's rows [r0, r0 + rows) of one request, over its blocks here.
struct KvOwnWork {
  int32_t r0 = 0, rows = 0;
  std::vector<int64_t> slots;
  std::vector<int32_t> tokens;
};

// The arithmetic of one call, on the host or on the GPU (kv_device.h); the
// protocol around it is kvAttention's.
class KvAttnCompute {
 public:
  virtual ~KvAttnCompute() = default;
  // The peers' queries over our blocks of their requests, each batch's
  // partial into its `result`; ready(i) is called as batch i's is written
  // (so its reply can leave): one by one on the host, all after one
  // synchronisation on the GPU, where the batches run back to back.
  virtual attnResult_t serve(std::vector<KvServeBatch>& batches,
                             const std::function<attnResult_t(size_t)>& ready) = 0;
  // This rank's query rows over its own blocks here, every request of the
  // call at once (the GPU runs them while replies come in).
  virtual attnResult_t own(const std::vector<KvOwnWork>& work) = 0;
  // A peer's reply (host: O then LSE of its rows), covering our row ranges
  // `ranges` ({r0, r}) in order.
  virtual attnResult_t fold(const std::vector<float>& reply,
                            const std::vector<std::pair<int32_t, int32_t>>& ranges) = 0;
  // out and lse written.
  virtual attnResult_t finish() = 0;
};

// A request's keys in this pool (its slots, with their tokens), for one
// kernel call however its blocks are scattered. When the slots are one run
// of consecutive blocks the keys are contiguous rows from slot `first`'s,
// and so are their positions in the pool. Otherwise they are `paged`: a
// key table gives each key's row (cpu::AttnProblem::k_rows) and position,
// expanded from one cpu::KeyBlock per slot (kvKeyBlocks) by
// cpu::gatherKeyTable on the host or cuda::gatherKeyTable on the device.
struct KvKeyLayout {
  int64_t first = 0;
  int32_t count = 0;
  bool paged = false;
};
KvKeyLayout kvKeyLayoutOf(const KvPool& pool, const std::vector<int64_t>& slots,
                          const std::vector<int32_t>& tokens);
// Appends the slots' blocks to `blocks`, their keys at table entries from
// `at` on, in the slots' order.
void kvKeyBlocks(const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens, int32_t at,
                 std::vector<cpu::KeyBlock>* blocks);

// `rows` queries (q and qPos in the memory the kernel reads) over the keys
// of `keys`: contiguous rows from keys.first, or the table's rows at keyRows
// (paged). keyPos: the keys' positions (the pool's, or the table's).
// Whether queries at positions [qMin, qMax] may see block b under cfg's
// sliding window: true without a window, or when the block's positions
// are not known (first > last), or the queries' (qMin > qMax).
bool kvBlockSeen(const KvBlockLoc& b, const attnAttnConfig_t& cfg, int32_t qMin, int32_t qMax);

cpu::AttnProblem kvKeysProblem(KvPool& pool, const KvQueryHeader& h, const void* q, int32_t rows,
                               const int32_t* qPos, const KvKeyLayout& keys, const int64_t* keyRows,
                               const int32_t* keyPos);

// Checks the arguments against the pool's front (the text names what is
// wrong).
attnResult_t checkKvAttnArgs(KvPool& pool, const KvAttnArgs& a);

// The arithmetic on the host (host pools) or the GPU (device pools).
attnResult_t makeKvAttnCompute(KvPool& pool, const KvAttnArgs& a, std::unique_ptr<KvAttnCompute>* out);

// The collective; `localStatus` != success fails it on every rank.
attnResult_t kvAttention(KvPool& pool, const KvAttnArgs& a, attnResult_t localStatus);

}  // namespace attn
