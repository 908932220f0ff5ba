#include "src/attn/ring_steps.h"

#include "src/core/comm.h"

namespace attn {

attnResult_t HostRingMover::post(int, Request* send, Request* recv) {
  if (recv) ATTN_CHECK(e_.irecv(prev_, buf_[1 - cur_].data(), capacity_, recv));
  if (!send) return attnSuccess;
  sent_ += bytes_;
  return e_.isend(next_, buf_[cur_].data(), bytes_, send);
}

attnResult_t HostRingMover::advance(ProgressThread& driver, Request* send, Request* recv, double* waitUs) {
  const auto t0 = Clock::now();
  if (send) ATTN_CHECK(driver.wait(send));
  if (recv) ATTN_CHECK(driver.wait(recv));
  *waitUs += usSince(t0);
  bytes_ = recv ? recv->bytes : 0;  // nothing held when nothing came
  cur_ = 1 - cur_;
  return attnSuccess;
}

RingSteps::RingSteps(AttnCall& c, size_t largestMessage)
    : c_(c), n_(c.comm->nranks), me_(c.comm->rank), prev_((c.comm->rank - 1 + c.comm->nranks) % c.comm->nranks),
      req_(new Request[2 * size_t(c.comm->nranks)]), guard_(*c.comm->engine) {
  if (n_ > 1)
    driver_ = std::make_unique<ProgressThread>(*c.comm->engine, c.comm->prefix, driveModeFor(largestMessage, largestKernelMacs(c)));
}

}  // namespace attn
