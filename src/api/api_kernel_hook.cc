// C API of the kernel hook: an engine's own partial-attention kernel in
// place of the built-in one (attnCommSetAttnKernel, and
// attnCommSetAttnKernelEx with the kernel's native output dtype and LSE
// convention, folded as they are: attn_call.cc, device_attn_kernels.cc).
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "src/attn/attn_state.h"
#include "src/core/api_call.h"

using namespace attn;

namespace {

// Every field of 0.2, the descriptor's first version.
constexpr size_t kMinKernelSize = offsetof(attnAttnKernel_t, lse_layout) + sizeof(attnLseLayout_t);

// The caller's descriptor as this library's struct (fields past the
// caller's size take their defaults), its values checked.
attnResult_t readKernel(const attnAttnKernel_t* user, attnAttnKernel_t* out) {
  ATTN_REQUIRE(user->magic == ATTN_ATTN_KERNEL_MAGIC,
               "attnAttnKernel_t not initialised (magic 0x%x): start from ATTN_ATTN_KERNEL_INITIALIZER or "
               "ATTN_ATTN_KERNEL(...)",
               user->magic);
  ATTN_REQUIRE(user->size >= kMinKernelSize && user->size <= (size_t(1) << 16),
               "attnAttnKernel_t size %zu is not one this library knows (at least %zu)", user->size,
               kMinKernelSize);
  *out = ATTN_ATTN_KERNEL_INITIALIZER;
  std::memcpy(out, user, std::min(user->size, sizeof(*out)));
  out->size = sizeof(*out);
  ATTN_REQUIRE(cpu::isAttnFloatType(out->out_dtype),
               "attnAttnKernel_t.out_dtype %d is not attnFloat32, attnFloat16 or attnBfloat16", int(out->out_dtype));
  ATTN_REQUIRE(out->lse_base == attnLseNatural || out->lse_base == attnLseBase2,
               "attnAttnKernel_t.lse_base %d is not attnLseNatural or attnLseBase2", int(out->lse_base));
  ATTN_REQUIRE(out->lse_layout == attnLseTokenMajor || out->lse_layout == attnLseHeadMajor,
               "attnAttnKernel_t.lse_layout %d is not attnLseTokenMajor or attnLseHeadMajor",
               int(out->lse_layout));
  return attnSuccess;
}

// legacy: attnCommSetAttnKernel, whose kernel says nothing of windows.
attnResult_t setKernel(attnComm_t comm, const attnAttnKernel_t* kernel, bool legacy) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(call.check()));
  attnAttnKernel_t k = ATTN_ATTN_KERNEL_INITIALIZER;
  if (kernel) ATTN_CHECK(call.finish(readKernel(kernel, &k)));
  AttnState& st = attnStateOf(comm);
  st.userKernel = k.fn;
  st.userData = k.fn ? k.user_data : nullptr;
  st.userOutDtype = k.fn ? k.out_dtype : attnFloat32;
  st.userLseBase = k.fn ? k.lse_base : attnLseNatural;
  st.userLseLayout = k.fn ? k.lse_layout : attnLseTokenMajor;
  st.userKernelVersion = k.fn && !legacy ? kernel->version : 0;
  st.kernelTflops.clear();  // the new kernel has its own rate
  return attnSuccess;
}

}  // namespace

extern "C" attnResult_t attnCommSetAttnKernel(attnComm_t comm, attnAttnKernelFn fn, void* userData) {
  return guardedEntry([&]() -> attnResult_t {
    const attnAttnKernel_t k = ATTN_ATTN_KERNEL(fn, userData, attnFloat32, attnLseNatural, attnLseTokenMajor);
    return setKernel(comm, &k, true);
  });
}

extern "C" attnResult_t attnCommSetAttnKernelEx(attnComm_t comm, const attnAttnKernel_t* kernel) {
  return guardedEntry([&]() -> attnResult_t { return setKernel(comm, kernel, false); });
}
