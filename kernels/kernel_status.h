// How kernels (kernels/cpu, kernels/cuda) report failure without knowing the
// library above them: a code from the public attnResult_t (include/attncomm.h,
// which every layer may include) and a readable message kept per thread.
// The caller (src/) installs a reporter once per process that turns every
// failure into its own error record (setError); without one the message
// stays only in kernelLastError().
#pragma once

#include "attncomm.h"

namespace attn::kernels {

// Receives each failure as it happens: the code and the formatted message.
using ErrorReporter = void (*)(attnResult_t code, const char* message);
// Installs (or, with nullptr, removes) the process-wide reporter.
void setErrorReporter(ErrorReporter reporter);

// Records `fmt` as the calling thread's last kernel error, hands it to the
// reporter if one is installed, and returns `code`.
attnResult_t fail(attnResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// The calling thread's last kernel error text ("" if none).
const char* kernelLastError();

}  // namespace attn::kernels

// Returns early from the enclosing kernel function when `call` fails.
#define KERNEL_CHECK(call)                          \
  do {                                              \
    attnResult_t kernel_res_ = (call);              \
    if (kernel_res_ != attnSuccess) return kernel_res_; \
  } while (0)

// Fails with attnInvalidArgument and a message when `cond` is false.
#define KERNEL_REQUIRE(cond, ...)                                                 \
  do {                                                                            \
    if (!(cond)) return ::attn::kernels::fail(attnInvalidArgument, __VA_ARGS__); \
  } while (0)
