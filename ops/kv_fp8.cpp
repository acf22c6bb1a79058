// ops/kv_fp8.cpp — argument checks and backend dispatch for ops/kv_fp8.h.
#include "ops/kv_fp8.h"

#include "ops/act_check.h"
#include "ops/kv_fp8_backends.h"

namespace lockstep {

void round_kv_to_fp8(Tensor& qkv, const HeadLayout& layout) {
  check_head_layout(layout);
  LOCKSTEP_CHECK(qkv.defined() && qkv.rank() == 2, "round_kv_to_fp8: qkv: expected [T, ", layout.qkv_width(),
                 "] rows, got ", qkv.defined() ? qkv.describe() : "an empty tensor");
  check_act(qkv, "round_kv_to_fp8: qkv", qkv.device(), {qkv.dim(0), layout.qkv_width()});
  if (qkv.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    LOCKSTEP_CHECK(qkv.dtype() == DType::bf16 && layout.head_dim % 8 == 0 && layout.head_dim <= 256,
                   "round_kv_to_fp8: the CUDA backend takes bf16 rows and head_dim a multiple of 8 up to 256, got ",
                   qkv.describe(), " and head_dim ", layout.head_dim);
    check_cuda_vectors(qkv, "round_kv_to_fp8: qkv", /*rows=*/true);
    return cuda::round_kv_to_fp8(qkv, layout);
#else
    LOCKSTEP_NO_CUDA_OP("round_kv_to_fp8");
#endif
  }
  cpu::round_kv_to_fp8(qkv, layout);
}

}  // namespace lockstep
