// model/hf_checkpoint.h — model weights to and from a Hugging Face checkpoint folder
// (config.json + model.safetensors or shards with model.safetensors.index.json).
//
// Hugging Face names map onto model/parameters.h: q_proj/k_proj/v_proj fill the rows of the fused
// `qkv` (and their biases `qkv_bias`), gate_proj/up_proj the rows of `gate_up`; the rest is one to
// one. Tensors may be bf16, f16 or f32; they are widened to the fp32 masters.
#pragma once

#include <string>

#include "core/dtypes.h"
#include "io/config.h"
#include "model/parameters.h"

namespace lockstep {

// Reads every tensor the config needs from the checkpoint at `path` (a folder or a .safetensors
// file). A missing tensor, a wrong shape or an unexpected tensor is an error naming the checkpoint
// and the tensor. Ignored: `lm_head.weight` when the embeddings are tied (some exports keep it) and
// `*.rotary_emb.inv_freq` buffers (older exports).
ModelParameters load_hf_parameters(const ModelConfig& config, const std::string& path);

// Writes `folder` as a checkpoint transformers can load: config.json and the weights as `dtype`
// (bf16 or f32) under Hugging Face's names. The folder is written under a temporary name and
// renamed into place, so a reader never sees a half-written checkpoint; an existing folder of the
// same name is replaced.
void save_hf_checkpoint(const std::string& folder, const ModelConfig& config,
                        const ModelParameters& params, DType dtype = DType::bf16);

}  // namespace lockstep
