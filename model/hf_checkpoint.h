// model/hf_checkpoint.h — model weights to and from a Hugging Face checkpoint folder
// (config.json + model.safetensors or shards with model.safetensors.index.json).
//
// Hugging Face names map onto model/parameters.h: q_proj/k_proj/v_proj fill the rows of the fused
// `qkv` (and their biases `qkv_bias`), gate_proj/up_proj the rows of `gate_up` (of a sparse layer's
// experts too: mlp.experts.{e}.gate_proj/up_proj -> experts[e].gate_up, mlp.gate -> router); the
// rest is one to one. Tensors may be bf16, f16 or f32; they are widened to the fp32 masters. A
// block-FP8 checkpoint (config.fp8_quantization) holds its projections as E4M3 with
// `<name>_scale_inv` block scales: their masters are the dequantized values, e4m3 · scale_inv in
// fp32, as transformers dequantizes.
#pragma once

#include <string>
#include <vector>

#include "core/dtypes.h"
#include "io/config.h"
#include "model/parameters.h"

namespace lockstep {

// Reads every tensor the config needs from the checkpoint at `path` (a folder or a .safetensors
// file). A missing tensor, a wrong shape or an unexpected tensor is an error naming the checkpoint
// and the tensor. Ignored: `*.rotary_emb.inv_freq` buffers (older exports), and `lm_head.weight`
// when the embeddings are tied and it equals them (some exports keep it); one that differs under a
// tied config is an error (load_model_config unties such a checkpoint's config, as transformers does).
ModelParameters load_hf_parameters(const ModelConfig& config, const std::string& path);

// Writes `folder` as a checkpoint transformers can load: config.json and the weights as `dtype`
// (bf16 or f32) under Hugging Face's names. The folder is written under a temporary name and
// renamed into place, so a reader never sees a half-written checkpoint; an existing folder of the
// same name is replaced. `copy_files` (the tokenizer's files) are copied in as they are.
void save_hf_checkpoint(const std::string& folder, const ModelConfig& config,
                        const ModelParameters& params, DType dtype = DType::bf16,
                        const std::vector<std::string>& copy_files = {});

// What save_fp8_hf_checkpoint wrote for the projection weights, by Hugging Face name.
struct Fp8Export {
  // E4M3 bytes and scales equal to the fp8 recipe's own weights (model/linear.h), the ones its
  // rollout reads: every projection whose rows start at a 128-row block of lockstep's fused weight.
  std::vector<std::string> exact;
  // Quantized afresh on the checkpoint's own 128×128 grid from the masters, because their rows start
  // inside one of lockstep's fused blocks (k_proj and v_proj when q_proj's rows are not a multiple
  // of 128, as in SmolLM2-135M; up_proj when intermediate_size is not): a Hugging Face block would
  // straddle two of lockstep's, which have different scales.
  std::vector<std::string> requantized;
};

// Writes `folder` as a block-FP8 checkpoint in the format of Qwen3-8B-FP8 and DeepSeek-V3, which
// transformers (fine-grained FP8) and vLLM serve: config.json with `quantization_config`
// {quant_method "fp8", fmt "e4m3", activation_scheme "dynamic", weight_block_size [128, 128],
// modules_to_not_convert ["lm_head"]},
// every q/k/v/o/gate/up/down projection as F8_E4M3 [N, K] with F32 `weight_scale_inv`
// [ceil(N/128), ceil(K/128)], and embeddings, norms, biases and an untied lm_head in bf16. The
// E4M3 values are the fp8 recipe's quantization of the fp32 masters (numerics/quantize.h) — for an
// fp8 run, the bytes its rollout used. `copy_files` (the tokenizer's files) are copied in as they
// are. Written under a temporary name and renamed into place, as save_hf_checkpoint.
Fp8Export save_fp8_hf_checkpoint(const std::string& folder, const ModelConfig& config,
                                 const ModelParameters& params,
                                 const std::vector<std::string>& copy_files = {});

}  // namespace lockstep
