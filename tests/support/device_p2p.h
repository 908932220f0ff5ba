// Grouped sends and receives on device buffers with messages around a
// slice size (src/device/backends/staging/staged_p2p.h): of one slice or less, exactly one,
// one byte more, several with a short last slice, and one that needs more
// than 256 slices (the slices grow to size / 256 instead).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"
#include "device_checks.h"

namespace attn_test {

inline size_t P2pSlices(size_t bytes, size_t chunk) {
  if (bytes <= chunk) return 0;  // one whole message: not counted
  const size_t slice = std::max(chunk, (bytes + 255) / 256);
  return (bytes + slice - 1) / slice;
}

inline uint8_t P2pByte(int from, size_t msg, size_t i) { return uint8_t(from * 131 + msg * 29 + i * 7 + (i >> 11)); }

// One group: every size to the next rank and, reversed, to the previous
// one; the same from both; and a self pair. Every received byte is
// checked. Returns the slices this rank should have moved when messages
// are cut at `chunk` (each side counts its own).
inline size_t CheckDevSlicedP2p(attnComm_t comm, int rank, int n, size_t chunk) {
  SCOPED_TRACE("send/recv on rank " + std::to_string(rank));
  cudaStream_t s;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  std::vector<size_t> sizes = {0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 17, 300 * chunk + 3}, reversed(sizes.rbegin(), sizes.rend());
  struct Msg {
    bool send;
    int peer;
    size_t bytes;
    int from;    // whose bytes
    size_t tag;  // message number at the sender
    void* dev = nullptr;
  };
  std::vector<Msg> msgs;
  for (size_t i = 0; i < sizes.size(); ++i) msgs.push_back({true, next, sizes[i], rank, i});
  for (size_t i = 0; i < reversed.size(); ++i) msgs.push_back({true, prev, reversed[i], rank, 100 + i});
  for (size_t i = 0; i < sizes.size(); ++i) msgs.push_back({false, prev, sizes[i], prev, i});
  for (size_t i = 0; i < reversed.size(); ++i) msgs.push_back({false, next, reversed[i], next, 100 + i});
  msgs.push_back({true, rank, 3 * chunk + 5, rank, 999});
  msgs.push_back({false, rank, 3 * chunk + 5, rank, 999});
  size_t slices = 0;
  std::vector<std::vector<uint8_t>> up(msgs.size());  // alive until the stream has them
  for (size_t j = 0; j < msgs.size(); ++j) {
    Msg& m = msgs[j];
    EXPECT_EQ(cudaMallocAsync(&m.dev, m.bytes + 1, s), cudaSuccess);
    up[j].resize(m.bytes);
    for (size_t i = 0; i < m.bytes; ++i) up[j][i] = m.send ? P2pByte(m.from, m.tag, i) : 0xEE;
    EXPECT_EQ(cudaMemcpyAsync(m.dev, up[j].data(), m.bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
    if (m.peer != rank) slices += P2pSlices(m.bytes, chunk);
  }
  EXPECT_EQ(attnGroupStart(), attnSuccess);
  for (const Msg& m : msgs) {
    const attnResult_t r = m.send ? attnSend(m.dev, m.bytes, attnUint8, m.peer, comm, AsStream(s))
                                  : attnRecv(m.dev, m.bytes, attnUint8, m.peer, comm, AsStream(s));
    EXPECT_EQ(r, attnSuccess) << attnGetLastError(comm);
  }
  EXPECT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (const Msg& m : msgs) {
    if (m.send) continue;
    std::vector<uint8_t> h(m.bytes);
    EXPECT_EQ(cudaMemcpyAsync(h.data(), m.dev, m.bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    size_t bad = 0, firstBad = 0;
    for (size_t i = 0; i < m.bytes; ++i)
      if (h[i] != P2pByte(m.from, m.tag, i) && bad++ == 0) firstBad = i;
    EXPECT_EQ(bad, 0u) << m.bytes << "-byte message " << m.tag << " from rank " << m.peer << ": first wrong byte "
                       << firstBad << " (got " << int(h[firstBad]) << ", want " << int(P2pByte(m.from, m.tag, firstBad)) << ")";
  }
  for (Msg& m : msgs) EXPECT_EQ(cudaFreeAsync(m.dev, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  attnResult_t async = attnInternalError;
  EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
  cudaStreamDestroy(s);
  return slices;
}

}  // namespace attn_test
