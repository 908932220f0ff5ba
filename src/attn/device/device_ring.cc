#include "src/attn/device/device_ring.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "src/device/cuda_check.h"
#include "src/device/backends/direct/transport_direct.h"
#include "src/device/backends/cuda_ipc/ipc_state.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace attn {

DeviceRing::~DeviceRing() { closePrev(); }

attnResult_t DeviceRing::reserve(DeviceAttnState& R, size_t capacity, const RingLink* link) {
  const bool exportable = link && ((link->direct() && link->nextByHandle()) || link->viaTransport());
  for (int b = 0; b < 2; ++b) {
    ATTN_CHECK(R.hostBlock[b].reserve(capacity));
    if (exportable) R.block[b].makeExportable(R.compute);
    ATTN_CHECK(R.block[b].reserve(capacity, R.compute));
  }
  return attnSuccess;
}

attnResult_t DeviceRing::loadOwn(int numSeqs, const RowsRef& rows, RowBytes rowBytes) {
  if (!rows.t1) rowBytes = RowBytes::one(rowBytes.t0);
  rowBytes_ = rowBytes;
  char* h0 = R_.hostBlock[0].base();
  char* d0 = R_.block[0].get();
  const BlockLayout own = packBlockMeta(me_, numSeqs, rows.offsets, rows.pos, rows.rows, rowBytes, h0);
  const void* t[2] = {rows.t0, rows.t1};
  const size_t at[2] = {own.t0At, own.t1At}, bytes[2] = {own.t0Bytes, own.t1Bytes};
  const bool staged = next_ != me_ && !direct_ && !viaTransport_;
  for (int i = 0; i < rowBytes.tensors && rows.rows && staged; ++i)
    ATTN_CUDA_CHECK(cudaMemcpyAsync(h0 + at[i], t[i], bytes[i], cudaMemcpyDefault, copy_));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.ownOnHost, copy_));
  ATTN_CUDA_CHECK(cudaMemcpyAsync(d0, h0, own.t0At, cudaMemcpyHostToDevice, copy_));
  for (int i = 0; i < rowBytes.tensors && rows.rows; ++i)
    ATTN_CUDA_CHECK(cudaMemcpyAsync(d0 + at[i], t[i], bytes[i], cudaMemcpyDefault, copy_));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.blockReady[0], copy_));
  bytes_ = own.total;
  metaBytes_ = own.t0At;
  cur_ = 0;
  if (!direct_) return attnSuccess;
  return tradePeeks();
}

// Direct: the neighbours learn each other's device buffers (with handles
// when they are other processes), and this rank opens its previous rank's.
attnResult_t DeviceRing::tradePeeks() {
  // Before anything is sent: the next rank counts its first read only
  // after it has our first metadata.
  readsBase_ = link_->reads().load(std::memory_order_acquire);
  ipc::IpcState& ipcState = link_->ipc();
  Peek mine;
  for (int b = 0; b < 2; ++b) {
    std::string why;
    ATTN_CHECK(ipcState.exporter().describe(R_.block[b].get(), R_.block[b].capacity(), ipcState.device(),
                                            link_->nextByHandle(), &mine.block[b], &why));
    if (!mine.block[b].usable)
      return setError(attnInternalError, "ring: rank %d cannot offer its ring buffer to rank %d: %s", me_, next_,
                      why.c_str());
  }
  Request send, recv;
  ATTN_CHECK(e_.irecv(prev_, &prevPeek_, sizeof(prevPeek_), &recv));
  ATTN_CHECK(e_.isend(next_, &mine, sizeof(mine), &send));
  ATTN_CHECK(e_.wait(&send));
  ATTN_CHECK(e_.wait(&recv));
  for (int b = 0; b < 2; ++b) {
    const ipc::IpcBuffer& buf = prevPeek_.block[b];
    if (!link_->prevByHandle()) {
      prevBlock_[b] = reinterpret_cast<const char*>(buf.ptr);
      continue;
    }
    if (!buf.hasHandle || buf.ptr < buf.base)
      return setError(attnInternalError, "ring: rank %d sent no IPC handle for its ring buffer", prev_);
    void* base = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&base, buf.handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return setError(attnUnhandledCudaError, "ring: opening rank %d's ring buffer (cudaIpcOpenMemHandle) failed: %s",
                      prev_, cudaGetErrorString(err));
    }
    prevOpened_[b] = base;
    prevBlock_[b] = static_cast<const char*>(base) + (buf.ptr - buf.base);
    ipc::ipcCounters().ringOpens.fetch_add(1, std::memory_order_relaxed);
  }
  return attnSuccess;
}

void DeviceRing::closePrev() {
  for (void*& p : prevOpened_) {
    if (!p) continue;
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) (void)cudaGetLastError();
    p = nullptr;
    ipc::ipcCounters().ringCloses.fetch_add(1, std::memory_order_relaxed);
  }
}

attnResult_t DeviceRing::post(int s, Request* sendReq, Request* recvReq) {
  if (viaTransport_) {
    // Block s must be in the device buffer before it is sent from there
    // (later blocks arrived there before advance returned).
    if (s == 0) ATTN_CUDA_CHECK(cudaEventSynchronize(R_.blockReady[0]));
    ATTN_CHECK(e_.irecv(prev_, R_.hostBlock[1 - cur_].base(), capacity_, recvReq));
    ATTN_CHECK(e_.isend(next_, R_.hostBlock[cur_].base(), metaBytes_, sendReq));
    return e_.isendDevice(next_, R_.block[cur_].get(), bytes_, &deviceReq_.emplace_back());
  }
  if (direct_) {
    // The metadata says "block s is in my device buffer": it must be.
    // (Later blocks were synchronised when they arrived, in advance.)
    if (s == 0) ATTN_CUDA_CHECK(cudaEventSynchronize(R_.blockReady[0]));
    ATTN_CHECK(e_.irecv(prev_, R_.hostBlock[1 - cur_].base(), capacity_, recvReq));
    return e_.isend(next_, R_.hostBlock[cur_].base(), metaBytes_, sendReq);
  }
  // Block s leaves host buffer `cur` once it is there (the own block once
  // copied down); the other buffer's block s-1 must be uploaded before it
  // is received into.
  ATTN_CUDA_CHECK(cudaEventSynchronize(s == 0 ? R_.ownOnHost : R_.blockReady[1 - cur_]));
  ATTN_CHECK(e_.irecv(prev_, R_.hostBlock[1 - cur_].base(), capacity_, recvReq));
  return e_.isend(next_, R_.hostBlock[cur_].base(), bytes_, sendReq);
}

attnResult_t DeviceRing::advance(ProgressThread& driver, Request* sendReq, Request* recvReq, double* waitUs) {
  auto t0 = Clock::now();
  ATTN_CHECK(driver.wait(sendReq));
  ATTN_CHECK(driver.wait(recvReq));
  *waitUs += usSince(t0);
  const int nb = 1 - cur_;
  if (viaTransport_) return receiveDevice(driver, recvReq, waitUs);
  ATTN_CUDA_CHECK(cudaStreamWaitEvent(copy_, R_.kernelDone[nb], 0));
  if (!direct_) {
    ATTN_CUDA_CHECK(cudaMemcpyAsync(R_.block[nb].get(), R_.hostBlock[nb].base(), recvReq->bytes,
                                    cudaMemcpyHostToDevice, copy_));
    ATTN_CUDA_CHECK(cudaEventRecord(R_.blockReady[nb], copy_));
    bytes_ = recvReq->bytes;
    cur_ = nb;
    return attnSuccess;
  }
  // The block's size from its header; the metadata must be all of it.
  BlockLayout l;
  ATTN_CHECK(checkMeta(nb, recvReq->bytes, &l));
  if (l.total > prevPeek_.block[cur_].bytes)
    return setError(attnInvalidUsage, "ring: rank %d's block (%zu bytes) does not fit its ring buffer (%llu)",
                    prev_, l.total, (unsigned long long)prevPeek_.block[cur_].bytes);
  // Our buffer nb held block s-1, which the next rank read during step s-1.
  ATTN_CHECK(waitReads(uint64_t(steps_), waitUs));
  ATTN_CUDA_CHECK(cudaMemcpyAsync(R_.block[nb].get(), prevBlock_[cur_], l.total, cudaMemcpyDefault, copy_));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.blockReady[nb], copy_));
  ATTN_CUDA_CHECK(cudaEventSynchronize(R_.blockReady[nb]));
  // Done reading prev's buffer: it may fill it again.
  link_->prevReads().fetch_add(1, std::memory_order_acq_rel);
  ipc::ipcCounters().ringPulls.fetch_add(1, std::memory_order_relaxed);
  bytes_ = l.total;
  metaBytes_ = l.t0At;
  cur_ = nb;
  ++steps_;
  return attnSuccess;
}

// Via the transport: the metadata of block s+1 is here (recvReq); its
// device block follows into the other device buffer, received once the
// kernel that read that buffer (step s-1's) is done. Block s's device send
// is waited for too: the next step receives into its buffer.
attnResult_t DeviceRing::receiveDevice(ProgressThread& driver, Request* recvReq, double* waitUs) {
  const int nb = 1 - cur_;
  BlockLayout l;
  ATTN_CHECK(checkMeta(nb, recvReq->bytes, &l));
  ATTN_CUDA_CHECK(cudaEventSynchronize(R_.kernelDone[nb]));
  Request* sent = &deviceReq_.back();
  Request* got = &deviceReq_.emplace_back();
  ATTN_CHECK(e_.irecvDevice(prev_, R_.block[nb].get(), capacity_, got));
  ATTN_CHECK(driver.kick());
  const auto t0 = Clock::now();
  ATTN_CHECK(driver.wait(sent));
  ATTN_CHECK(driver.wait(got));
  *waitUs += usSince(t0);
  if (got->bytes != l.total)
    return setError(attnInvalidUsage, "ring: rank %d sent a %zu-byte block, its metadata says %zu", prev_,
                    got->bytes, l.total);
  // Complete in device memory: the record only lets the compute stream's
  // wait for blockReady pass.
  ATTN_CUDA_CHECK(cudaEventRecord(R_.blockReady[nb], copy_));
  directCounters().ringSteps.fetch_add(1, std::memory_order_relaxed);
  bytes_ = l.total;
  metaBytes_ = l.t0At;
  cur_ = nb;
  ++steps_;
  return attnSuccess;
}

// The metadata of the block now in host buffer `nb` (`got` bytes), which
// must be all of it: its layout, checked against the buffers.
attnResult_t DeviceRing::checkMeta(int nb, size_t got, BlockLayout* out) const {
  BlockHeader h;
  if (got < sizeof(h))
    return setError(attnRemoteError, "ring: %zu bytes of block metadata from rank %d", got, prev_);
  std::memcpy(&h, R_.hostBlock[nb].base(), sizeof(h));
  BlockLayout l;
  if (!BlockLayout::checked(h.num_seqs, h.rows, rowBytes_, &l) || l.t0At != got || l.total > capacity_)
    return setError(attnRemoteError, "ring: block from rank %d does not match its metadata (%zu bytes, %d rows)",
                    prev_, got, h.rows);
  *out = l;
  return attnSuccess;
}

attnResult_t DeviceRing::waitReads(uint64_t count, double* waitUs) {
  std::atomic<uint64_t>& reads = link_->reads();
  if (reads.load(std::memory_order_acquire) - readsBase_ >= count) return attnSuccess;
  // The next rank may fail and never read (its failure breaks our engine),
  // its process may die (watched here), or it may stall past the timeout.
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(e_.timeoutMs() > 0 ? e_.timeoutMs() : 1 << 30);
  for (int spins = 0; reads.load(std::memory_order_acquire) - readsBase_ < count; ++spins) {
    if (e_.broken()) return setError(e_.brokenResult(), "ring: the communicator broke while rank %d read", next_);
    if (e_.aborted()) return setError(attnRemoteError, "ring: communicator aborted while rank %d read", next_);
    if (!link_->nextAlive()) {
      // Nothing else would notice: no request to it is in flight. Breaking
      // the engine closes our connections, so the other ranks fail fast too.
      const std::string why = "ring: peer rank " + std::to_string(next_) + " (pid " +
                              std::to_string(link_->nextPid()) + ") exited before reading rank " +
                              std::to_string(me_) + "'s block";
      e_.breakWith(attnRemoteError, why);
      return setError(attnRemoteError, "%s", why.c_str());
    }
    if (Clock::now() > deadline)
      return setError(attnTimeout, "ring: rank %d did not finish reading this rank's block", next_);
    if (spins < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  *waitUs += usSince(t0);
  return attnSuccess;
}

attnResult_t DeviceRing::finish(int moves, double* waitUs) {
  if (!direct_) return attnSuccess;
  // Our copies out of prev's buffers were synchronised as they arrived.
  // Close first, then wait: every rank waits on its next one, so waiting
  // first would wait in a circle.
  if (link_->prevByHandle()) {
    closePrev();
    link_->prevReads().fetch_add(1, std::memory_order_acq_rel);
  }
  return waitReads(uint64_t(moves) + (link_->nextByHandle() ? 1 : 0), waitUs);
}

}  // namespace attn
