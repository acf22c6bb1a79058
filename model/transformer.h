// model/transformer.h — the decoder-only transformer of Qwen3, Qwen3-MoE, Qwen2.5 and Llama 3,
// written once against ops/ (every op dispatches on where its tensors live).
//
// One layer, with the Hugging Face names of model/hf_checkpoint.h:
//   h   = x + o_proj(attention(rope(qk_norm(qkv_proj(rmsnorm(x))))))
//   out = h + down_proj(swiglu(gate_up_proj(rmsnorm(h))))
// or, in a sparse layer (Qwen3-MoE, io/config.h's MoeConfig; model/moe.h), with n = rmsnorm(h):
//   out = h + Σ_j w_j · expert_{id_j}(n),  (id, w) = top-k(softmax(gate(n)))
// then a final RMSNorm and the LM head (tied to the embeddings or not).
//
// Two ways through it:
//   - training: forward() over a packed batch of sequences (TrainBatch) returns each token's
//     logprob of its target and the entropy of its next-token distribution, keeping what
//     backward() needs; backward() adds every parameter's gradient into grads().
//   - generation: forward_infer() runs new tokens (a prompt, or one token per sequence) against a
//     paged KV cache and returns the last hidden state of each sequence; logits() and
//     ops/lm_head.h's logits_logprob() turn it into the sampling distribution.
// On the CPU the two give identical bits for the same token in the same context (every op computes
// a row independently of the others); model tests check it in every recipe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"
#include "model/kv_cache.h"
#include "model/linear.h"
#include "model/moe.h"
#include "model/parameters.h"
#include "model/recipe.h"
#include "ops/adamw.h"
#include "ops/head_layout.h"

namespace lockstep {

// Sequences packed back to back: sequence s holds rows [cu_seqlens[s], cu_seqlens[s+1]), its
// positions start at 0. targets[t] is the token whose logprob row t gives (normally the next token
// of the sequence; anything in [0, V) for the last row, whose result the caller ignores).
struct TrainBatch {
  Tensor tokens;      // i32 [T]
  Tensor targets;     // i32 [T]
  Tensor cu_seqlens;  // i32 [S + 1]
  // Routing replay (sparse models; undefined: none): i32 [sparse layers, T, k] on the host, the
  // experts each sparse layer sends each row's token to instead of its router's top k (the
  // rollout's choices); a row whose first id is -1 keeps the router's own. The weights are the
  // router's probabilities of the replayed experts (ops/moe_route.h's moe_route_weights), so
  // the gradient still reaches the router; the backward uses the same experts.
  Tensor replay_experts = {};
};

// New tokens of S sequences whose earlier tokens are already in the KV cache (ops/attention.h,
// attention_paged): sequence s owns rows [cu_seqlens_q[s], cu_seqlens_q[s+1]), its last tokens.
// last_rows repeats what cu_seqlens_q says (the caller has it on the host): reading cu_seqlens_q
// back from the GPU would stall the step.
struct InferBatch {
  Tensor tokens;        // i32 [T]
  Tensor positions;     // i32 [T]
  Tensor slots;         // i32 [T]: where each token's k/v go in the cache
  Tensor cu_seqlens_q;  // i32 [S + 1]
  Tensor context_lens;  // i32 [S]: tokens in the cache once these are written
  Tensor block_tables;  // i32 [S, max_blocks]
  Tensor last_rows;     // i32 [S]: cu_seqlens_q[s + 1] − 1, the row whose hidden state is returned
  bool one_row_each = false;  // every sequence has one row (a decode step): attention_paged's flag
  // Sparse models, where the rows' routing is wanted (undefined: not): i32 [sparse layers, R, k] on
  // the model's device, R >= T; the l-th sparse layer's router writes row r's experts at [l, r].
  Tensor routing{};
};

// What a training forward keeps for the backward (opaque to callers).
struct TrainActivations;

struct TrainForward {
  Tensor logprob;  // f32 [T]
  Tensor entropy;  // f32 [T]
  std::shared_ptr<TrainActivations> saved;  // null when the forward was run without backward
  // Sparse models: what each sparse layer's router did with the batch (model/moe.h), in layer order.
  std::vector<RouterStats> routing;
};

// Receives the output rows of one op of the forward (Transformer::set_activation_tap), for tools
// that compare two ways through the model op by op (rollout/forward_comparison.h). `layer` is the
// layer's index, or num_hidden_layers for "final_norm". `value` holds what the op made: `act`
// ([T, C], activation dtype) and/or, for a GEMM input in the fp8 recipe, `rows` (the E4M3 codes and
// scales the GEMM reads). Its rows are the forward's rows (a training batch's tokens, or an
// InferBatch's new tokens) except "final_norm" of forward_infer: one row per sequence, its last.
// The ops, in order: "input" (x + residual, the layer input), "attn_norm" (qkv input), "qkv",
// "qk_norm_rope" (q/k normed and rotated; k and v before any e4m3 rounding), "attention" (the o
// projection's input), "o_proj", "mlp_norm" (the MLP's input), then "gate_up", "swiglu" (the down
// projection's input), "down" in a dense layer, or "moe" in a sparse one; "final_norm".
// The tensors are valid during the call only (copy what you keep); the device work that made them
// is queued on the current stream.
using ActivationTap =
    std::function<void(int64_t layer, std::string_view op, const LinearInput& value)>;

struct TransformerOptions {
  // false: an inference-only model (benchmarks, evaluation) that holds only what its forward
  // reads, with the same outputs bit for bit. It has no gradients, and backward() is an error. In
  // the bf16 and fp8 recipes the fp32 masters of the linear layers, embedding and LM head are
  // released once their copies are made (fp8: and the Wᵀ blocks only the backward reads), so
  // params() keeps only the norms and biases, and refresh_weights() is an error.
  bool trainable = true;
  // The paged KV cache in e4m3 (ops/kv_fp8.h: one power-of-two scale per token and kv head) instead
  // of the activation dtype: half the bytes a decode step reads per context token. The training
  // forward rounds its k and v to the same values (round_kv_to_fp8), so rollout and training still
  // compute the same function (bit for bit on the CPU).
  bool fp8_kv_cache = false;
  // fp8 and bf16 recipes: a sparse layer's experts run as one grouped GEMM per projection
  // (ops/gemm.h: gemm_fp8_grouped where the widths are multiples of 128, gemm_bf16_grouped_* where
  // they are multiples of 8). false: one GEMM pair per expert, the same bits on the CPU (kept to
  // compare the two).
  bool grouped_experts = true;
};

class Transformer {
 public:
  // `params`: fp32 masters of the config's shapes (ModelParameters::initialized, or
  // load_hf_parameters). Gradients are allocated (zero) alongside, unless inference-only.
  Transformer(const ModelConfig& config, ModelParameters params, Recipe recipe,
              TransformerOptions options = {});

  const ModelConfig& config() const { return config_; }
  Recipe recipe() const { return recipe_; }
  DType activation_dtype() const;
  // The dtype of the KV cache forward_infer takes: e4m3 with fp8_kv_cache, else the activations'.
  DType kv_cache_dtype() const;
  Device device() const;
  const HeadLayout& head_layout() const { return layout_; }

  // The fp32 masters (of an inference-only model: what TransformerOptions says is kept). Change
  // them in place, then call refresh_weights().
  ModelParameters& params() { return params_; }
  const ModelParameters& params() const { return params_; }
  ModelParameters& grads() { return grads_; }
  // Rebuilds the copies the recipe's GEMMs read (bf16, or fp8 blocks) from the masters.
  void refresh_weights();
  // The copies of the master named `name` (ModelParameters::for_each names), for an optimizer that
  // writes them in its update pass (ops/adamw.h) instead of refresh_weights.
  WeightCopies weight_copies(const std::string& name);
  // Drops the fp32 masters the GEMMs do not read (bf16 and fp8 recipes: the linear layers', the
  // embedding's and the LM head's; the fp32 recipe reads its masters and keeps them): a sharded
  // optimizer (train/sharded_optimizer.h) holds its rows of them and writes the copies itself.
  // params() then keeps the norms and biases only; refresh_weights() is an error. The copies stay,
  // fp8's Wᵀ blocks too (the backward's DGrad reads them).
  void release_masters();
  bool masters_released() const { return masters_released_; }
  // The gradients of a group of tensors are complete for this backward: `names` (ModelParameters
  // names, in for_each order). backward() reports the groups in this order: the LM head's and the
  // final norm's ("lm_head" when untied, "final_norm"), each layer's from the last to the first
  // ("layers.<i>.*"), then "embed" (complete only at the end when the head is tied to it).
  using GradientsReady = std::function<void(const std::vector<std::string>& names)>;
  // From now on backward() calls `ready` for each group as soon as it is complete, and the hook
  // consumes the group's gradients and zeroes them before backward() goes on (a data-parallel
  // trainer reduce-scatters them there: model/ knows no ranks). Every layer's gradients then live in
  // one set of buffers (one per kind of layer: dense, sparse), the one layer's at a time the hook
  // has not consumed yet: the whole local gradient is never held, only the embedding's, the head's
  // and one layer's (of each kind).
  void report_gradients_per_layer(GradientsReady ready);
  // The groups backward() reports, in its order.
  std::vector<std::vector<std::string>> gradient_groups() const;
  // Where the weight copies of each layer's linear layers come from when the model does not hold
  // them between uses (a sharded data-parallel run, train/sharded_weights.h: each rank keeps the
  // copies of its own rows and all-gathers a layer's whole copies when it is wanted; model/ knows
  // no ranks). From now on the training forward (forward, hidden_states) calls wanted(i, next)
  // before layer i and done(i) after it, and backward() does the same around each layer's backward,
  // from the last layer to the first; `next` is the layer it will want after i (−1: none), whose
  // copies the source may start gathering beside layer i's compute. After wanted(i, …) returns,
  // weight_copies() of layer i's matrices must be whole for the work queued next; after done(i) the
  // model does not read them until the next wanted(i, …). The recompute of a layer's inputs reads
  // no matrix. The embedding, the LM head and the norms are not the source's: they stay whole.
  // forward_infer calls nothing: it reads the copies in place (the rollout's, gathered whole first).
  struct LayerWeightSource {
    std::function<void(int64_t layer, int64_t next)> wanted;
    std::function<void(int64_t layer)> done;
  };
  void set_layer_weight_source(LayerWeightSource source) { weight_source_ = std::move(source); }
  // For such a source: allocates the copies of layer `layer`'s matrices that it does not hold (fp8:
  // Wᵀ too with `with_transpose`; a sparse layer's experts' fp8 copies as their stacks, model/moe.h;
  // with expert parallelism and `own_experts_only`, of its experts this rank's only), for the source
  // to fill through weight_copies(); or drops them all.
  void allocate_layer_copies(int64_t layer, bool with_transpose, bool own_experts_only);
  void drop_layer_copies(int64_t layer);
  // Expert parallelism of the training forward and backward (model/expert_parallel.h): from now on
  // each sparse layer of forward() / hidden_states() / backward() runs only this rank's experts
  // (ep.rank's share), on every rank's rows of them, through ep.all_to_all; the gradients of the
  // other experts stay zero here (their owners hold them). forward_infer runs every expert locally
  // (the rollout's weights are whole). Every rank runs the same passes (skip_forward and
  // skip_backward below serve the other ranks' rows). An error unless the experts split evenly over
  // ep.ranks.
  void set_expert_parallel(ExpertParallel ep);
  bool expert_parallel() const { return expert_parallel_.on(); }
  // Bytes of the weight copies the GEMMs read that the model holds now (bf16 copies, fp8 W and Wᵀ
  // with their scales, and with `embedding_and_head` the embedding's and LM head's copies; 0 in the
  // fp32 recipe, whose GEMMs read the masters).
  int64_t weight_copy_bytes(bool embedding_and_head = true) const;
  // Whether the sparse layers' expert GEMMs run as gemm_fp8_grouped (model/transformer_moe.cpp),
  // else one pair per expert.
  bool grouped_fp8_experts() const;
  // The same for the bf16 recipe's gemm_bf16_grouped_fprop / _dgrad.
  bool grouped_bf16_experts() const;
  // Whether a hook of report_gradients_per_layer or set_layer_weight_source is installed: a
  // data-parallel trainer fills them with collectives, so every rank must then run the same
  // passes. A rank with fewer forwards or backwards than the others (fewer micro-batches, a
  // backward skipped for a non-finite loss) calls skip_forward() / skip_backward() for each it
  // lacks: the hooks that pass calls, in its order, with nothing computed (a skipped backward
  // reports each group's gradients as they are: zero when the hook consumed the last ones). No-ops
  // without hooks. With expert parallelism a rank's experts serve the other ranks' rows in every
  // pass, so a skipped pass is a real one of a single token (token 0), with a zero gradient in the
  // backward: skip_backward() backpropagates the last skip_forward()'s, or `forward` when given (a
  // real forward whose backward is skipped: its gradients then count for nothing, as the caller
  // drops the mini-batch). Zero gradients add exact zeros (x + 0 = x) wherever the activations are
  // finite.
  bool has_pass_hooks() const { return gradients_ready_ || weight_source_.wanted || expert_parallel_.on(); }
  void skip_forward();
  void skip_backward(TrainForward* forward = nullptr);
  // Reads `other`'s bf16 embedding and LM-head copies from now on (the fp8-rollout mode's rollout
  // model: the same values as its trainer's, written by the trainer's optimizer step).
  void share_embedding_copies(const Transformer& other);

  // With recompute on, the training forward does not keep the inputs of the linear layers that
  // cheap ops make (the two normed residuals, the SwiGLU output; in fp8 their columnwise copies):
  // the backward remakes them — the same gradients, bit for bit, in fp32 and bf16. In fp8 the
  // SwiGLU input is also kept in E4M3 (1×128 groups) instead of bf16, as DeepSeek-V3 does, and the
  // SwiGLU backward and the down projection's WGrad read what is remade from it: gradients within
  // quantization noise of the saving path's, about half the activation memory of bf16.
  // Without recompute the forward also keeps the LM head's f32 logits (ops/lm_head.h: T·V·4 bytes)
  // so that the backward skips their GEMM; with it the backward recomputes them (the same bits).
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }

  // `temperature` divides the logits (the rollout's sampling distribution, ops/lm_head.h).
  // With `for_backward` false nothing is kept (logprobs of a frozen or old policy).
  TrainForward forward(const TrainBatch& batch, float temperature = 1.0f, bool for_backward = true);
  // dlogprob, dentropy: f32 [T] (either may be undefined: zero). Adds into grads(); consumes the
  // saved activations. A sparse model also adds `load_balancing_weight` times the gradient of the
  // batch's load-balancing loss (model/moe.h, load_balancing_loss of forward.routing) w.r.t. the
  // router probabilities, and `router_z_weight` times the gradient of its router z-loss
  // (router_z_loss) w.r.t. the router logits; 0 leaves either out.
  void backward(TrainForward& forward, const Tensor& dlogprob, const Tensor& dentropy,
                double load_balancing_weight = 0, double router_z_weight = 0);

  // The final-normed hidden state of every row, [T, H] (nothing kept): logits() of it gives the
  // full logits, for checks against other implementations.
  Tensor hidden_states(const TrainBatch& batch);

  // Writes the new tokens' k/v into `cache` and returns the final-normed hidden state of each
  // sequence's last row, [S, H] in the activation dtype (and with batch.routing defined, each sparse
  // layer's choices for every row there). Where decode_reads_nothing_back() the GPU forward reads
  // nothing back (it can be captured into a CUDA graph): index values are checked only on the CPU,
  // and on CUDA a bad one gives NaN rows (ops/attention.h, ops/embedding.h).
  Tensor forward_infer(const InferBatch& batch, KvCache& cache);
  // True for a dense model, and for a sparse one whose experts run as grouped fp8 GEMMs (which take
  // the routing's offsets on the device); the other sparse forms read each layer's expert counts
  // back, to size their GEMMs.
  bool decode_reads_nothing_back() const { return !config_.moe || grouped_fp8_experts(); }
  // f32 [rows, V] logits of hidden states (not divided by a temperature).
  Tensor logits(const Tensor& hidden) const;

  // Every forward (training, hidden_states, forward_infer) calls `tap` for each op's output rows
  // (ActivationTap above), which changes nothing they compute; an empty one (the default) turns
  // it off. Not for a forward captured into a CUDA graph: the tap runs on the host, at capture.
  void set_activation_tap(ActivationTap tap) { tap_ = std::move(tap); }

  // The LM head weight as the head GEMM reads it (fp32 master or bf16 copy).
  const Tensor& head_weight() const { return config_.tie_word_embeddings ? embed_ : head_; }

 private:
  struct LayerWeights {
    LinearWeight qkv, o, gate_up, down;  // gate_up, down: dense layers
    MoeWeights moe;                       // sparse layers
  };
  struct LayerActivations;
  // The attention of a layer, the training one (packed sequences) or the paged inference one:
  // returns its output as the o projection's input (linear_input's; in an fp8 decode step the
  // attention kernel quantizes it itself). The training one keeps the bf16 output in `save`.
  using Attend = std::function<LinearInput(size_t layer, const Tensor& qkv, LayerActivations* save)>;
  // The inference path's KV cache and the new rows' slots: a layer's q/k/v op (ops/qkv_rope.h)
  // writes their k and v there before its attention.
  struct KvWrite {
    KvCache& cache;
    const Tensor& slots;
  };

  // Embedding, layers and final norm of a training batch; fills `saved` and `routing` when given.
  Tensor trunk(const TrainBatch& batch, TrainActivations* saved, std::vector<RouterStats>* routing);
  // The layer's input is x + residual: the previous layer's output with its residual add still
  // pending (residual undefined: none), done in place into x by the input norm. Returns the same
  // way: x + residual is the layer's output, the add left to the next norm.
  // `replay`: a sparse layer's replayed experts, host i32 [T, k] (TrainBatch::replay_experts).
  void layer_forward(size_t i, Tensor& x, Tensor& residual, const Tensor& positions,
                     const Attend& attend, LayerActivations* save, const KvWrite* kv = nullptr,
                     RouterStats* stats = nullptr, const Tensor* replay = nullptr, Tensor* routing = nullptr);
  // dprobs: the load-balancing loss's gradient w.r.t. a sparse layer's router probabilities
  // (undefined: none); z_scale: the router z-loss's, 2 · weight / N (moe_route_backward's).
  Tensor layer_backward(size_t i, LayerActivations& saved, const Tensor& dout,
                        const Tensor& positions, const Tensor& cu_seqlens, const Tensor& dprobs,
                        float z_scale);
  void recompute_inputs(size_t i, LayerActivations& saved) const;
  // The sparse MLP of layer i (model/transformer_moe.cpp): out [T, H] from the normed hn [T, H];
  // fills `save` and `stats` when given; `replay` as layer_forward's; `expert_parallel`: run this
  // rank's experts on every rank's rows (set_expert_parallel); `routing` (layer_forward's too):
  // where the router writes its choices, i32 [T, k] on the device (InferBatch::routing's rows of the
  // layer). The backward returns dhn and adds into grads() (with expert parallelism: this rank's
  // experts' gradients, of every rank's rows).
  Tensor moe_forward(size_t i, const Tensor& hn, MoeActivations* save, RouterStats* stats,
                     const Tensor* replay, bool expert_parallel, Tensor* routing = nullptr) const;
  Tensor moe_backward(size_t i, MoeActivations& saved, const Tensor& dout, const Tensor& dprobs,
                      float z_scale);
  // The input of the linear layer after an RMSNorm (of x += residual, when residual is defined), or
  // after the SwiGLU, in the recipe's form.
  LinearInput normed_input(Tensor& x, const Tensor& residual, const Tensor& w, Tensor& rstd,
                           bool for_backward) const;
  LinearInput swiglu_input(const Tensor& gate_up, bool for_backward) const;
  Tensor empty_act(int64_t rows, int64_t cols) const;
  void tap(size_t layer, std::string_view op, const LinearInput& value) const {
    if (tap_) tap_(int64_t(layer), op, value);
  }
  void tap(size_t layer, std::string_view op, const Tensor& act) const {
    if (!tap_) return;
    LinearInput value;
    value.act = act;
    tap_(int64_t(layer), op, value);
  }

  ModelConfig config_;
  Recipe recipe_;
  HeadLayout layout_;
  float eps_;
  bool trainable_;
  bool fp8_kv_cache_;
  bool grouped_experts_;
  Device device_;
  bool recompute_ = false;
  bool masters_released_ = false;
  GradientsReady gradients_ready_;
  LayerWeightSource weight_source_;
  ExpertParallel expert_parallel_;
  std::shared_ptr<TrainForward> skipped_;  // expert parallelism: the last skip_forward()'s pass
  ActivationTap tap_;
  ModelParameters params_, grads_;
  std::vector<LayerWeights> weights_;
  Tensor embed_, head_;  // activation-dtype copies (fp32: the masters themselves)
  Tensor inv_freq_;      // RoPE frequencies, f32 [head_dim / 2]

  friend struct TrainActivations;
};

}  // namespace lockstep
