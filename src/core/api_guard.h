// The outermost frame of every extern "C" function: nothing but a result
// code leaves it, whatever its body throws (tests/test_api_guards.cc checks
// that each entry point's body is `return guardedEntry(...)`, or
// `guardedText` for those that return text).
#pragma once

#include <exception>
#include <new>

#include "attncomm.h"

namespace attn {

// Sets the thread's error text (if there is memory for it) and returns code.
attnResult_t failFromException(attnResult_t code, const char* what) noexcept;

template <class Op>
attnResult_t guardedEntry(Op&& op) noexcept {
  try {
    return op();
  } catch (const std::bad_alloc&) {
    return failFromException(attnSystemError, "out of memory");
  } catch (const std::exception& e) {
    return failFromException(attnInternalError, e.what());
  } catch (...) {
    return failFromException(attnInternalError, "an unknown C++ exception");
  }
}

// The same for the entry points that return text: `fallback` on an exception.
template <class Op>
const char* guardedText(const char* fallback, Op&& op) noexcept {
  try {
    return op();
  } catch (...) {
    return fallback;
  }
}

}  // namespace attn
