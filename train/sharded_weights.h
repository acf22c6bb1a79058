// train/sharded_weights.h — the weight copies the GEMMs read, sharded over the data-parallel ranks
// as ZeRO-3 shards them. Between uses each rank keeps the copies of its own rows of every layer
// matrix only (train/shard_plan.h's pieces: bf16 rows, or fp8 W's E4M3 bytes and the scales of
// its 128-row blocks); a layer's whole copies exist only while the model computes with it:
//
//   - training (Transformer::set_layer_weight_source): before layer i's forward or backward its
//     whole copies are all-gathered into fresh buffers (Transformer::allocate_layer_copies: a
//     sparse layer's experts' fp8 copies as views of its stacks, model/moe.h;
//     ShardedAdamW::gather_copies; fp8's Wᵀ is remade from the gathered W), and freed after it.
//     The layer the model will want next (i + 1 in the forward, i − 1 in the backward) is
//     gathered beside layer i's compute (on the GPU, on a stream of its own), so at most two
//     layers' whole copies are alive;
//   - rollout: gather_all() makes every layer's whole copies at once (the weight hand-over: one
//     all-gather of bf16 bytes, or of E4M3 bytes and scales; no Wᵀ, which generation does not
//     read), drop_all() frees them after it;
//   - the optimizer step writes the copies of the rows it updated into this rank's row copies
//     (ShardedAdamW::keep_copies_by_rows) and gathers none of them.
// The embedding, the LM head and the norms stay whole on every rank (the optimizer gathers their
// updated masters as before).
//
// With expert parallelism (the optimizer owns each expert whole on one rank: ShardedAdamW's
// experts_owned; the model runs each rank's experts there: Transformer::set_expert_parallel) a
// rank's row copies of its experts are their whole copies, and training gathers no expert: a
// layer's wanted() gathers its attention, router and other non-expert matrices only, and the model
// reads this rank's experts from its row copies (fp8: Wᵀ remade from them per use). gather_all()
// still gathers every expert (the rollout runs them all). Gathering moves bytes: the whole copies are the bits the unsharded
// run holds, and so is everything computed from them.
//
// Bytes of weight copies per rank between steps: (the layer matrices' copies)/N, within one
// 128-row block per rank, plus the embedding's and LM head's — against all of them unsharded
// (bf16: 2 bytes a parameter; fp8: W and Wᵀ, 2 + scales, of which a rank keeps W's 1 + scales).
// With a separate rollout model (the fp8-rollout mode) only the trainer's bf16 copies are sharded:
// the rollout model keeps its whole fp8 copies, written by the step's gather as before.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_graph.h"
#include "model/transformer.h"
#include "train/sharded_optimizer.h"

namespace lockstep {

class ShardedWeights {
 public:
  // Takes this rank's rows of `model`'s layer copies (whole now) and frees the whole ones; then
  // installs itself as the model's layer weight source and the optimizer's row copies. The model
  // must have released its masters to `optimizer` (Transformer::release_masters). Both must
  // outlive this.
  ShardedWeights(Transformer& model, ShardedAdamW& optimizer);
  // Uninstalls itself; whatever whole copies the model holds then stay (gather_all() first leaves
  // it a whole model again).
  ~ShardedWeights();
  ShardedWeights(const ShardedWeights&) = delete;
  ShardedWeights& operator=(const ShardedWeights&) = delete;

  // Every layer's whole copies (fp8: W only, without the Wᵀ only a backward reads), until
  // drop_all(); the layer source gathers nothing meanwhile (no backward then). A collective:
  // every rank calls it.
  void gather_all();
  void drop_all();

  // Whether `name` is a tensor whose copies are kept by rows here.
  bool holds(const std::string& name) const;
  // Bytes of the row copies this rank keeps.
  int64_t row_copy_bytes() const;

 private:
  struct RowCopies {
    Tensor bf16;
    Fp8Weight fp8;  // w only
    ScaleFormat format = ScaleFormat::fp32;
  };
  WeightCopies rows_of(int tensor);
  // Allocates the model's whole copies of `layers`' matrices and gathers them (beside the compute
  // with `beside`); fp8 with `with_transpose`: Wᵀ too, remade from W (the backward's DGrad reads
  // it; generation does not).
  void gather(const std::vector<int64_t>& layers, bool beside, bool with_transpose);
  void drop(int64_t layer);
  // The model's whole copies of `tensor`, an expert owned whole, from this rank's row copies when
  // it owns it (nothing for another rank's).
  void use_own_expert(int tensor, bool with_transpose);
  // The current stream waits for the gathers queued beside the compute.
  void wait_for_gathers();

  Transformer& model_;
  ShardedAdamW& optimizer_;
  std::vector<RowCopies> rows_;                // [plan tensor]
  std::vector<bool> held_;                     // [plan tensor]: kept by rows here
  std::vector<std::vector<int>> layer_tensors_;  // [layer]: its held plan tensors
  std::vector<bool> gathered_;                 // [layer]: its whole copies exist
  bool all_ = false;      // gather_all() until drop_all()
  // On the GPU: where a layer's gather runs beside the compute (made at the first), and whether
  // one was queued there since the current stream last waited for it.
  std::unique_ptr<SideStream> gather_stream_;
  bool pending_ = false;
};

}  // namespace lockstep
