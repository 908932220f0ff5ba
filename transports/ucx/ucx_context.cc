#include "transports/ucx/ucx_context.h"

#include <poll.h>
#include <time.h>

#include <algorithm>
#include <thread>

#include "src/core/error.h"
#include "src/core/log.h"

namespace attn::ucx {
namespace {

// A worker that is still closing endpoints when it is destroyed waits this
// long for the peers to acknowledge (flush), then drops them.
constexpr auto kCloseDrain = std::chrono::milliseconds(1000);
constexpr unsigned kMaxProgressRounds = 64;

}  // namespace

const char* statusText(ucs_status_t s) { return ucs_status_string(s); }

namespace {

// Whether this UCX moves CUDA device memory (built with CUDA, its cuda
// module loaded).
bool supportsCudaMemory(ucp_context_h context) {
#if ATTN_CUDA_EMULATION
  // tests/cuda_emu: "device" memory is host memory, which every UCX moves;
  // this opens the device path for the emulated tests without a GPU.
  (void)context;
  return true;
#else
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context, &attr) != UCS_OK) return false;
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
#endif
}

}  // namespace

attnResult_t UcxWorker::create(bool allowDevice, std::unique_ptr<UcxWorker>* out) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);  // UCX_* environment
  if (st != UCS_OK)
    return setError(attnSystemError, "ucx: reading UCX configuration failed: %s", statusText(st));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = "attncomm";
  st = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (st != UCS_OK)
    return setError(attnSystemError, "ucx: ucp_init failed: %s (check UCX_TLS / UCX_NET_DEVICES)",
                    statusText(st));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (st != UCS_OK)
    return setError(attnSystemError, "ucx: ucp_worker_create failed: %s", statusText(st));
  if (ucp_worker_get_efd(w->worker_, &w->efd_) != UCS_OK) w->efd_ = -1;
  const bool cuda = supportsCudaMemory(w->context_);
  w->deviceMemory_ = allowDevice && cuda;
  ATTN_INFO(kLogNet, "ucx: worker ready (%s; device buffers %s)",
            w->efd_ >= 0 ? "wakeup by event fd" : "no event fd: short sleeps",
            w->deviceMemory_ ? "moved by UCX" : !cuda ? "staged: this UCX has no CUDA support" : "staged: ATTN_UCX_CUDA=0");
  *out = std::move(w);
  return attnSuccess;
}

void UcxWorker::closeAfterFlush(ucp_ep_h ep, void* flush) {
  flushing_.push_back(Closing{ep, flush});
  finishFlushes(false);
}

// Closes (forcibly: the flush already moved the data) every endpoint whose
// flush ended; with `force`, all of them.
void UcxWorker::finishFlushes(bool force) {
  size_t keep = 0;
  for (Closing& c : flushing_) {
    const bool done = !c.flush || ucp_request_check_status(c.flush) != UCS_INPROGRESS;
    if (!done && !force) {
      flushing_[keep++] = c;
      continue;
    }
    if (c.flush) ucp_request_free(c.flush);
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(c.ep, &prm);
    if (UCS_PTR_IS_PTR(sp)) closing_.push_back(sp);
  }
  flushing_.resize(keep);
}

UcxWorker::~UcxWorker() {
  if (worker_) {
    std::lock_guard<std::mutex> g(mu_);
    auto end = std::chrono::steady_clock::now() + kCloseDrain;
    // Quarantined: no progress, not even to finish goodbyes (see the header).
    if (quarantined_) finishFlushes(true);
    for (;;) {
      if (quarantined_) break;
      ucp_worker_progress(worker_);
      finishFlushes(std::chrono::steady_clock::now() > end);
      size_t open = 0;
      for (void*& r : closing_) {
        if (r && ucp_request_check_status(r) != UCS_INPROGRESS) {
          ucp_request_free(r);
          r = nullptr;
        }
        open += r != nullptr;
      }
      if (open == 0 && flushing_.empty()) break;
      if (std::chrono::steady_clock::now() > end + kCloseDrain / 4) {
        ATTN_INFO(kLogNet, "ucx: %zu close/flush request(s) unfinished at worker teardown", open);
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    for (void* r : closing_)
      if (r) ucp_request_free(r);  // the worker's destruction releases it
    if (!quarantined_) drainUnexpected();
    ucp_worker_destroy(worker_);
  }
  if (context_) ucp_cleanup(context_);
}

attnResult_t UcxWorker::address(std::vector<uint8_t>* out) const {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK)
    return setError(attnSystemError, "ucx: ucp_worker_get_address failed: %s", statusText(st));
  const uint8_t* p = reinterpret_cast<const uint8_t*>(addr);
  out->assign(p, p + len);
  ucp_worker_release_address(worker_, addr);
  return attnSuccess;
}

unsigned UcxWorker::progressLocked() {
  if (quarantined_) return 0;
  unsigned total = 0;
  for (unsigned i = 0; i < kMaxProgressRounds; ++i) {
    unsigned n = ucp_worker_progress(worker_);
    total += n;
    if (n == 0) break;
  }
  return total;
}

void UcxWorker::quarantine(const std::string& why) {
  if (quarantined_) return;
  quarantined_ = true;
  quarantineWhy_ = why;
  ATTN_WARN(kLogNet, "ucx: %s; the worker is never progressed again and every connection on it "
                     "fails (UCX could write into a buffer whose request failed)",
            why.c_str());
}

void UcxWorker::wait(int timeoutUs) {
  if (timeoutUs < 0) timeoutUs = 0;
  if (quarantined_) {  // nothing will ever arrive: a short nap, no arming
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(timeoutUs, 1000)));
    return;
  }
  {
    // No progress here: callbacks would touch the connections outside the
    // engine's lock. The engine progressed just before it chose to sleep.
    std::lock_guard<std::mutex> g(mu_);
    if (efd_ < 0) {
      timeoutUs = std::min(timeoutUs, 50);
    } else {
      ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile
      if (st != UCS_OK) timeoutUs = std::min(timeoutUs, 50);
    }
  }
  if (efd_ < 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(timeoutUs));
    return;
  }
  pollfd pfd{efd_, POLLIN, 0};
  timespec ts{timeoutUs / 1000000, long(timeoutUs % 1000000) * 1000};
  ppoll(&pfd, 1, &ts, nullptr);
}

// Goodbyes (and late messages of a broken link) that no receive will take:
// consume them, so UCX does not warn about each at teardown.
void UcxWorker::drainUnexpected() {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  std::vector<char> sink;
  while (std::chrono::steady_clock::now() < end) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
    if (!msg) return;
    sink.resize(std::max<size_t>(info.length, 1));
    ucp_request_param_t prm{};
    ucs_status_ptr_t sp = ucp_tag_msg_recv_nbx(worker_, sink.data(), info.length, msg, &prm);
    if (!UCS_PTR_IS_PTR(sp)) continue;
    while (ucp_request_check_status(sp) == UCS_INPROGRESS && std::chrono::steady_clock::now() < end)
      ucp_worker_progress(worker_);
    if (ucp_request_check_status(sp) == UCS_INPROGRESS) ucp_request_cancel(worker_, sp);
    ucp_request_free(sp);
  }
}

void UcxWorker::adoptCloseRequest(void* req) { closing_.push_back(req); }

uint64_t* UcxWorker::keep(uint64_t value) {
  kept_.push_back(value);
  return &kept_.back();
}

}  // namespace attn::ucx
