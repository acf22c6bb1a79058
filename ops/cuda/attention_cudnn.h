// ops/cuda/attention_cudnn.h — ops/attention.h's packed causal GQA attention (training forward and
// backward) through cuDNN's fused SDPA (the cuDNN frontend's graph API).
//
// The same contracts as attention_forward / attention_backward in ops/attention.h, for bf16 CUDA
// tensors: q, k and v are read in place from the qkv rows and dq, dk and dv written in place into
// the dqkv rows; lse (f32) is the natural-log log-sum-exp of the scaled scores; the scale is
// 1/sqrt(head_dim). Shapes, devices and cu_seqlens' shape are checked by ops/attention.cpp; these
// check what cuDNN adds (bf16 activations, head_dim a multiple of 8, 16-byte aligned data) and turn
// a configuration cuDNN does not support into an error carrying its check_support message.
// cu_seqlens stays on the device: when it does not split the T rows into sequences (start at 0,
// never decrease, end at T) nothing is read or written out of bounds and every output is NaN.
//
// An execution plan is built on the first call of each shape bucket — heads and head_dim, the
// sequence count rounded up to a power of two, T rounded up to a quarter of its power of two — and
// reused after that; make every bucket's plan before capturing a CUDA graph. Work goes on
// current_stream(); like ops/cuda/gemm.cu, one GPU per process. Scratch (cuDNN's workspace and the
// per-sequence tensors) comes from Tensor::empty. LOCKSTEP_SDPA_VERBOSE=1 prints each plan's build
// time and workspace size on stderr.
#pragma once

#include <cstddef>

#include "core/tensor.h"
#include "ops/head_layout.h"

namespace lockstep::cudnn {

// True when cuDNN SDPA can run here: cuDNN ≥ 9.6 and a Hopper or datacenter Blackwell GPU (SM 9.x
// or 10.x). Never throws.
bool sdpa_available();

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout);

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout);

// Tests: the execution plans built so far (one per direction and shape bucket).
size_t sdpa_plan_count();

}  // namespace lockstep::cudnn
