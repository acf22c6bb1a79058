// train/sharded_optimizer.h — AdamW with its state sharded over the data-parallel ranks (as
// ZeRO-2, plus the fp32 masters and the gradients): rank r keeps the fp32 masters, the first and
// second moments and the summed gradient of the rows train/shard_plan.h gives it, and only those;
// each step
//
//   1. reduce-scatters the ranks' gradients: rank r receives the sum over the ranks of its own
//      rows (dist/communicator.h's reduce_scatter_sum over the plan's flat layout, in buckets of
//      at most `bucket_numel` elements per rank, so the send buffer stays small) — unless the
//      backward already did, layer by layer (reduce_scatter_now: then no rank holds the whole
//      local gradient either, Transformer::report_gradients_per_layer); with expert parallelism
//      an expert's tensors, owned whole by one rank, are not summed: their gradient exists on the
//      owner only and is copied into its shard (layer by layer, reduce_scatter_now sends nothing
//      for them; step()'s flat layout carries zeros in their place);
//   2. ‖g‖: each rank's Σ g² of the pieces it owns, per tensor, summed over the ranks (an f64
//      all-reduce of one number per tensor); then train/optimizer.h's rules: a non-finite ‖g‖
//      skips the step (naming the first tensor), clip = min(1, max_grad_norm / (‖g‖ + 1e-6));
//   3. runs ops/adamw.h's adamw_step on its rows of the masters (the update is elementwise, so a
//      row's result does not depend on where the cut falls);
//   4. the weight hand-over (timed: OptimizerStep::handover_seconds), two kinds of tensor:
//      - a tensor the model has released (Transformer::release_masters: the matrices of the bf16
//        and fp8 recipes, whose GEMMs read copies): each rank writes the copies of its own rows
//        (convert to bf16; quantize_weight of whole 128-row blocks to fp8, the same bits as
//        quantizing the whole tensor) and the copies are all-gathered as bytes — bf16: 2 bytes a
//        parameter; fp8: W's E4M3 bytes and block scales only, about 1 byte, and every rank remakes
//        Wᵀ from them (numerics/quantize.h's transpose_weight_blocks, the same bytes);
//      - a tensor the model still holds (norms, biases, every tensor of the fp32 recipe, or any
//        before the release): its updated f32 rows are all-gathered into it, and its copies made
//        from it (ops/adamw.h's composition, the same bits as the replicated optimizer's pass).
//      `copies(name)` gives the copies to write: the trainer's, and in fp8-rollout mode the
//      rollout model's fp8 ones too (rl/setup.h Policy::copies), from the same gather. Copies kept
//      by rows (keep_copies_by_rows, train/sharded_weights.h: ZeRO-3) get this rank's rows only,
//      and nothing is gathered into them.
//
// Bytes per parameter per rank, N ranks, AdamW, bf16 recipe: 4/N masters + 8/N moments + 4/N
// summed-gradient shard + 2 for the copies the GEMMs read (fp8: W and Wᵀ, 2 + block scales), plus
// the local gradient the backward accumulates: every parameter's f32 (4) when step() reduce-scatters
// it, or — reduced layer by layer during the backward (reduce_scatter_now,
// train/layerwise_reduce.h, what a sharded run does) — only the embedding's, the LM head's and one
// layer's. So 2 + 16/N (+ those three f32 gradients), against 10 + 12/N with only the moments
// sharded and 18 for the replicated optimizer. The norms and biases stay whole on every rank (a few
// thousand values a layer); with the copies kept by rows too (train/sharded_weights.h) the 2 becomes
// 2/N in bf16 (fp8: W's 1/N plus scales; Wᵀ is remade per layer), plus the embedding's and LM
// head's copies and, while in use, two layers' whole copies.
// gather_masters() makes the whole fp32 masters for what needs them (the
// Hugging Face folder of a replicated checkpoint, a KL reference model, the next phase's optimizer).
//
// Against the replicated data-parallel optimizer (train/data_parallel.h): on the CPU both sum the
// gradients in rank order, so the summed gradient has the same bits; the update is elementwise;
// a tensor owned whole by one rank has the same Σ g² bits. The weights are then the same bits
// after every step whenever ‖g‖ is too (every tensor whole on one rank, or no clipping); a tensor
// cut between ranks adds its Σ g² in two parts, which can move ‖g‖ by a double's rounding.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_graph.h"
#include "dist/communicator.h"
#include "model/parameters.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/shard_plan.h"

namespace lockstep {

class ShardedAdamW final : public DataParallelOptimizer {
 public:
  static constexpr int64_t kDefaultBucketNumel = int64_t(1) << 22;  // 16 MiB of f32 per rank

  // This rank's rows of the masters `params` (every tensor, f32, on one device), zero moments.
  // `experts_owned` (expert parallelism, model/expert_parallel.h): each expert's tensors whole on
  // its owner (train/shard_plan.h's assign_experts_to_owners); the model's backward leaves an
  // expert's gradient on its owner only, and the step copies it into the shard instead of summing
  // it over the ranks.
  ShardedAdamW(const ModelParameters& params, const OptimizerConfig& config, Communicator& comm,
               int64_t bucket_numel = kDefaultBucketNumel, bool experts_owned = false);

  // `params`: the tensors the model still holds (any subset of the masters; those it released
  // need copies). `grads`: every tensor.
  OptimizerStep step(ModelParameters& params, ModelParameters& grads,
                     const AdamW::CopiesOf& copies) override;
  int64_t steps() const override { return steps_; }
  bool holds_masters() const override { return true; }
  void gather_masters(ModelParameters& full) override;
  Moments full_moments(const ModelParameters& params) override;
  void load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps) override;
  // The backward's reduce-scatter of one group of tensors (Transformer::report_gradients_per_layer):
  // this rank's gradient shard gets its rows of the sum over the ranks of the gradients `names` of
  // `grads` added (bucketed as step()'s), and those gradients are zeroed. Every rank calls it with
  // the same names in the same order. Once it has been called, the next step() (or
  // discard_gradients()) takes the shard as these calls left it and reduce-scatters nothing: every
  // tensor must reach the shard this way (a rank with nothing to backpropagate reduces zeros).
  // On the GPU the collectives and the sums into the shard run on a stream of their own, beside the
  // backward of the next layer; each call first waits for the previous call's (so at most two
  // groups' send buffers are alive).
  void reduce_scatter_now(ModelParameters& grads, const std::vector<std::string>& names);
  // Drops what reduce_scatter_now summed so far (a mini-batch skipped for a non-finite loss).
  void discard_gradients();

  // Continues from moments read row range by row range (a sharded checkpoint): read(kind, tensor,
  // row_begin, row_end, dst) fills dst (f32 [rows, …] on the optimizer's device) with rows
  // [row_begin, row_end) of plan().tensors[tensor]'s first ("m") or second ("v") moment. Called
  // for this rank's pieces only.
  using MomentRows = std::function<void(const char* kind, int tensor, int64_t row_begin,
                                        int64_t row_end, Tensor& dst)>;
  void load_moment_rows(const MomentRows& read, int64_t steps);

  // Weight copies kept by rows (train/sharded_weights.h, ZeRO-3): from now on `rows(name)` gives
  // the copies of this rank's rows of the released tensor `name` (its plan piece's rows, at row
  // 0: bf16 [rows, K]; fp8 W's E4M3 bytes and the scales of its 128-row blocks, no Wᵀ), or none.
  // step() writes the rows it updates there and gathers nothing into those copies: the `copies`
  // it is given then name only the whole copies still kept (those of a separate rollout model).
  void keep_copies_by_rows(AdamW::CopiesOf rows) { row_copies_ = std::move(rows); }
  // The whole copies `whole[i]` of plan tensor i (none: skipped) get every rank's rows: this
  // rank's from `rows[i]` (its row copies) where given, else already in place; fp8's Wᵀ (where the
  // copy has one) is remade from the gathered W (numerics/quantize.h's transpose_weight_blocks, the
  // same bytes). A collective: every rank calls it with the same tensors.
  void gather_copies(const std::vector<WeightCopies>& whole, const std::vector<WeightCopies>& rows);

  const ShardPlan& plan() const { return plan_; }
  int rank() const { return comm_.rank(); }
  // This rank's masters and moments: [plan().shard_numel] each, its pieces at their offsets.
  const Tensor& master_shard() const { return master_; }
  const Tensor& first_moment_shard() const { return m_; }
  const Tensor& second_moment_shard() const { return v_; }

 private:
  // Element range [lo, hi) of rank `rank`'s flat shard, as views: the piece's tensor elements and
  // its shard positions.
  struct Span {
    int tensor;
    Tensor tensor_elems;  // a 1-D view of the tensor's elements in [lo, hi)
    int64_t shard_begin;  // where they sit in the rank's shard
  };
  // (A null tensor — one the model released — has no spans.)
  std::vector<Span> spans(const std::vector<Tensor*>& tensors, int rank, int64_t lo, int64_t hi) const;
  // Every rank's spans of `tensors` with where each sits once the rank's spans are packed end to
  // end (each at a multiple of kShardPieceAlign): the layout of a collective over some tensors.
  struct PackedSpans {
    std::vector<std::vector<std::pair<Span, int64_t>>> of_rank;
    int64_t size = 0;  // the largest rank's packed length
  };
  PackedSpans packed_spans(const std::vector<Tensor*>& tensors) const;
  // Every tensor of the plan, in order, checked against it; with `allow_missing`, a tensor p does
  // not hold is null.
  std::vector<Tensor*> checked(ModelParameters& p, const char* what, bool allow_missing = false) const;
  // `full` (whole tensors) gets every rank's rows of `shard` (a flat shard as m_), bucket by bucket.
  void gather_into(const Tensor& shard, const std::vector<Tensor*>& full);
  // The copies of the tensors the model released (`released[i]`): each rank writes its rows' from
  // its master rows (into its row copies where it keeps them), then gather_copies.
  void hand_over_copies(const std::vector<bool>& released, const AdamW::CopiesOf& copies);

  Communicator& comm_;
  OptimizerConfig config_;
  ShardPlan plan_;
  int64_t bucket_numel_;
  Device device_;
  Tensor master_, m_, v_, grad_;  // [shard_numel]: this rank's masters, moments, summed gradient
  bool reduced_now_ = false;      // reduce_scatter_now has filled grad_ since the last step
  // On the GPU, reduce_scatter_now's collectives and sums into grad_ run here, beside the backward
  // (made at its first call); grad_ is read elsewhere only after waiting for it (grad_ready()).
  std::unique_ptr<SideStream> reduce_stream_;
  void grad_ready();
  // `tensors` without those owned whole (null in their place): the ones summed over the ranks.
  std::vector<Tensor*> cut_tensors(const std::vector<Tensor*>& tensors) const;
  // grad_ += this rank's gradients of the tensors it owns whole (plan tensor i: grads[i], or null).
  void add_owned_gradients(const std::vector<Tensor*>& grads);
  AdamW::CopiesOf row_copies_;
  int64_t steps_ = 0;
};

}  // namespace lockstep
