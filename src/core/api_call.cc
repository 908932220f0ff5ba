// ApiCall's handle check and the last resort of guardedEntry (api_call.h).
#include "src/core/api_call.h"

namespace attn {
namespace {

// The live communicator `comm` names, held (pinned) for the call; null when
// it names none (one being destroyed included).
attnComm* admit(attnComm* comm, HandleLookup* lookup) {
  if (comm == nullptr) return nullptr;
  *lookup = acquireHandle(comm, HandleKind::kComm);
  if (lookup->state != HandleState::kLive) return nullptr;
  if (comm->magic != attnComm::kMagic) {  // the table and the object disagree: never use it
    comm->activeCalls.fetch_sub(1, std::memory_order_acq_rel);
    lookup->state = HandleState::kUnknown;
    return nullptr;
  }
  return comm;
}

}  // namespace

ApiCall::ApiCall(attnComm* comm)
    : comm_(admit(comm, &lookup_)), handle_(comm), ctx_(comm_ ? comm_->prefix : ErrorContext::none()) {
  clearThreadLastError();
}

attnResult_t ApiCall::checkHandle() const {
  return comm_ ? attnSuccess : badHandle("", handle_, HandleKind::kComm, lookup_);
}

attnResult_t ApiCall::check() const {
  ATTN_CHECK(checkHandle());
  return checkCommUsable(comm_);
}

attnResult_t failFromException(attnResult_t code, const char* what) noexcept {
  try {
    return setError(code, "%s%s", code == attnSystemError ? "" : "unexpected exception: ", what);
  } catch (...) {
    return code;  // no room even for the message: the code alone
  }
}

}  // namespace attn
