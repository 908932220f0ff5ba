#include "src/attn/device/device_lse.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_config.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"

namespace attn {

attnResult_t DeviceLseOut::begin(attnComm* comm, const attnAttnConfig_t& cfg, float* lse, int64_t rows,
                                 float** natural) {
  comm_ = comm;
  user_ = lse;
  scratch_ = nullptr;
  *natural = lse;
  if (!lse || lseIsNatural(cfg) || rows == 0) return attnSuccess;
  rows_ = rows;
  heads_ = cfg.num_q_heads;
  base2_ = cfg.lse_base == attnLseBase2;
  headMajor_ = cfg.lse_layout == attnLseHeadMajor;
  DeviceAttnState& R = comm->device->attn;
  ATTN_CHECK(R.prepare(0));
  ATTN_CHECK(R.lseOut.reserve(size_t(rows) * size_t(heads_) * sizeof(float), R.compute));
  // Grown on the compute stream: the algorithm's other streams may use it
  // once that is done.
  ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));
  scratch_ = reinterpret_cast<float*>(R.lseOut.get());
  *natural = scratch_;
  return attnSuccess;
}

attnResult_t DeviceLseOut::finish() {
  if (!scratch_) return attnSuccess;
  DeviceAttnState& R = comm_->device->attn;
  ATTN_CHECK(cuda::writeLse(user_, scratch_, rows_, heads_, base2_, headMajor_, R.compute));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));
  return attnSuccess;
}

}  // namespace attn
