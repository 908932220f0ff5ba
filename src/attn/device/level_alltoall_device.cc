// Level-aware sparse attention on the GPU (CSPS §3.2.4), run on the proxy
// thread of a device communicator as one stream-bridge work item. The plan
// and the exchange (who sends which keys to whom, relays, merge-on-receive)
// are the host algorithm's (src/attn/level_alltoall.h); this backend packs
// and folds on the device:
//
//  - The importance scores come down first (the selection is a sort on the
//    host). Each outgoing block's kept rows are gathered on the device
//    (R.visit) from the index list the plan made, on the copy stream, and
//    copied down into the block's slot of pinned R.hostOut after its
//    metadata.
//  - Our queries and keys stay on the device: our own keys fold while the
//    blocks are on their way.
//  - An incoming block lands in pinned R.hostIn (relays send it on from
//    there), goes up into its slot of R.block[0] and folds into the fp32
//    accumulator, all on the compute stream.
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_call.h"
#include "src/attn/level_alltoall.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/attn/device/device_attn_kernels.h"
#include "src/device/device_state.h"
#include "src/attn/device/ring_attn_device.h"

namespace attn {

attnResult_t runLevelAllToAllDevice(AttnCall& c, const LevelDrop& drop, const DeviceAttnBuffers& io) {
  DeviceCallEnv env;
  ATTN_CHECK(beginDeviceCall(c, "level attention", 0, &env));
  DeviceAttnState& R = *env.R;
  const cudaStream_t copy = env.copy;
  const int n = env.n, S = c.numSeqs;

  // The scores, where the plan can read them.
  std::vector<float> importance;
  LevelDrop hostDrop = drop;
  if (drop.importance && c.kv.rows) {
    importance.resize(c.kv.rows);
    ATTN_CUDA_CHECK(cudaMemcpyAsync(importance.data(), drop.importance, sizeof(float) * c.kv.rows,
                                    cudaMemcpyDeviceToHost, R.compute));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));
    hostDrop.importance = importance.data();
  }
  LevelPlan L;
  ATTN_CHECK(planLevelExchange(c, hostDrop, &L));

  // Pinned out: each block (metadata, then K and V copied down), then the
  // index lists that go up. Device: each block's indices and gathered K, V
  // (R.visit); every incoming block (R.block[0]).
  const size_t kb = c.kRowBytes, vb = c.vRowBytes;
  PeerSlots blockOut(n), indexOut(n), gathered(n);
  for (int p : L.sendTo) {
    const size_t rows = L.toPeer[p].rows.size();
    blockOut.add(p, BlockLayout::of(S, rows, c.kvRow()).total);
    indexOut.add(p, rows * sizeof(int32_t));
    gathered.add(p, alignUp(rows * sizeof(int32_t), 256) + rows * (kb + vb));
  }
  std::vector<size_t> inAt(L.in.size() + 1, 0), devAt(L.in.size() + 1, 0);
  for (size_t i = 0; i < L.in.size(); ++i) {
    inAt[i + 1] = inAt[i] + alignUp(L.in[i].capacity, 64);
    devAt[i + 1] = devAt[i] + alignUp(L.in[i].capacity, 256);
  }
  ATTN_CHECK(R.hostOut.reserve(blockOut.total + indexOut.total + 64));
  ATTN_CHECK(R.hostIn.reserve(inAt.back() + 64));
  ATTN_CHECK(R.visit.reserve(gathered.total + 64, R.compute));
  ATTN_CHECK(R.block[0].reserve(devAt.back() + 64, R.compute));
  DeviceKernels kernels(c, R);
  DeviceAccumulator acc;
  ATTN_CHECK(prepareKernels(c, R, {c.q, c.kv}, static_cast<int>(L.in.size()) + 1, &kernels, &acc));
  const DeviceRows myQ = kernels.resident(0);
  const DeviceRows myKv = kernels.resident(1);
  char* const hostOut = R.hostOut.base();
  char* const indices = hostOut + blockOut.total;
  char* const hostIn = R.hostIn.base();
  char* const devIn = R.block[0].get();

  // Each block: metadata on the host, its rows gathered and copied down.
  std::vector<const char*> blocks(n, nullptr);
  for (int p : L.sendTo) {
    const KeptRows& kept = L.toPeer[p];
    const size_t rows = kept.rows.size();
    std::vector<int32_t> pos(rows);
    for (size_t i = 0; i < rows; ++i) pos[i] = c.kv.pos[kept.rows[i]];
    char* block = hostOut + blockOut.offset[p];
    const BlockLayout l = packBlockMeta(c.comm->rank, S, kept.offsets.data(), pos.data(), static_cast<int64_t>(rows),
                                        c.kvRow(), block);
    blocks[p] = block;
    if (rows == 0) continue;
    int32_t* hostIdx = reinterpret_cast<int32_t*>(indices + indexOut.offset[p]);
    std::copy(kept.rows.begin(), kept.rows.end(), hostIdx);
    char* dev = R.visit.get() + gathered.offset[p];
    int32_t* devIdx = reinterpret_cast<int32_t*>(dev);
    char* k = dev + alignUp(rows * sizeof(int32_t), 256);
    char* v = k + rows * kb;
    ATTN_CUDA_CHECK(cudaMemcpyAsync(devIdx, hostIdx, rows * sizeof(int32_t), cudaMemcpyHostToDevice, copy));
    ATTN_CHECK(cuda::gatherRows(k, c.kv.t0, devIdx, rows, c.kv.rows, kb, copy));
    ATTN_CHECK(cuda::gatherRows(v, c.kv.t1, devIdx, rows, c.kv.rows, vb, copy));
    // K and V lie back to back here and in the block (t1At = t0At + K's bytes).
    ATTN_CUDA_CHECK(cudaMemcpyAsync(block + l.t0At, k, rows * (kb + vb), cudaMemcpyDeviceToHost, copy));
  }
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));

  LevelBackend be;
  be.landing = [&](size_t i) { return hostIn + inAt[i]; };
  be.foldOwn = [&] { return kernels.accumulate(myQ, myKv, acc.o, acc.lse); };
  be.fold = [&](size_t i, const BlockView& block, const char* data, size_t bytes, bool) -> attnResult_t {
    char* dev = devIn + devAt[i];
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, R.compute));
    return kernels.accumulate(myQ, deviceRowsOf(block, data, dev), acc.o, acc.lse);
  };
  ATTN_CHECK(exchangeLevelBlocks(c, L, blocks, be));

  return finishDeviceCall(c, env, acc, kernels, io);
}

}  // namespace attn
