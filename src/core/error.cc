#include "src/core/error.h"

#include <cstdarg>
#include <cstdio>

#include "src/core/kernel_setup.h"
#include "src/core/log.h"

namespace attn {
namespace {
thread_local std::string tlsLastError;
const std::string kNoContext = "-";
thread_local const std::string* tlsContext = &kNoContext;
// Kernels report through setError and take ATTN_CPU_ISA from here; this file
// is linked into every program that uses the library.
[[maybe_unused]] const bool kKernelsSetUp = (setUpKernels(), true);
}  // namespace

attnResult_t setError(attnResult_t code, const char* fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  tlsLastError = *tlsContext == kNoContext ? std::string(msg) : *tlsContext + ": " + msg;
  ATTN_WARN(kLogAll, "%s (%s)", msg, attnGetErrorString(code));
  return code;
}

const std::string& threadLastError() { return tlsLastError; }
void clearThreadLastError() { tlsLastError.clear(); }
attnResult_t restoreError(attnResult_t code, const std::string& why) {
  tlsLastError = why;
  return code;
}

ErrorContext::ErrorContext(const std::string& prefix) : saved_(tlsContext) { tlsContext = &prefix; }
ErrorContext::ErrorContext(std::string&& prefix) : saved_(tlsContext), owned_(std::move(prefix)) {
  tlsContext = &owned_;
}
ErrorContext::ErrorContext(const char* prefix) : ErrorContext(std::string(prefix)) {}
ErrorContext::~ErrorContext() { tlsContext = saved_; }
const std::string& ErrorContext::current() { return *tlsContext; }
const std::string& ErrorContext::none() { return kNoContext; }

void traceError(const char* file, int line, attnResult_t code) {
  ATTN_TRACE(kLogAll, "%s:%d -> %s", file, line, attnGetErrorString(code));
}

}  // namespace attn
