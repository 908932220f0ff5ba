#include "src/attn/ring_steps.h"

#include "src/core/comm.h"

namespace attn {

attnResult_t HostRingMover::post(int, Request* send, Request* recv) {
  ATTN_CHECK(e_.irecv(prev_, buf_[1 - cur_].data(), capacity_, recv));
  return e_.isend(next_, buf_[cur_].data(), bytes_, send);
}

attnResult_t HostRingMover::advance(ProgressThread& driver, Request* send, Request* recv, double* waitUs) {
  const auto t0 = Clock::now();
  ATTN_CHECK(driver.wait(send));
  ATTN_CHECK(driver.wait(recv));
  *waitUs += usSince(t0);
  bytes_ = recv->bytes;
  cur_ = 1 - cur_;
  return attnSuccess;
}

RingSteps::RingSteps(AttnCall& c, size_t largestMessage)
    : c_(c), n_(c.comm->nranks), req_(new Request[2 * size_t(c.comm->nranks)]), guard_(*c.comm->engine) {
  if (n_ > 1)
    driver_ = std::make_unique<ProgressThread>(*c.comm->engine, c.comm->prefix, driveModeFor(largestMessage, largestKernelMacs(c)));
}

}  // namespace attn
