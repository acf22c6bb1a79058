// train/sharded_optimizer.cpp
#include "train/sharded_optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace lockstep {

namespace {

std::vector<ShardedTensor> shapes_of(const ModelParameters& params) {
  std::vector<ShardedTensor> out;
  params.for_each([&](const std::string& name, const Tensor& t) {
    LOCKSTEP_CHECK(t.dtype() == DType::f32, "ShardedAdamW: ", name, " is ", t.describe(),
                   " (the masters are f32)");
    out.push_back({name, t.shape()});
  });
  return out;
}

Device device_of(const ModelParameters& params) {
  Device d = Device::cpu;
  bool first = true;
  params.for_each([&](const std::string& name, const Tensor& t) {
    if (first) d = t.device();
    LOCKSTEP_CHECK(t.device() == d, "ShardedAdamW: ", name, " is ", t.describe(),
                   ", the other tensors are not (one device for every tensor)");
    first = false;
  });
  return d;
}

}  // namespace

ShardedAdamW::ShardedAdamW(const ModelParameters& params, const OptimizerConfig& config,
                           Communicator& comm, int64_t bucket_numel)
    : comm_(comm),
      config_(config),
      plan_(plan_shards(shapes_of(params), comm.size())),
      bucket_numel_(bucket_numel),
      device_(device_of(params)) {
  LOCKSTEP_CHECK(std::isfinite(config.max_grad_norm) && config.max_grad_norm >= 0,
                 "ShardedAdamW: max_grad_norm = ", config.max_grad_norm,
                 " (must be finite and non-negative; 0 turns clipping off)");
  LOCKSTEP_CHECK(bucket_numel >= kShardPieceAlign && bucket_numel % kShardPieceAlign == 0,
                 "ShardedAdamW: bucket_numel = ", bucket_numel, " (must be a positive multiple of ",
                 kShardPieceAlign, ": the views of a bucket stay 16-byte aligned)");
  // Padding past a rank's own elements stays zero: zero gradient, zero moments.
  const int64_t n = std::max<int64_t>(plan_.shard_numel, 1);
  m_ = Tensor::zeros({n}, DType::f32, device_);
  v_ = Tensor::zeros({n}, DType::f32, device_);
  grad_ = Tensor::zeros({n}, DType::f32, device_);
}

std::vector<Tensor*> ShardedAdamW::checked(ModelParameters& p, const char* what) const {
  std::vector<Tensor*> out;
  p.for_each([&](const std::string& name, Tensor& t) {
    const size_t i = out.size();
    LOCKSTEP_CHECK(i < plan_.tensors.size() && plan_.tensors[i].name == name &&
                       plan_.tensors[i].shape == t.shape() && t.dtype() == DType::f32 &&
                       t.device() == device_,
                   "ShardedAdamW: ", what, " tensor ", i, " is ", name, " ", t.describe(),
                   ", expected ",
                   i < plan_.tensors.size() ? plan_.tensors[i].name + " f32" + shape_string(plan_.tensors[i].shape)
                                            : std::string("no more tensors"));
    out.push_back(&t);
  });
  LOCKSTEP_CHECK(out.size() == plan_.tensors.size(), "ShardedAdamW: ", what, " has ", out.size(),
                 " tensors, the optimizer was built for ", plan_.tensors.size());
  return out;
}

std::vector<ShardedAdamW::Span> ShardedAdamW::spans(const std::vector<Tensor*>& tensors, int rank,
                                                    int64_t lo, int64_t hi) const {
  std::vector<Span> out;
  for (const ShardPiece& p : plan_.pieces[size_t(rank)]) {
    const int64_t row = plan_.row_numel(p.tensor), n = (p.row_end - p.row_begin) * row;
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + n);
    if (b >= e) continue;
    const Tensor& t = *tensors[size_t(p.tensor)];
    const Tensor elems = t.reshape({t.numel()}).rows(p.row_begin * row + (b - p.offset),
                                                     p.row_begin * row + (e - p.offset));
    out.push_back({p.tensor, elems, b});
  }
  return out;
}

OptimizerStep ShardedAdamW::step(ModelParameters& params, ModelParameters& grads,
                                 const AdamW::CopiesOf& copies) {
  const std::vector<Tensor*> p = checked(params, "params"), g = checked(grads, "grads");
  const int ranks = plan_.ranks, me = comm_.rank();
  const int64_t shard = plan_.shard_numel;

  // 1. grad_ = this rank's rows of Σ over the ranks of the gradients, bucket by bucket.
  for (int64_t lo = 0; lo < shard; lo += bucket_numel_) {
    const int64_t hi = std::min(shard, lo + bucket_numel_), n = hi - lo;
    Tensor send = Tensor::zeros({ranks * n}, DType::f32, device_);
    for (int r = 0; r < ranks; ++r)
      for (const Span& s : spans(g, r, lo, hi)) {
        const int64_t at = r * n + (s.shard_begin - lo);
        send.rows(at, at + s.tensor_elems.numel()).copy_from(s.tensor_elems);
      }
    Tensor recv = grad_.rows(lo, hi);
    comm_.reduce_scatter_sum(send, recv);
  }

  // 2. ‖g‖ from per-tensor sums of squares: each rank's own pieces, summed over the ranks.
  const std::vector<Span> own = spans(g, me, 0, shard);
  std::vector<Tensor> own_grads;
  std::vector<const Tensor*> own_ptrs;
  for (const Span& s : own)
    own_grads.push_back(grad_.rows(s.shard_begin, s.shard_begin + s.tensor_elems.numel()));
  for (const Tensor& t : own_grads) own_ptrs.push_back(&t);
  const std::vector<double> piece_sums = sum_squares(own_ptrs);
  Tensor sums = Tensor::zeros({int64_t(plan_.tensors.size())}, DType::f64);
  for (size_t i = 0; i < own.size(); ++i) sums.data_as<double>()[own[i].tensor] += piece_sums[i];
  comm_.all_reduce_sum(sums);

  std::vector<std::string> names;
  for (const auto& t : plan_.tensors) names.push_back(t.name);
  OptimizerStep out = plan_optimizer_step(
      config_, steps_, std::span<const double>(sums.data_as<double>(), plan_.tensors.size()), names);
  if (!out.nonfinite_grad.empty()) {
    grads.zero();
    return out;
  }
  const AdamWHyper hyper = adamw_hyper(config_, out.lr);

  // 3. The update of this rank's rows, in place in the masters.
  for (const Span& s : spans(p, me, 0, shard)) {
    Tensor master = s.tensor_elems;
    const int64_t b = s.shard_begin, e = b + master.numel();
    Tensor m = m_.rows(b, e), v = v_.rows(b, e);
    adamw_step(master, m, v, grad_.rows(b, e), hyper, out.step, out.clip_scale);
  }

  // 4. Every rank's updated rows to every rank, then the copies.
  gather_into(nullptr, p);
  if (copies)
    for (size_t i = 0; i < p.size(); ++i) {
      const WeightCopies c = copies(plan_.tensors[i].name);
      if (c.bf16) convert(*c.bf16, *p[i]);
      if (c.fp8) quantize_weight(*c.fp8, *p[i], c.fp8_format);
    }
  steps_ = out.step;
  out.applied = true;
  grads.zero();
  return out;
}

void ShardedAdamW::gather_into(const Tensor* shard, const std::vector<Tensor*>& full) {
  const int ranks = plan_.ranks, me = comm_.rank();
  const int64_t total = plan_.shard_numel;
  for (int64_t lo = 0; lo < total; lo += bucket_numel_) {
    const int64_t hi = std::min(total, lo + bucket_numel_), n = hi - lo;
    Tensor send;
    if (shard) {
      send = shard->rows(lo, hi);
    } else {  // this rank's rows of `full` itself
      send = Tensor::zeros({n}, DType::f32, device_);
      for (const Span& s : spans(full, me, lo, hi))
        send.rows(s.shard_begin - lo, s.shard_begin - lo + s.tensor_elems.numel()).copy_from(s.tensor_elems);
    }
    Tensor recv = Tensor::empty({ranks * n}, DType::f32, device_);
    comm_.all_gather(send, recv);
    for (int r = 0; r < ranks; ++r) {
      if (r == me && !shard) continue;  // already in place
      for (Span& s : spans(full, r, lo, hi)) {
        const int64_t at = r * n + (s.shard_begin - lo);
        s.tensor_elems.copy_from(recv.rows(at, at + s.tensor_elems.numel()));
      }
    }
  }
}

DataParallelOptimizer::Moments ShardedAdamW::full_moments(const ModelParameters& params) {
  Moments out{params, params};
  for (auto [dst, shard] : {std::pair{&out.m, &m_}, std::pair{&out.v, &v_}}) {
    dst->for_each([&](const std::string&, Tensor& t) { t = Tensor::zeros(t.shape(), DType::f32, device_); });
    gather_into(shard, checked(*dst, "moments"));
  }
  return out;
}

void ShardedAdamW::load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps) {
  LOCKSTEP_CHECK(steps >= 0, "ShardedAdamW::load_state: negative step count ", steps);
  const int me = comm_.rank();
  for (auto [src, dst, moment] : {std::tuple{&m, &m_, "first moment"}, std::tuple{&v, &v_, "second moment"}}) {
    const char* what = moment;  // a lambda below names it (clang 14 cannot capture a structured binding)
    ModelParameters copy = *src;  // shares storage; for_each needs a non-const structure
    std::vector<Tensor*> tensors;
    copy.for_each([&](const std::string& name, Tensor& t) {
      const size_t i = tensors.size();
      LOCKSTEP_CHECK(i < plan_.tensors.size() && plan_.tensors[i].name == name &&
                         plan_.tensors[i].shape == t.shape() && t.dtype() == DType::f32,
                     "ShardedAdamW::load_state: the saved ", what, " does not match: tensor ", i,
                     " is ", name, " ", t.describe());
      tensors.push_back(&t);
    });
    LOCKSTEP_CHECK(tensors.size() == plan_.tensors.size(), "ShardedAdamW::load_state: the saved ",
                   what, " has ", tensors.size(), " tensors, the model ", plan_.tensors.size());
    dst->fill_bytes(0);
    for (const Span& s : spans(tensors, me, 0, plan_.shard_numel))
      dst->rows(s.shard_begin, s.shard_begin + s.tensor_elems.numel()).copy_from(s.tensor_elems);
  }
  steps_ = steps;
}

}  // namespace lockstep
