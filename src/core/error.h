// Error plumbing: codes travel as attnResult_t, the readable cause travels in
// a thread-local message that the C API copies into the communicator.
#pragma once

#include <string>

#include "attncomm.h"

namespace attn {

// Records `fmt` as the calling thread's last error (prefixed with the thread's
// rank context, see ErrorContext), logs it at WARN and returns `code`.
attnResult_t setError(attnResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// The calling thread's last error text ("" if none).
const std::string& threadLastError();
void clearThreadLastError();
// Makes `why` (an earlier error's text, rank prefix included) the thread's
// last error again, should later calls have replaced it; returns `code`.
attnResult_t restoreError(attnResult_t code, const std::string& why);

// Names the rank that the current thread acts for, so messages say
// "rank 3 (host h, pid p): ...". Scoped: restores the previous context.
// Every API call makes one, so the common case copies nothing: a named
// string (a communicator's prefix) is borrowed and must outlive the scope;
// a temporary or a literal is kept in the context itself.
class ErrorContext {
 public:
  explicit ErrorContext(const std::string& prefix);
  explicit ErrorContext(std::string&& prefix);
  explicit ErrorContext(const char* prefix);
  ~ErrorContext();
  ErrorContext(const ErrorContext&) = delete;
  ErrorContext& operator=(const ErrorContext&) = delete;
  static const std::string& current();
  // The context of a thread that acts for no rank ("-").
  static const std::string& none();

 private:
  const std::string* saved_;
  std::string owned_;
};

// Leaves a file:line trail at TRACE level as an error unwinds.
void traceError(const char* file, int line, attnResult_t code);

}  // namespace attn

// Returns early from the enclosing function when `call` fails.
#define ATTN_CHECK(call)                                \
  do {                                                  \
    attnResult_t attn_res_ = (call);                    \
    if (attn_res_ != attnSuccess) {                     \
      ::attn::traceError(__FILE__, __LINE__, attn_res_); \
      return attn_res_;                                 \
    }                                                   \
  } while (0)

// Fails with attnInvalidArgument and a message when `cond` is false.
#define ATTN_REQUIRE(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) return ::attn::setError(attnInvalidArgument, __VA_ARGS__); \
  } while (0)
