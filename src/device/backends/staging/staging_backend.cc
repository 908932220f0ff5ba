// The staging backend: the inputs copied to pinned host memory on the copy
// stream, the host collective run on them through the library's internal
// entry (src/coll/coll_entry.h), the outputs copied back; pipelined slice
// by slice where stage_pipeline.h can. It runs every collective and the
// barrier with any peers, so it comes last in the route.
#include <vector>

#include "src/coll/coll_entry.h"
#include "src/core/api_call.h"
#include "src/core/comm.h"
#include "src/device/backends/device_backend.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"

namespace attn {
namespace {

constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Pinned host copies of `spans` around `hostRun`, unpipelined.
attnResult_t stageAround(DeviceState& st, cudaStream_t copy, const std::vector<DeviceSpan>& spans,
                         const std::function<attnResult_t(char* const*)>& hostRun) {
  size_t total = 0;
  for (const DeviceSpan& s : spans) total += alignUp(s.bytes);
  ATTN_CHECK(st.arena.reserve(total));
  std::vector<char*> host(spans.size(), nullptr);
  size_t off = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].bytes == 0) continue;
    host[i] = st.arena.base() + off;
    off += alignUp(spans[i].bytes);
    if (spans[i].in)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(host[i], spans[i].ptr, spans[i].bytes, cudaMemcpyDefault, copy));
  }
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  ATTN_CHECK(hostRun(host.data()));
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i].out && spans[i].bytes)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(spans[i].ptr), host[i], spans[i].bytes,
                                      cudaMemcpyDefault, copy));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  return attnSuccess;
}

class StagingBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "staging"; }
  BackendCaps caps() const override {
    return {false, false, true, kCollectiveKinds | kindBit(DeviceOpKind::kBarrier)};
  }
  bool takes(const attnComm*, const DeviceOp& op) const override { return caps().runs(op.kind); }

  attnResult_t run(attnComm* comm, DeviceState& st, const DeviceOp& op, cudaStream_t copy,
                   bool* declined) const override {
    *declined = false;
    // As an API call would: a communicator that broke or was aborted while
    // this waited in the stream runs nothing more.
    ATTN_CHECK(checkCommUsable(comm));
    CollArgs args;
    if (!hostCollKind(op.kind, &args.kind))
      return setError(attnInternalError, "staging: %s has no host collective", deviceOpName(op.kind));
    args.count = op.count;
    args.type = op.type;
    args.op = op.op;
    args.root = op.root;
    args.sendcounts = op.sendcounts;
    args.sdispls = op.sdispls;
    args.recvcounts = op.recvcounts;
    args.rdispls = op.rdispls;
    if (const size_t slice = stageSliceCount(op, op.stageChunk))
      return runStagePipeline(op, comm->rank, comm->nranks, slice, st.arena, st.sliceEvents, copy,
                              [&](char* in, char* out, size_t count) {
                                CollArgs a = args;
                                a.send = in;
                                a.recv = out;
                                a.count = count;
                                return runHostCollective(comm, a, op.settings);
                              });
    return stageAround(st, copy, op.spans, [&](char* const* host) {
      CollArgs a = args;
      if (op.spans.size() >= 2) {
        a.send = host[0];
        a.recv = host[1];
      }
      return runHostCollective(comm, a, op.settings);
    });
  }
};

}  // namespace

const DeviceBackend& stagingBackend() {
  static const StagingBackend b;
  return b;
}

}  // namespace attn
