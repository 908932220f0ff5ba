#include "src/device/device_ring.h"

#include "src/device/cuda_check.h"

namespace attn {

attnResult_t DeviceRing::reserve(DeviceAttnState& R, size_t capacity) {
  for (int b = 0; b < 2; ++b) {
    ATTN_CHECK(R.hostBlock[b].reserve(capacity));
    ATTN_CHECK(R.block[b].reserve(capacity, R.compute));
  }
  return attnSuccess;
}

attnResult_t DeviceRing::loadOwn(int numSeqs, const RowsRef& rows, size_t rowBytes) {
  const int tensors = rows.t1 ? 2 : 1;
  char* h0 = R_.hostBlock[0].base();
  char* d0 = R_.block[0].get();
  const BlockLayout own = packBlockMeta(me_, numSeqs, rows.offsets, rows.pos, rows.rows, rowBytes, tensors, h0);
  const void* t[2] = {rows.t0, rows.t1};
  const bool peers = next_ != me_;
  for (int i = 0; i < tensors && rows.rows && peers; ++i)
    ATTN_CUDA_CHECK(cudaMemcpyAsync(h0 + own.tensorAt + i * own.tensorBytes, t[i], own.tensorBytes,
                                    cudaMemcpyDefault, copy_));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.ownOnHost, copy_));
  ATTN_CUDA_CHECK(cudaMemcpyAsync(d0, h0, own.tensorAt, cudaMemcpyHostToDevice, copy_));
  for (int i = 0; i < tensors && rows.rows; ++i)
    ATTN_CUDA_CHECK(cudaMemcpyAsync(d0 + own.tensorAt + i * own.tensorBytes, t[i], own.tensorBytes,
                                    cudaMemcpyDefault, copy_));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.blockReady[0], copy_));
  bytes_ = own.total;
  cur_ = 0;
  return attnSuccess;
}

attnResult_t DeviceRing::post(int s, Request* sendReq, Request* recvReq) {
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
  ATTN_CUDA_CHECK(cudaStreamWaitEvent(copy_, R_.kernelDone[nb], 0));
  ATTN_CUDA_CHECK(cudaMemcpyAsync(R_.block[nb].get(), R_.hostBlock[nb].base(), recvReq->bytes,
                                  cudaMemcpyHostToDevice, copy_));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.blockReady[nb], copy_));
  bytes_ = recvReq->bytes;
  cur_ = nb;
  return attnSuccess;
}

}  // namespace attn
