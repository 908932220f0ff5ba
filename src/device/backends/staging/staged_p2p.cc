#include "src/device/backends/staging/staged_p2p.h"

#include <algorithm>
#include <cstring>

#include "src/core/engine.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"

namespace attn {
namespace {

// Slices per message at most (slices grow instead), as the collectives'
// pipeline.
constexpr size_t kMaxSlices = 256;
constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Ahead of a sliced message's first slice. 64 bytes keep the data behind it
// aligned for the copies.
struct alignas(64) SliceHeader {
  uint64_t magic;
  uint64_t bytes;  // the whole message
};
constexpr uint64_t kSliceMagic = 0x6174746e50325031ull;  // "attnP2P1"
constexpr size_t kHeader = sizeof(SliceHeader);

}  // namespace

attnResult_t StagedP2p::run(PinnedArena& stage, SliceEvents& events) {
  bool posted = false;
  const attnResult_t r = move(stage, events, &posted);
  // Requests in flight point into the arena, which the next operation
  // reuses: a broken engine makes every transport let go of them.
  if (r != attnSuccess && posted && !e_.broken()) e_.breakWith(r, threadLastError());
  return r;
}

attnResult_t StagedP2p::checkFirst(const Op& op, size_t got) const {
  const size_t want = op.slice ? kHeader + std::min(op.slice, op.bytes) : op.bytes;
  SliceHeader h{};
  if (op.slice && got == want) std::memcpy(&h, op.host, sizeof(h));
  if (got == want && (!op.slice || (h.magic == kSliceMagic && h.bytes == op.bytes))) return attnSuccess;
  return setError(attnInvalidUsage,
                  "device receive of %zu bytes from rank %d met a send of another size (its first message: %zu "
                  "bytes%s); sizes and ATTN_DEVICE_STAGE_CHUNK must agree on both sides",
                  op.bytes, op.peer, got,
                  op.slice && got == want && h.magic == kSliceMagic
                      ? (", a " + std::to_string(h.bytes) + "-byte message").c_str()
                      : "");
}

attnResult_t StagedP2p::move(PinnedArena& stage, SliceEvents& events, bool* posted) {
  // Cut, and lay the host copies out one after the other.
  size_t total = 0, rounds = 0, messages = 0;
  for (Op& op : ops_) {
    if (chunk_ && op.bytes > chunk_) {
      op.slice = std::max(chunk_, (op.bytes + kMaxSlices - 1) / kMaxSlices);
      op.slices = (op.bytes + op.slice - 1) / op.slice;
    }
    total += (op.slice ? kHeader : 0) + alignUp(op.bytes);
    rounds = std::max(rounds, op.slices);
    messages += op.slices;
  }
  ATTN_CHECK(stage.reserve(total));
  ATTN_CHECK(events.reserve(rounds));
  size_t off = 0;
  for (Op& op : ops_) {
    op.host = stage.base() + off;
    off += (op.slice ? kHeader : 0) + alignUp(op.bytes);
  }
  // Message k of an op: where it lies on the host, and its data on both sides.
  auto data = [](const Op& op, size_t k) { return size_t(op.slice ? kHeader + k * op.slice : 0); };
  auto length = [](const Op& op, size_t k) { return op.slice ? std::min(op.slice, op.bytes - k * op.slice) : op.bytes; };
  auto wire = [&](const Op& op, size_t k) -> std::pair<char*, size_t> {
    if (op.slice && k == 0) return {op.host, kHeader + length(op, 0)};  // header and first slice
    return {op.host + data(op, k), length(op, k)};
  };
  // Every send's slices go down at once, round by round; the stream copies
  // them in order and marks each round.
  for (size_t k = 0; k < rounds; ++k) {
    for (const Op& op : ops_)
      if (op.isSend && k < op.slices && length(op, k))
        ATTN_CUDA_CHECK(cudaMemcpyAsync(op.host + data(op, k), static_cast<const char*>(op.buf) + k * op.slice,
                                        length(op, k), cudaMemcpyDefault, copy_));
    ATTN_CUDA_CHECK(cudaEventRecord(events[k], copy_));
  }
  for (const Op& op : ops_) {
    if (!op.isSend || !op.slice) continue;
    const SliceHeader h{kSliceMagic, op.bytes};
    std::memcpy(op.host, &h, sizeof(h));
  }
  // One request per message: ops in order, each op's messages in order.
  req_.reset(new Request[messages]);
  Request* const req = req_.get();
  std::vector<size_t> first(ops_.size());
  for (size_t i = 0, at = 0; i < ops_.size(); at += ops_[i].slices, ++i) first[i] = at;
  // Every receive is posted up front (nothing lands in a device buffer
  // before its first message has been checked), in the order the sender
  // posts: round by round, the group's order within a round. Both sides
  // cut alike, so the messages between two ranks pair up in order.
  for (size_t k = 0; k < rounds; ++k)
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      if (op.isSend || k >= op.slices) continue;
      const auto [at, len] = wire(op, k);
      ATTN_CHECK(e_.irecv(op.peer, at, len, &req[first[i] + k]));
      *posted = true;
    }
  // Round k: its sends leave once they are down; its receives go up as
  // they arrive, behind the copies still going down.
  for (size_t k = 0; k < rounds; ++k) {
    ATTN_CUDA_CHECK(cudaEventSynchronize(events[k]));
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      if (!op.isSend || k >= op.slices) continue;
      const auto [at, len] = wire(op, k);
      ATTN_CHECK(e_.isend(op.peer, at, len, &req[first[i] + k]));
      *posted = true;
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      if (op.isSend || k >= op.slices) continue;
      Request& r = req[first[i] + k];
      ATTN_CHECK(e_.wait(&r));
      if (k == 0) ATTN_CHECK(checkFirst(op, r.bytes));
      else if (r.bytes != wire(op, k).second)
        return setError(attnInvalidUsage, "device receive from rank %d: slice %zu of %zu has %zu bytes, not %zu",
                        op.peer, k, op.slices, r.bytes, wire(op, k).second);
      if (length(op, k))
        ATTN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(op.buf) + k * op.slice, op.host + data(op, k),
                                        length(op, k), cudaMemcpyDefault, copy_));
    }
  }
  for (size_t i = 0; i < ops_.size(); ++i)
    if (ops_[i].isSend)
      for (size_t k = 0; k < ops_[i].slices; ++k) ATTN_CHECK(e_.wait(&req[first[i] + k]));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy_));
  for (const Op& op : ops_)
    if (op.slice) stagedP2pSlices().fetch_add(op.slices, std::memory_order_relaxed);
  return attnSuccess;
}

std::atomic<uint64_t>& stagedP2pSlices() {
  static std::atomic<uint64_t> slices{0};
  return slices;
}

}  // namespace attn
