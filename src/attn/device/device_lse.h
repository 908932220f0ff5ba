// The LSE of a device attention call in its config's convention
// (attnAttnConfig_t lse_base, lse_layout). The algorithms write the
// natural-log token-major LSE; for another convention they write it into
// the communicator's scratch buffer, and the CUDA kernel writeLse
// (kernels/cuda/lse.cu) converts it into the caller's once they are done.
// Plain C++ (no CUDA headers); defined only in CUDA builds.
#pragma once

#include <cstdint>

#include "attncomm.h"

struct attnComm;

namespace attn {

class DeviceLseOut {
 public:
  // Before the algorithm, on comm's proxy thread (its streams idle): the
  // buffer the algorithm writes, [rows, heads] natural token-major: the
  // caller's `lse` itself when that is its convention or it is NULL, else
  // the scratch buffer.
  attnResult_t begin(attnComm* comm, const attnAttnConfig_t& cfg, float* lse, int64_t rows, float** natural);
  // After the algorithm returned: the caller's LSE written in its
  // convention, and waited for.
  attnResult_t finish();

 private:
  attnComm* comm_ = nullptr;
  float* user_ = nullptr;
  float* scratch_ = nullptr;
  int64_t rows_ = 0;
  int heads_ = 0;
  bool base2_ = false, headMajor_ = false;
};

}  // namespace attn
