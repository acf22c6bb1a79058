// ops/cpu/kv_fp8.cpp — CPU reference for ops/kv_fp8.h.
#include "ops/cpu/kv_fp8.h"

#include <vector>

#include "ops/cpu/act.h"
#include "ops/kv_fp8_backends.h"

namespace lockstep::cpu {

void round_kv_to_fp8(Tensor& qkv, const HeadLayout& layout) {
  const int64_t T = qkv.dim(0), d = layout.head_dim, width = layout.qkv_width();
#pragma omp parallel
  {
    std::vector<float> x(size_t(d), 0.0f);
    std::vector<uint8_t> q(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < 2 * layout.kv_heads; ++h) {  // the k heads, then the v heads
        const int64_t offset = t * width + layout.k_offset() + h * d;
        read_f32(qkv, offset, d, x.data());
        const float scale = quantize_kv_head(x.data(), d, q.data());
        dequantize_kv_head(q.data(), scale, d, qkv.dtype(), x.data());
        write_f32(qkv, offset, d, x.data());
      }
  }
}

}  // namespace lockstep::cpu
