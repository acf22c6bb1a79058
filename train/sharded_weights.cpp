// train/sharded_weights.cpp
#include "train/sharded_weights.h"

#include <optional>

#include "core/error.h"

namespace lockstep {

ShardedWeights::ShardedWeights(Transformer& model, ShardedAdamW& optimizer)
    : model_(model), optimizer_(optimizer) {
  LOCKSTEP_CHECK(model.masters_released(), "ShardedWeights: the model still holds its fp32 masters "
                 "(Transformer::release_masters first: the sharded optimizer writes the copies)");
  const ShardPlan& plan = optimizer.plan();
  LOCKSTEP_CHECK(!plan.has_owned_tensors() || model.expert_parallel(), "ShardedWeights: the optimizer "
                 "owns each expert on one rank, and the model does not run them there "
                 "(Transformer::set_expert_parallel first)");
  rows_.resize(plan.tensors.size());
  held_.resize(plan.tensors.size());
  layer_tensors_.resize(size_t(model.config().num_hidden_layers));
  gathered_.assign(layer_tensors_.size(), false);
  std::vector<int> own_piece(plan.tensors.size(), -1);
  const std::vector<ShardPiece>& mine = plan.pieces[size_t(optimizer.rank())];
  for (size_t p = 0; p < mine.size(); ++p) own_piece[size_t(mine[p].tensor)] = int(p);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const std::string& name = plan.tensors[i].name;
    if (!name.starts_with("layers.")) continue;
    const WeightCopies c = model.weight_copies(name);
    if (!c.bf16 && !c.fp8) continue;  // a norm or a bias: the model holds its master
    held_[i] = true;
    layer_tensors_[std::stoul(name.substr(7))].push_back(int(i));
    RowCopies& r = rows_[i];
    r.format = c.fp8_format;
    if (own_piece[i] >= 0) {
      const ShardPiece& p = mine[size_t(own_piece[i])];
      const int64_t n = p.row_end - p.row_begin, block = p.row_begin / kShardRowBlock;
      if (c.bf16) {
        r.bf16 = Tensor::empty({n, plan.tensors[i].shape[1]}, DType::bf16, model.device());
        r.bf16.copy_from(c.bf16->rows(p.row_begin, p.row_end));
      }
      if (c.fp8) {
        r.fp8.w = Fp8Blocks::empty(n, plan.tensors[i].shape[1], model.device());
        r.fp8.w.data.copy_from(c.fp8->w.data.rows(p.row_begin, p.row_end));
        r.fp8.w.scales.copy_from(c.fp8->w.scales.rows(block, block + r.fp8.w.scales.dim(0)));
      }
    }
  }
  for (size_t l = 0; l < layer_tensors_.size(); ++l) model.drop_layer_copies(int64_t(l));
  model.set_layer_weight_source(
      {.wanted = [this](int64_t layer, int64_t next) {
         if (all_) return;
         wait_for_gathers();  // a layer queued beside the previous one's compute
         if (!gathered_[size_t(layer)]) gather({layer}, /*beside=*/false, /*with_transpose=*/true);
         if (next >= 0 && !gathered_[size_t(next)]) gather({next}, /*beside=*/true, /*with_transpose=*/true);
       },
       .done = [this](int64_t layer) {
         if (!all_) drop(layer);
       }});
  optimizer.keep_copies_by_rows([this](const std::string& name) {
    const std::vector<ShardedTensor>& tensors = optimizer_.plan().tensors;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].name == name) return held_[i] ? rows_of(int(i)) : WeightCopies{};
    return WeightCopies{};
  });
}

ShardedWeights::~ShardedWeights() {
  model_.set_layer_weight_source({});
  optimizer_.keep_copies_by_rows({});
}

WeightCopies ShardedWeights::rows_of(int tensor) {
  // The step writes rows only: a whole copy alive now would keep the old weights.
  for (size_t l = 0; l < gathered_.size(); ++l)
    LOCKSTEP_CHECK(!gathered_[l], "ShardedWeights: an optimizer step while layer ", l,
                   "'s whole weight copies exist (drop_all() first: they would keep the old weights)");
  RowCopies& r = rows_[size_t(tensor)];
  const WeightCopies whole = model_.weight_copies(optimizer_.plan().tensors[size_t(tensor)].name);
  if (whole.fp8) return {.fp8 = &r.fp8, .fp8_format = r.format};
  return {.bf16 = &r.bf16};
}

void ShardedWeights::gather(const std::vector<int64_t>& layers, bool beside, bool with_transpose) {
  const ShardPlan& plan = optimizer_.plan();
  std::vector<WeightCopies> whole(plan.tensors.size()), rows(plan.tensors.size());
  for (int64_t layer : layers) {
    // (The model allocates them: a sparse layer's experts' fp8 copies are views of its stacks; with
    // expert parallelism, outside gather_all, of this rank's experts only.)
    model_.allocate_layer_copies(layer, with_transpose, /*own_experts_only=*/!all_);
    for (int i : layer_tensors_[size_t(layer)]) {
      RowCopies& r = rows_[size_t(i)];
      if (plan.owned_whole(i) && !all_) {
        // An expert, owned whole: the training forward and backward read this rank's own (its row
        // copies are whole) and no other's (model/expert_parallel.h): nothing to gather.
        use_own_expert(i, with_transpose);
        continue;
      }
      whole[size_t(i)] = model_.weight_copies(plan.tensors[size_t(i)].name);
      if (whole[size_t(i)].fp8) rows[size_t(i)] = {.fp8 = &r.fp8, .fp8_format = r.format};
      else rows[size_t(i)] = {.bf16 = &r.bf16};
    }
    gathered_[size_t(layer)] = true;
  }
  // Beside: on the gather stream, after the buffers' allocation; NCCL runs the collectives of one
  // communicator in the order the host issued them, whatever their streams, so this one and the
  // optimizer's reduce-scatters beside the backward keep the same order on every rank.
  std::optional<CurrentStream> on_gather_stream;
  if (beside && model_.device() == Device::cuda) {
    if (!gather_stream_) gather_stream_ = std::make_unique<SideStream>();
    side_stream_waits_for_current(*gather_stream_);
    on_gather_stream.emplace(*gather_stream_);
    pending_ = true;
  }
  optimizer_.gather_copies(whole, rows);
}

void ShardedWeights::use_own_expert(int tensor, bool with_transpose) {
  const RowCopies& r = rows_[size_t(tensor)];
  if (!r.bf16.defined() && !r.fp8.w.data.defined()) return;  // another rank's expert
  const WeightCopies whole = model_.weight_copies(optimizer_.plan().tensors[size_t(tensor)].name);
  if (whole.bf16) *whole.bf16 = r.bf16;  // the same storage: the row copy is the whole tensor
  if (whole.fp8) {
    // Copied into the model's copy, which Transformer::allocate_layer_copies made: with the grouped
    // expert GEMM a view of the layer's expert stack (model/moe.h), where that GEMM reads it.
    whole.fp8->w.data.copy_from(r.fp8.w.data);
    whole.fp8->w.scales.copy_from(r.fp8.w.scales);
    if (with_transpose) transpose_weight_blocks(*whole.fp8);
  }
}

void ShardedWeights::wait_for_gathers() {
  if (pending_) current_stream_waits_for(*gather_stream_);
  pending_ = false;
}

void ShardedWeights::drop(int64_t layer) {
  model_.drop_layer_copies(layer);
  gathered_[size_t(layer)] = false;
}

void ShardedWeights::gather_all() {
  wait_for_gathers();
  std::vector<int64_t> layers;
  for (size_t l = 0; l < gathered_.size(); ++l)
    if (!gathered_[l]) layers.push_back(int64_t(l));
  all_ = true;  // (before the gather: it gathers the experts too)
  gather(layers, /*beside=*/false, /*with_transpose=*/false);
}

void ShardedWeights::drop_all() {
  wait_for_gathers();
  for (size_t l = 0; l < gathered_.size(); ++l)
    if (gathered_[l]) drop(int64_t(l));
  all_ = false;
}

bool ShardedWeights::holds(const std::string& name) const {
  const std::vector<ShardedTensor>& tensors = optimizer_.plan().tensors;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return held_[i];
  return false;
}

int64_t ShardedWeights::row_copy_bytes() const {
  int64_t bytes = 0;
  for (const RowCopies& r : rows_)
    for (const Tensor* t : {&r.bf16, &r.fp8.w.data, &r.fp8.w.scales})
      bytes += t->defined() ? int64_t(t->nbytes()) : 0;
  return bytes;
}

}  // namespace lockstep
