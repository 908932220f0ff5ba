// C API: attnMemAlloc / attnMemFree (src/core/shareable_memory.h does the work).
#include "src/core/api_guard.h"
#include "src/core/error.h"
#include "src/core/shareable_memory.h"

using namespace attn;

extern "C" attnResult_t attnMemAlloc(void** ptr, size_t size) {
  return guardedEntry([&]() -> attnResult_t {
    clearThreadLastError();
    if (ptr == nullptr) return setError(attnInvalidArgument, "attnMemAlloc: ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return setError(attnInvalidArgument, "attnMemAlloc: size is 0");
    return shareableAlloc(size, ptr);
  });
}

extern "C" attnResult_t attnMemFree(void* ptr) {
  return guardedEntry([&]() -> attnResult_t {
    clearThreadLastError();
    if (ptr == nullptr) return attnSuccess;
    return shareableFree(ptr);
  });
}
