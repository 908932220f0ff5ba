#include "src/device/backends/staging/stage_pipeline.h"

#include <algorithm>

#include "src/core/datatype.h"
#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"

namespace attn {
namespace {

constexpr size_t kDefaultChunk = size_t(4) << 20;
// Slices per operation at most: bounds the events kept and the per-slice
// host calls of very large operations (slices grow instead).
constexpr size_t kMaxSlices = 256;
constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Where one side (input or output) of an operation lives, per kind.
struct Side {
  bool present = false;  // this rank copies it (absent: a non-root's broadcast input, reduce output)
  bool blocks = false;   // nranks blocks of `count` ([rank][count]), else one block
};

struct Shape {
  Side in, out;
  bool hostInPlace = false;  // the host operation reads and writes one buffer
};

bool shapeOf(const DeviceOp& op, int me, Shape* s) {
  switch (op.kind) {
    case DeviceOpKind::kAllReduce:
      *s = {{true, false}, {true, false}, true};
      return true;
    case DeviceOpKind::kBroadcast:
      *s = {{me == op.root, false}, {true, false}, true};
      return true;
    case DeviceOpKind::kReduce:
      *s = {{true, false}, {me == op.root, false}, true};
      return true;
    case DeviceOpKind::kAllGather:
      *s = {{true, false}, {true, true}, false};
      return true;
    case DeviceOpKind::kReduceScatter:
      *s = {{true, true}, {true, false}, false};
      return true;
    case DeviceOpKind::kAllToAll:
      *s = {{true, true}, {true, true}, false};
      return true;
    default:
      return false;
  }
}

}  // namespace

size_t stageChunkBytes() {
  static_assert(settingDefault(Setting::kDeviceStageChunk) == int64_t(kDefaultChunk));
  return static_cast<size_t>(settingInt<Setting::kDeviceStageChunk>());  // >= 0
}

size_t stageSliceCount(const DeviceOp& op, size_t chunkBytes) {
  Shape s;
  if (chunkBytes == 0 || op.count == 0 || !shapeOf(op, -1, &s)) return 0;
  const size_t esz = dataTypeSize(op.type);
  size_t slice = std::max<size_t>(1, chunkBytes / esz);
  slice = std::max(slice, (op.count + kMaxSlices - 1) / kMaxSlices);
  return slice < op.count ? slice : 0;
}

SliceEvents::~SliceEvents() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
}

attnResult_t SliceEvents::reserve(size_t n) {
  // Blocking sync: the proxy sleeps instead of spinning on a core the
  // transports need.
  while (events_.size() < n) {
    cudaEvent_t e;
    ATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    events_.push_back(e);
  }
  return attnSuccess;
}

attnResult_t runStagePipeline(const DeviceOp& op, int me, int nranks, size_t slice, PinnedArena& arena,
                              SliceEvents& events, cudaStream_t copy, const SliceRun& hostRun) {
  Shape shape;
  if (!shapeOf(op, me, &shape) || slice == 0)
    return setError(attnInternalError, "pipelined staging of an operation it cannot slice");
  const size_t esz = dataTypeSize(op.type), count = op.count, n = static_cast<size_t>(nranks);
  const size_t slices = (count + slice - 1) / slice;
  auto elems = [&](const Side& side) { return side.blocks ? n * count : count; };
  const size_t inBytes = alignUp(elems(shape.in) * esz);
  const size_t outBytes = shape.hostInPlace ? 0 : alignUp(elems(shape.out) * esz);
  ATTN_CHECK(arena.reserve(inBytes + outBytes));
  ATTN_CHECK(events.reserve(slices));
  char* const hostIn = arena.base();
  char* const hostOut = shape.hostInPlace ? hostIn : hostIn + inBytes;
  // Slice k covers elements [a, a + len) of every block. On the host its
  // blocks sit together: one block at a, or nranks blocks at nranks * a.
  auto hostAt = [&](char* base, const Side& side, size_t a) { return base + (side.blocks ? n : 1) * a * esz; };
  // Device and host side of one slice; blocks are strided on the device.
  auto move = [&](char* dst, size_t dpitch, const char* src, size_t spitch, size_t len, bool blocks) {
    if (!blocks) return cudaMemcpyAsync(dst, src, len * esz, cudaMemcpyDefault, copy);
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, len * esz, n, cudaMemcpyDefault, copy);
  };
  const char* send = static_cast<const char*>(op.send);
  char* recv = static_cast<char*>(op.recv);
  // Every slice's inputs go down at once; the stream copies them in order.
  for (size_t k = 0; k < slices; ++k) {
    const size_t a = k * slice, len = std::min(slice, count - a);
    if (shape.in.present)
      ATTN_CUDA_CHECK(move(hostAt(hostIn, shape.in, a), len * esz, send + a * esz, count * esz, len, shape.in.blocks));
    ATTN_CUDA_CHECK(cudaEventRecord(events[k], copy));
  }
  // Each slice's host operation once its inputs are down; its outputs go up
  // behind the remaining inputs, while the next slice runs.
  for (size_t k = 0; k < slices; ++k) {
    const size_t a = k * slice, len = std::min(slice, count - a);
    ATTN_CUDA_CHECK(cudaEventSynchronize(events[k]));
    ATTN_CHECK(hostRun(hostAt(hostIn, shape.in, a), hostAt(hostOut, shape.out, a), len));
    if (shape.out.present)
      ATTN_CUDA_CHECK(
          move(recv + a * esz, count * esz, hostAt(hostOut, shape.out, a), len * esz, len, shape.out.blocks));
    stagedSlices().fetch_add(1, std::memory_order_relaxed);
  }
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  return attnSuccess;
}

std::atomic<uint64_t>& stagedSlices() {
  static std::atomic<uint64_t> slices{0};
  return slices;
}

}  // namespace attn
