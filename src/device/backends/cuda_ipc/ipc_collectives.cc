#include "src/device/backends/cuda_ipc/ipc_collectives.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/coll/coll.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/backends/cuda_ipc/ipc_exchange.h"

namespace attn::ipc {
namespace {

// What one rank tells one peer about an operation.
struct IpcDesc {
  IpcBuffer src;        // the buffer peers read (send)
  IpcBuffer dst;        // the receive buffer (read by peers in all-reduce's gather)
  uint64_t offset = 0;  // the block of src meant for the receiving peer
  uint64_t bytes = 0;
  int32_t usable = 0;   // this rank's buffers can all be served
  int32_t pad = 0;
};
static_assert(std::is_trivially_copyable_v<IpcDesc>);

// The buffers this rank publishes for `op` and the block of its source
// meant for each peer.
struct Layout {
  const void* src = nullptr;
  size_t srcBytes = 0;
  const void* dst = nullptr;
  size_t dstBytes = 0;
  bool dstRead = false;       // peers read dst too
  std::vector<Block> toPeer;  // by peer, within src
};

size_t extent(const std::vector<Block>& blocks) {
  size_t end = 0;
  for (const Block& b : blocks)
    if (b.bytes) end = std::max(end, b.offset + b.bytes);
  return end;
}

Layout layoutOf(const DeviceOp& op, int me, int n) {
  const size_t esz = dataTypeSize(op.type), b = op.count * esz;
  Layout l;
  l.toPeer.assign(n, Block{});
  l.src = op.send;
  l.dst = op.recv;
  switch (op.kind) {
    case DeviceOpKind::kAllGather:
      for (Block& x : l.toPeer) x = {0, b};
      l.srcBytes = b;
      l.dstBytes = b * n;
      break;
    case DeviceOpKind::kAllToAll:
    case DeviceOpKind::kReduceScatter:
      for (int p = 0; p < n; ++p) l.toPeer[p] = {p * b, b};
      l.srcBytes = b * n;
      l.dstBytes = op.kind == DeviceOpKind::kAllToAll ? b * n : b;
      break;
    case DeviceOpKind::kAllToAllv: {
      std::vector<Block> recvBlocks(n);
      for (int p = 0; p < n; ++p) {
        l.toPeer[p] = {op.sdispls[p] * esz, op.sendcounts[p] * esz};
        recvBlocks[p] = {op.rdispls[p] * esz, op.recvcounts[p] * esz};
      }
      l.srcBytes = extent(l.toPeer);
      l.dstBytes = extent(recvBlocks);
      break;
    }
    case DeviceOpKind::kBroadcast:
      if (me == op.root) {
        for (Block& x : l.toPeer) x = {0, b};
        l.srcBytes = b;
      } else {
        l.src = nullptr;  // may be anything on non-roots: never read
      }
      l.dstBytes = b;
      break;
    case DeviceOpKind::kReduce:
      // Every rank's whole buffer goes to the root, which alone writes.
      l.toPeer[op.root] = {0, b};
      l.srcBytes = b;
      if (me != op.root) l.dst = nullptr;
      l.dstBytes = me == op.root ? b : 0;
      break;
    case DeviceOpKind::kAllReduce:
      l.toPeer = splitEvenly(op.count, n, esz);
      l.srcBytes = l.dstBytes = b;
      l.dstRead = true;
      break;
    default:
      break;
  }
  return l;
}

// The copies and reductions of one operation on this rank.
class Pulls {
 public:
  Pulls(attnComm* comm, IpcState& st, const DeviceOp& op, std::vector<IpcDesc> from, cudaStream_t copy)
      : comm_(comm), st_(st), op_(op), from_(std::move(from)), copy_(copy),
        esz_(dataTypeSize(op.type)) {}

  attnResult_t run() {
    Engine& e = *comm_->engine;
    const int me = comm_->rank, n = comm_->nranks;
    const size_t b = op_.count * esz_;
    char* recv = static_cast<char*>(op_.recv);
    switch (op_.kind) {
      case DeviceOpKind::kAllGather:
      case DeviceOpKind::kAllToAll:
        return finish(e, forEachRank([&](int p) { return pullBlock(p, recv + p * b, b); }));
      case DeviceOpKind::kAllToAllv:
        return finish(e, forEachRank([&](int p) {
          return pullBlock(p, recv + op_.rdispls[p] * esz_, op_.recvcounts[p] * esz_);
        }));
      case DeviceOpKind::kBroadcast:
        return finish(e, pullBlock(op_.root, recv, b));
      case DeviceOpKind::kReduceScatter:
        return finish(e, reduceBlock(recv, op_.count));
      case DeviceOpKind::kReduce:
        return finish(e, me == op_.root ? reduceBlock(recv, op_.count) : attnSuccess);
      case DeviceOpKind::kAllReduce: {
        // Reduce-scatter into this rank's slice of recv, then gather the
        // others' slices from their recv once every slice is final.
        const std::vector<Block> slices = splitEvenly(op_.count, n, esz_);
        ATTN_CHECK(finish(e, reduceBlock(recv + slices[me].offset, slices[me].bytes / esz_)));
        return finish(e, forEachRank([&](int p) {
          if (p == me) return attnSuccess;
          return pullRange(p, from_[p].dst, slices[p].offset, slices[p].bytes, recv + slices[p].offset);
        }));
      }
      default:
        // The backend takes only the kinds above (ipc_backend.cc); others go to the next one.
        return setError(attnInternalError, "cuda_ipc: %s reached the IPC backend, which has no pulls for it",
                        deviceOpName(op_.kind));
    }
  }

 private:
  // Ranks from this one on, so that ranks do not all start at rank 0.
  template <class F>
  attnResult_t forEachRank(F f) {
    const int me = comm_->rank, n = comm_->nranks;
    for (int k = 0; k < n; ++k) ATTN_CHECK(f((me + k) % n));
    return attnSuccess;
  }

  // Rank p's block meant for this rank, as a pointer valid here.
  attnResult_t blockOf(int p, const char** ptr, size_t* bytes) {
    const IpcDesc& d = from_[p];
    *bytes = d.bytes;
    *ptr = nullptr;
    if (d.bytes == 0) return attnSuccess;
    if (d.offset > d.src.bytes || d.bytes > d.src.bytes - d.offset)
      return setError(attnInternalError, "cuda_ipc %s: rank %d's block [%llu, +%llu) lies outside its buffer",
                      deviceOpName(op_.kind), p, (unsigned long long)d.offset, (unsigned long long)d.bytes);
    const char* base;
    ATTN_CHECK(st_.importer().map(p, st_.peer(p).sameProcess, d.src, &base));
    *ptr = base + d.offset;
    return attnSuccess;
  }

  attnResult_t copyAsync(void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return attnSuccess;
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_));
    return attnSuccess;
  }

  // Rank p's block for this rank into dst, which expects `want` bytes.
  attnResult_t pullBlock(int p, char* dst, size_t want) {
    const char* src;
    size_t bytes;
    ATTN_CHECK(blockOf(p, &src, &bytes));
    if (bytes != want)
      return setError(attnInvalidUsage,
                      "cuda_ipc %s: rank %d provides %zu bytes for rank %d, which expects %zu "
                      "(counts disagree between ranks)",
                      deviceOpName(op_.kind), p, bytes, comm_->rank, want);
    return copyAsync(dst, src, bytes);
  }

  // [offset, offset + bytes) of rank p's buffer `buf` into dst.
  attnResult_t pullRange(int p, const IpcBuffer& buf, size_t offset, size_t bytes, char* dst) {
    if (bytes == 0) return attnSuccess;
    if (offset > buf.bytes || bytes > buf.bytes - offset)
      return setError(attnInvalidUsage, "cuda_ipc %s: rank %d's buffer holds %llu bytes, %zu needed",
                      deviceOpName(op_.kind), p, (unsigned long long)buf.bytes, offset + bytes);
    const char* base;
    ATTN_CHECK(st_.importer().map(p, st_.peer(p).sameProcess, buf, &base));
    return copyAsync(dst, base + offset, bytes);
  }

  // out = op over every rank's block meant for this rank (count elements).
  // This rank's own block comes first: out may alias it (in place), and
  // each kernel reads an element before writing it. Peers whose memory
  // this device cannot read (same process, other GPU, no peer access) are
  // copied into scratch first, one at a time (stream order keeps the
  // scratch free).
  attnResult_t reduceBlock(char* out, size_t count) {
    const int me = comm_->rank, n = comm_->nranks;
    const size_t bytes = count * esz_;
    if (bytes == 0) return attnSuccess;
    std::vector<const char*> in(n);
    bool needScratch = false;
    for (int p = 0; p < n; ++p) {
      size_t got;
      ATTN_CHECK(blockOf(p, &in[p], &got));
      if (got != bytes)
        return setError(attnInvalidUsage,
                        "cuda_ipc %s: rank %d provides %zu bytes for rank %d, which expects %zu "
                        "(counts disagree between ranks)",
                        deviceOpName(op_.kind), p, got, me, bytes);
      needScratch = needScratch || !st_.peer(p).directRead;
    }
    void* scratch = nullptr;
    if (needScratch) ATTN_CHECK(st_.scratch(bytes, copy_, &scratch));
    if (n == 1) ATTN_CHECK(copyAsync(out, in[me], bytes));
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      const void* src = in[p];
      if (!st_.peer(p).directRead) {
        ATTN_CHECK(copyAsync(scratch, src, bytes));
        src = scratch;
      }
      ATTN_CHECK(cuda::reduce2(out, k == 1 ? in[me] : out, src, count, op_.type, op_.op, copy_));
    }
    if (op_.op == attnAvg) ATTN_CHECK(cuda::divideInPlace(out, count, op_.type, n, copy_));
    return attnSuccess;
  }

  // Ends a phase: wait for this rank's copies (also after a failure, so
  // none still reads a peer's buffer), then meet every rank.
  attnResult_t finish(Engine& e, attnResult_t mine) {
    cudaError_t sync = cudaStreamSynchronize(copy_);
    if (mine == attnSuccess && sync != cudaSuccess)
      mine = setError(attnUnhandledCudaError, "cuda_ipc %s: waiting for the copies failed: %s (%s)",
                      deviceOpName(op_.kind), cudaGetErrorString(sync), cudaGetErrorName(sync));
    return settle(e, mine, deviceOpName(op_.kind));
  }

  attnComm* comm_;
  IpcState& st_;
  const DeviceOp& op_;
  std::vector<IpcDesc> from_;
  cudaStream_t copy_;
  size_t esz_;
};

}  // namespace

bool implements(DeviceOpKind kind) { return isCollective(kind); }

attnResult_t runCollective(attnComm* comm, IpcState& st, const DeviceOp& op, cudaStream_t copy,
                           bool* staged) {
  *staged = false;
  Engine& e = *comm->engine;
  const int me = comm->rank, n = comm->nranks;
  const Layout l = layoutOf(op, me, n);

  // This rank's buffers. A buffer that cannot be served is no error: every
  // rank sees it in the descriptors and the operation runs staged.
  IpcBuffer src, dst;
  std::string why;
  bool usable = st.exporter().describe(l.src, l.srcBytes, st.device(), st.needHandles(), &src, &why) ==
                    attnSuccess &&
                src.usable &&
                st.exporter().describe(l.dst, l.dstBytes, st.device(), l.dstRead && st.needHandles(), &dst,
                                       &why) == attnSuccess &&
                dst.usable;
  if (!usable && why.empty()) why = threadLastError();

  std::vector<IpcDesc> to(n), from;
  for (int p = 0; p < n; ++p) {
    to[p].src = src;
    to[p].dst = dst;
    to[p].offset = l.toPeer[p].offset;
    to[p].bytes = l.toPeer[p].bytes;
    to[p].usable = usable ? 1 : 0;
  }
  ATTN_CHECK(exchangeRecords(e, to, &from));
  for (int r = 0; r < n; ++r)
    if (!from[r].usable) {
      *staged = true;
      st.noteStaged(r, r == me ? why : "a buffer it passed cannot be served");
      return attnSuccess;
    }

  st.importer().beginOp();
  attnResult_t r = Pulls(comm, st, op, std::move(from), copy).run();
  st.importer().endOp();  // the copies are complete (or never started)
  return r;
}

}  // namespace attn::ipc
