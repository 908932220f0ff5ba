// TransportDirect::run: the collectives of transport_direct.h, on device
// buffers handed to the progress engine as they are.
#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/coll/coll.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/backends/direct/transport_direct.h"

namespace attn {
namespace {

// Broadcast forwards along its chain in chunks of this size, so a rank
// passes a chunk on while the next one arrives.
constexpr size_t kChainChunk = size_t(4) << 20;

class DirectRun {
 public:
  DirectRun(attnComm* comm, const DeviceOp& op, cudaStream_t copy, DeviceBuffer& scratch, size_t scratchBudget)
      : e_(*comm->engine), op_(op), copy_(copy), scratch_(scratch), budget_(scratchBudget), me_(comm->rank),
        n_(comm->nranks), esz_(dataTypeSize(op.type)) {}

  // A failure with operations in flight breaks the engine, which closes
  // every connection and so fails them: the transport lets go of their
  // buffers and requests before these go away.
  attnResult_t run() {
    const attnResult_t r = runOp();
    if (r != attnSuccess && waited_ < posted_.size() && !e_.broken()) e_.breakWith(r, threadLastError());
    return r;
  }

 private:
  attnResult_t runOp() {
    const size_t b = op_.count * esz_;
    const char* send = static_cast<const char*>(op_.send);
    char* recv = static_cast<char*>(op_.recv);
    switch (op_.kind) {
      case DeviceOpKind::kAllGather:
        return exchange(send, std::vector<Block>(n_, Block{0, b}), recv, strided(b));
      case DeviceOpKind::kAllToAll:
        return exchange(send, strided(b), recv, strided(b));
      case DeviceOpKind::kAllToAllv: {
        std::vector<Block> to(n_), from(n_);
        for (int p = 0; p < n_; ++p) {
          to[p] = {op_.sdispls[p] * esz_, op_.sendcounts[p] * esz_};
          from[p] = {op_.rdispls[p] * esz_, op_.recvcounts[p] * esz_};
        }
        return exchange(send, to, recv, from);
      }
      case DeviceOpKind::kBroadcast:
        return broadcast(send, recv, b);
      case DeviceOpKind::kReduceScatter:
        return reduceScatter(send, strided(b), recv);
      case DeviceOpKind::kReduce: {
        // A reduce-scatter in which the root's block is the whole buffer.
        std::vector<Block> blocks(n_, Block{0, 0});
        blocks[op_.root] = {0, b};
        return reduceScatter(send, blocks, recv);
      }
      case DeviceOpKind::kAllReduce: {
        // Reduce-scatter into this rank's slice of recv, then every slice
        // to every rank.
        const std::vector<Block> slices = splitEvenly(op_.count, n_, esz_);
        ATTN_CHECK(reduceScatter(send, slices, recv + slices[me_].offset));
        return exchange(recv, std::vector<Block>(n_, slices[me_]), recv, slices);
      }
      default:
        return setError(attnInternalError, "device collectives: %s reached the transport-direct backend",
                        deviceOpName(op_.kind));
    }
  }

  struct Posted {
    Request* req;
    int peer;
    size_t expect;  // receives: the bytes that must arrive
    bool recv;
  };

  std::vector<Block> strided(size_t b) const {
    std::vector<Block> v(n_);
    for (int p = 0; p < n_; ++p) v[p] = {p * b, b};
    return v;
  }

  attnResult_t postRecv(int peer, char* dst, size_t bytes) {
    if (bytes == 0) return attnSuccess;
    Request* r = &reqs_.emplace_back();
    posted_.push_back({r, peer, bytes, true});
    return e_.irecvDevice(peer, dst, bytes, r);
  }
  attnResult_t postSend(int peer, const char* src, size_t bytes) {
    if (bytes == 0) return attnSuccess;
    Request* r = &reqs_.emplace_back();
    posted_.push_back({r, peer, 0, false});
    return e_.isendDevice(peer, src, bytes, r);
  }
  // Waits for posted_[from, to): the engine breaks on a failure, which
  // fails whatever else is in flight.
  attnResult_t waitPosted(size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      const Posted& p = posted_[i];
      ATTN_CHECK(e_.wait(p.req));
      if (p.recv && p.req->bytes != p.expect)
        return setError(attnInvalidUsage,
                        "%s: rank %d sent %zu bytes where rank %d expects %zu (counts disagree between ranks)",
                        deviceOpName(op_.kind), p.peer, p.req->bytes, me_, p.expect);
    }
    return attnSuccess;
  }
  attnResult_t waitAll() {
    ATTN_CHECK(waitPosted(waited_, posted_.size()));
    waited_ = posted_.size();
    return attnSuccess;
  }

  // Device memory of this GPU, managed or pinned host memory: the kernels
  // may read and write it.
  static bool gpuReadable(const void* p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    return (a.type == cudaMemoryTypeDevice && a.device == dev) || a.type == cudaMemoryTypeManaged ||
           a.type == cudaMemoryTypeHost;
  }

  attnResult_t copy(char* dst, const char* src, size_t bytes) {
    if (bytes == 0 || dst == src) return attnSuccess;
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_));
    return attnSuccess;
  }

  // Block to[p] of src goes to peer p, block from[p] of dst comes from it;
  // this rank's own block is copied. Peers in ring order from this rank,
  // so that not every rank starts with rank 0.
  attnResult_t exchange(const char* src, const std::vector<Block>& to, char* dst, const std::vector<Block>& from) {
    if (to[me_].bytes != from[me_].bytes)
      return setError(attnInvalidUsage, "%s: rank %d sends itself %zu bytes but expects %zu", deviceOpName(op_.kind),
                      me_, to[me_].bytes, from[me_].bytes);
    for (int k = 1; k < n_; ++k) {
      const int p = (me_ - k + n_) % n_;
      ATTN_CHECK(postRecv(p, dst + from[p].offset, from[p].bytes));
    }
    for (int k = 1; k < n_; ++k) {
      const int p = (me_ + k) % n_;
      ATTN_CHECK(postSend(p, src + to[p].offset, to[p].bytes));
    }
    ATTN_CHECK(copy(dst + from[me_].offset, src + to[me_].offset, to[me_].bytes));
    ATTN_CHECK(waitAll());
    ATTN_CUDA_CHECK(cudaStreamSynchronize(copy_));
    return attnSuccess;
  }

  // A chain from the root in ring order; each rank forwards every chunk as
  // soon as it has arrived.
  attnResult_t broadcast(const char* send, char* recv, size_t bytes) {
    const int root = op_.root;
    const int next = (me_ + 1) % n_ == root ? -1 : (me_ + 1) % n_;
    const int prev = (me_ - 1 + n_) % n_;
    const size_t chunks = (bytes + kChainChunk - 1) / kChainChunk;
    auto chunk = [&](size_t k) { return Block{k * kChainChunk, std::min(kChainChunk, bytes - k * kChainChunk)}; };
    if (me_ == root) {
      for (size_t k = 0; k < chunks; ++k) ATTN_CHECK(postSend(next, send + chunk(k).offset, chunk(k).bytes));
      ATTN_CHECK(copy(recv, send, bytes));
    } else {
      for (size_t k = 0; k < chunks; ++k) ATTN_CHECK(postRecv(prev, recv + chunk(k).offset, chunk(k).bytes));
      for (size_t k = 0; k < chunks && next >= 0; ++k) {
        ATTN_CHECK(waitPosted(k, k + 1));
        ATTN_CHECK(postSend(next, recv + chunk(k).offset, chunk(k).bytes));
      }
    }
    ATTN_CHECK(waitAll());
    ATTN_CUDA_CHECK(cudaStreamSynchronize(copy_));
    return attnSuccess;
  }

  // out = op over every rank's block `blocks[me]` of its src (the blocks
  // of different ranks may differ in size: all-reduce's uneven slices).
  // Peer p gets block blocks[p] of this rank's src. The peers' blocks land
  // in the scratch, in slices the same on every rank: the scratch budget
  // is split in two halves, so that one slice's receives land while the
  // previous slice is reduced, and each half over the n-1 peers.
  attnResult_t reduceScatter(const char* src, const std::vector<Block>& blocks, char* out) {
    const size_t half = std::max<size_t>(esz_, budget_ / 2 / size_t(n_ - 1) / esz_ * esz_);
    size_t slices = 0;
    for (const Block& b : blocks) slices = std::max(slices, (b.bytes + half - 1) / half);
    const size_t mineBytes = blocks[me_].bytes;
    const char* own = src + blocks[me_].offset;
    if (slices == 0) return attnSuccess;
    // The kernels need this rank's block and output in memory the GPU
    // reads; host buffers (pageable) are reduced through one more slot. A
    // rank whose block is empty (reduce's non-roots) only sends.
    const bool ownOnGpu = mineBytes == 0 || gpuReadable(own), outOnGpu = mineBytes == 0 || gpuReadable(out);
    const size_t slots = std::min(slices, size_t(2)) * size_t(n_ - 1);
    if (mineBytes > 0) {
      // Plain cudaMalloc memory: the transport may register it for RDMA,
      // which stream-ordered pool memory may not allow.
      if (!scratch_.exportable()) scratch_.makeExportable(copy_);
      ATTN_CHECK(scratch_.reserve((slots + (ownOnGpu && outOnGpu ? 0 : 1)) * half, copy_));
      ATTN_CUDA_CHECK(cudaStreamSynchronize(copy_));  // the scratch is usable by the transport now
    }
    std::vector<size_t> firstPosted(slices + 1, 0);
    auto slot = [&](size_t s, int k) { return scratch_.get() + ((s % 2) * size_t(n_ - 1) + size_t(k - 1)) * half; };
    char* local = scratch_.get() + slots * half;
    auto part = [&](const Block& b, size_t s) {
      const size_t off = s * half;
      return Block{b.offset + off, off < b.bytes ? std::min(half, b.bytes - off) : 0};
    };
    auto post = [&](size_t s) -> attnResult_t {
      firstPosted[s] = posted_.size();
      const Block in = part(Block{0, mineBytes}, s);
      for (int k = 1; k < n_; ++k) ATTN_CHECK(postRecv((me_ - k + n_) % n_, slot(s, k), in.bytes));
      for (int k = 1; k < n_; ++k) {
        const int p = (me_ + k) % n_;
        const Block b = part(blocks[p], s);
        ATTN_CHECK(postSend(p, src + b.offset, b.bytes));
      }
      return attnSuccess;
    };
    ATTN_CHECK(post(0));
    for (size_t s = 0; s < slices; ++s) {
      // Slice s+1 lands in the other half, free once slice s-1's
      // reductions (which read it) are done.
      if (s + 1 < slices) {
        ATTN_CUDA_CHECK(cudaStreamSynchronize(copy_));
        ATTN_CHECK(post(s + 1));
      }
      ATTN_CHECK(waitPosted(firstPosted[s], s + 1 < slices ? firstPosted[s + 1] : posted_.size()));
      const Block in = part(Block{0, mineBytes}, s);
      const size_t count = in.bytes / esz_;
      if (count == 0) continue;
      const char* mine = own + in.offset;
      if (!ownOnGpu) {
        ATTN_CHECK(copy(local, mine, in.bytes));
        mine = local;
      }
      char* target = outOnGpu ? out + in.offset : local;
      // This rank's block first: out may alias it (in place), and each
      // kernel reads an element before writing it.
      ATTN_CHECK(cuda::reduce2(target, mine, slot(s, 1), count, op_.type, op_.op, copy_));
      for (int k = 2; k < n_; ++k)
        ATTN_CHECK(cuda::reduceInto(target, slot(s, k), count, op_.type, op_.op, copy_));
      if (op_.op == attnAvg) ATTN_CHECK(cuda::divideInPlace(target, count, op_.type, n_, copy_));
      if (!outOnGpu) ATTN_CHECK(copy(out + in.offset, local, in.bytes));
    }
    waited_ = posted_.size();
    ATTN_CUDA_CHECK(cudaStreamSynchronize(copy_));
    return attnSuccess;
  }

  Engine& e_;
  const DeviceOp& op_;
  cudaStream_t copy_;
  DeviceBuffer& scratch_;
  const size_t budget_;
  const int me_, n_;
  const size_t esz_;
  std::deque<Request> reqs_;  // stable addresses while posted
  std::vector<Posted> posted_;
  size_t waited_ = 0;  // posted_[0, waited_) are complete
};

}  // namespace

attnResult_t TransportDirect::run(attnComm* comm, const DeviceOp& op, cudaStream_t copy) {
  if (!enabled_ || !implements(op.kind))
    return setError(attnInternalError, "device collectives: transport-direct backend asked for %s it cannot run",
                    deviceOpName(op.kind));
  ATTN_CHECK(DirectRun(comm, op, copy, scratch_, scratchBudget_).run());
  directCounters().ops.fetch_add(1, std::memory_order_relaxed);
  return attnSuccess;
}

}  // namespace attn
