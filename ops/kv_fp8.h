// ops/kv_fp8.h — the numbers of the fp8 KV cache (ops/attention.h: a PagedKv in e4m3).
//
// A token's k head (after RoPE) and its v head, as rounded to the activation dtype, are each one
// quantization group of head_dim values:
//   scale = group_scale(amax, pow2)   numerics/scale.h: amax / 448 rounded up to a power of two (1 for
//                                     an all-zero head; NaN for one holding a NaN or an infinity)
//   byte  = e4m3(x · (1 / scale))     nearest even, saturating at ±448
//   value = e4m3 · scale              what attention reads
// A power-of-two scale makes the value exactly a bf16 number (e4m3 has 4 significant bits; only
// values below 2^-126, from heads whose amax is below 448 · 2^-126, round), so the training forward
// can hold the very keys and values the rollout caches in its bf16 qkv, and a decode kernel may
// apply the scale to a score or a probability in fp32 instead of to each element, exactly.
//
// round_kv_to_fp8 is the training forward's side: qkv's k and v heads (f32/bf16 [T, qkv_width],
// ops/head_layout.h) become their cached values, in place. The training forward attends what the
// rollout attends; gradients pass it unchanged (straight through, as for any fake quantization).
// CUDA: bf16, head_dim a multiple of 8 up to 256, 16-byte aligned; the same bits as the CPU.
#pragma once

#include <cstdint>

#include "core/dtypes.h"
#include "core/tensor.h"
#include "numerics/scale.h"
#include "ops/head_layout.h"

namespace lockstep {

void round_kv_to_fp8(Tensor& qkv, const HeadLayout& layout);

// A head's scale from the max of abs_bits over its values (numerics/scale.h).
LOCKSTEP_HD float kv_fp8_scale(uint32_t amax_bits) { return group_scale(amax_bits, true); }

}  // namespace lockstep
