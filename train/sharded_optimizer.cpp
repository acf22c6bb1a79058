// train/sharded_optimizer.cpp
#include "train/sharded_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "core/device.h"
#include "core/error.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace lockstep {

namespace {

// With `experts_owned`, each expert's tensors go whole to its owner (train/shard_plan.h).
std::vector<ShardedTensor> shapes_of(const ModelParameters& params, bool experts_owned, int ranks) {
  std::vector<ShardedTensor> out;
  params.for_each([&](const std::string& name, const Tensor& t) {
    LOCKSTEP_CHECK(t.dtype() == DType::f32, "ShardedAdamW: ", name, " is ", t.describe(),
                   " (the masters are f32)");
    out.push_back({name, t.shape()});
  });
  if (experts_owned) assign_experts_to_owners(out, ranks);
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

// Some elements of a tensor (a 1-D view: `dst`) and where they sit in their owner's flat shard;
// on the owner, `src` is what it sends for them (undefined: dst itself, which then stays as it is).
struct FlatPiece {
  Tensor dst, src;
  int64_t offset;
};

// Every rank's pieces to every rank: rank r's are pieces[r], packed into a flat shard of
// `shard_size` elements of `dtype`; bucket by bucket of at most `bucket` elements per rank, so the
// buffers stay small.
void all_gather_pieces(Communicator& comm, const std::vector<std::vector<FlatPiece>>& pieces,
                       int64_t shard_size, DType dtype, Device device, int64_t bucket) {
  const int ranks = comm.size(), me = comm.rank();
  // The part of each piece of `rank` inside [lo, hi), with its position in the bucket.
  const auto in_bucket = [&](int rank, int64_t lo, int64_t hi, const auto& fn) {
    for (const FlatPiece& p : pieces[size_t(rank)]) {
      const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.dst.numel());
      if (b < e) fn(p, b - p.offset, e - p.offset, b - lo);
    }
  };
  for (int64_t lo = 0; lo < shard_size; lo += bucket) {
    const int64_t hi = std::min(shard_size, lo + bucket), n = hi - lo;
    Tensor send = Tensor::zeros({n}, dtype, device);
    in_bucket(me, lo, hi, [&](const FlatPiece& p, int64_t b, int64_t e, int64_t at) {
      send.rows(at, at + e - b).copy_from((p.src.defined() ? p.src : p.dst).rows(b, e));
    });
    Tensor recv = Tensor::empty({ranks * n}, dtype, device);
    comm.all_gather(send, recv);
    for (int r = 0; r < ranks; ++r)
      in_bucket(r, lo, hi, [&](const FlatPiece& p, int64_t b, int64_t e, int64_t at) {
        if (r == me && !p.src.defined()) return;  // already in place
        Tensor dst = p.dst.rows(b, e);
        dst.copy_from(recv.rows(r * n + at, r * n + at + e - b));
      });
  }
}

// Rows [b, e) of t as bytes (an e4m3 view: the collectives move any dtype).
Tensor row_bytes(const Tensor& t, int64_t b, int64_t e) {
  const Tensor rows = t.rows(b, e);
  return Tensor::view_of(rows.data(), {int64_t(rows.nbytes())}, DType::e4m3, t.device());
}

// The fp8 blocks of rows [b, e) of W (b a multiple of 128) from their f32 masters `rows`: W's
// bytes and scales in place in `fp8`, the same as quantize_weight of the whole W writes there.
// quantize_weight also writes Wᵀ, into a scratch of at most kChunk rows (Wᵀ is remade whole after
// the gather).
void quantize_rows_of(Fp8Weight& fp8, const Tensor& rows, int64_t b, int64_t e, ScaleFormat format) {
  constexpr int64_t kChunk = 8 * kShardRowBlock;
  const int64_t k = rows.dim(1);
  for (int64_t r0 = b; r0 < e; r0 += kChunk) {
    const int64_t r1 = std::min(e, r0 + kChunk), blocks = (r1 - r0 + kShardRowBlock - 1) / kShardRowBlock;
    Fp8Weight part;
    part.w.data = fp8.w.data.rows(r0, r1);
    part.w.scales = fp8.w.scales.rows(r0 / kShardRowBlock, r0 / kShardRowBlock + blocks);
    part.wt = Fp8Blocks::empty(k, r1 - r0, rows.device());
    quantize_weight(part, rows.rows(r0 - b, r1 - b), format);
  }
}

}  // namespace

ShardedAdamW::ShardedAdamW(const ModelParameters& params, const OptimizerConfig& config,
                           Communicator& comm, int64_t bucket_numel, bool experts_owned)
    : comm_(comm),
      config_(config),
      plan_(plan_shards(shapes_of(params, experts_owned, comm.size()), comm.size())),
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
  master_ = Tensor::zeros({n}, DType::f32, device_);
  ModelParameters copy = params;  // shares storage; for_each needs a non-const structure
  const std::vector<Tensor*> p = checked(copy, "params");
  for (const Span& s : spans(p, comm_.rank(), 0, plan_.shard_numel))
    master_.rows(s.shard_begin, s.shard_begin + s.tensor_elems.numel()).copy_from(s.tensor_elems);
  m_ = Tensor::zeros({n}, DType::f32, device_);
  v_ = Tensor::zeros({n}, DType::f32, device_);
  grad_ = Tensor::zeros({n}, DType::f32, device_);
}

std::vector<Tensor*> ShardedAdamW::checked(ModelParameters& p, const char* what, bool allow_missing) const {
  std::vector<Tensor*> out;
  p.for_each([&](const std::string& name, Tensor& t) {
    const size_t i = out.size();
    // A tensor the model released is absent: skip the plan's tensors up to this one's name.
    size_t at = i;
    if (allow_missing)
      while (at < plan_.tensors.size() && plan_.tensors[at].name != name) ++at;
    LOCKSTEP_CHECK(at < plan_.tensors.size() && plan_.tensors[at].name == name &&
                       plan_.tensors[at].shape == t.shape() && t.dtype() == DType::f32 &&
                       t.device() == device_,
                   "ShardedAdamW: ", what, " tensor ", i, " is ", name, " ", t.describe(),
                   ", expected ",
                   i < plan_.tensors.size() ? plan_.tensors[i].name + " f32" + shape_string(plan_.tensors[i].shape)
                                            : std::string("no more tensors"));
    out.resize(at, nullptr);
    out.push_back(&t);
  });
  if (allow_missing) out.resize(plan_.tensors.size(), nullptr);
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
    if (b >= e || !tensors[size_t(p.tensor)]) continue;
    const Tensor& t = *tensors[size_t(p.tensor)];
    const Tensor elems = t.reshape({t.numel()}).rows(p.row_begin * row + (b - p.offset),
                                                     p.row_begin * row + (e - p.offset));
    out.push_back({p.tensor, elems, b});
  }
  return out;
}

OptimizerStep ShardedAdamW::step(ModelParameters& params, ModelParameters& grads,
                                 const AdamW::CopiesOf& copies) {
  const std::vector<Tensor*> p = checked(params, "params", /*allow_missing=*/true),
                             g = checked(grads, "grads");
  const int ranks = plan_.ranks, me = comm_.rank();
  const int64_t shard = plan_.shard_numel;
  grad_ready();

  // 1. grad_ = this rank's rows of Σ over the ranks of the gradients, bucket by bucket (unless
  // the backward has reduce-scattered them already). A tensor owned whole (an expert's) has its
  // gradient on its owner only: copied, not summed (the collective carries zeros in its place).
  const std::vector<Tensor*> summed = cut_tensors(g);
  for (int64_t lo = 0; lo < (reduced_now_ ? 0 : shard); lo += bucket_numel_) {
    const int64_t hi = std::min(shard, lo + bucket_numel_), n = hi - lo;
    Tensor send = Tensor::zeros({ranks * n}, DType::f32, device_);
    for (int r = 0; r < ranks; ++r)
      for (const Span& s : spans(summed, r, lo, hi)) {
        const int64_t at = r * n + (s.shard_begin - lo);
        send.rows(at, at + s.tensor_elems.numel()).copy_from(s.tensor_elems);
      }
    Tensor recv = grad_.rows(lo, hi);
    comm_.reduce_scatter_sum(send, recv);
  }
  if (!reduced_now_) add_owned_gradients(g);

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
    discard_gradients();
    return out;
  }
  const AdamWHyper hyper = adamw_hyper(config_, out.lr);

  // 3. The update of this rank's rows of the masters.
  for (const Span& s : own) {
    const int64_t b = s.shard_begin, e = b + s.tensor_elems.numel();
    Tensor master = master_.rows(b, e), m = m_.rows(b, e), v = v_.rows(b, e);
    adamw_step(master, m, v, grad_.rows(b, e), hyper, out.step, out.clip_scale);
  }

  // 4. The hand-over: the held tensors get every rank's updated rows, then their copies; the
  // released ones' copies are written by their owners and gathered.
  const auto t0 = std::chrono::steady_clock::now();
  gather_into(master_, p);
  std::vector<bool> released(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    released[i] = p[i] == nullptr;
    if (released[i] || !copies) continue;
    const WeightCopies c = copies(plan_.tensors[i].name);
    if (c.bf16) convert(*c.bf16, *p[i]);
    if (c.fp8) quantize_weight(*c.fp8, *p[i], c.fp8_format);
  }
  hand_over_copies(released, copies);
  out.handover_seconds = device_seconds_since(t0);
  steps_ = out.step;
  out.applied = true;
  grads.zero();
  discard_gradients();
  return out;
}

void ShardedAdamW::reduce_scatter_now(ModelParameters& grads, const std::vector<std::string>& names) {
  const std::vector<Tensor*> all = checked(grads, "grads");
  std::vector<Tensor*> g(all.size(), nullptr);
  for (const std::string& name : names) {
    size_t i = 0;
    while (i < plan_.tensors.size() && plan_.tensors[i].name != name) ++i;
    LOCKSTEP_CHECK(i < plan_.tensors.size(), "ShardedAdamW::reduce_scatter_now: no tensor ", name);
    g[i] = all[i];
  }
  // Their pieces, packed per rank, bucket by bucket: packed on the current stream (the gradient
  // buffers are the backward's to reuse), reduced and summed into grad_ on reduce_stream_. The
  // tensors owned whole go straight into their owner's grad_, on the current stream.
  const int ranks = plan_.ranks, me = comm_.rank();
  add_owned_gradients(g);
  const PackedSpans packed = packed_spans(cut_tensors(g));
  if (device_ == Device::cuda) {
    if (!reduce_stream_) reduce_stream_ = std::make_unique<SideStream>();
    current_stream_waits_for(*reduce_stream_);  // the previous group's buffers are free again
  }
  for (int64_t lo = 0; lo < packed.size; lo += bucket_numel_) {
    const int64_t hi = std::min(packed.size, lo + bucket_numel_), n = hi - lo;
    // The part of each of rank r's spans inside [lo, hi): its elements [b, e) and where they go.
    const auto each = [&](int r, const auto& fn) {
      for (const auto& [s, at] : packed.of_rank[size_t(r)]) {
        const int64_t b = std::max(lo, at) - at, e = std::min(hi, at + s.tensor_elems.numel()) - at;
        if (b < e) fn(s, b, e, at + b - lo);
      }
    };
    Tensor send = Tensor::zeros({ranks * n}, DType::f32, device_);
    for (int r = 0; r < ranks; ++r)
      each(r, [&](const Span& s, int64_t b, int64_t e, int64_t at) {
        send.rows(r * n + at, r * n + at + e - b).copy_from(s.tensor_elems.rows(b, e));
      });
    std::optional<CurrentStream> beside;
    if (reduce_stream_) {
      side_stream_waits_for_current(*reduce_stream_);
      beside.emplace(*reduce_stream_);
    }
    Tensor recv = Tensor::empty({n}, DType::f32, device_);
    comm_.reduce_scatter_sum(send, recv);
    send = Tensor();  // freed in the order of the stream that read it
    each(me, [&](const Span& s, int64_t b, int64_t e, int64_t at) {
      Tensor dst = grad_.rows(s.shard_begin + b, s.shard_begin + e);
      add_into(dst, recv.rows(at, at + e - b));
    });
  }
  for (Tensor* t : g)
    if (t) t->fill_bytes(0);
  reduced_now_ = true;
}

std::vector<Tensor*> ShardedAdamW::cut_tensors(const std::vector<Tensor*>& tensors) const {
  std::vector<Tensor*> out = tensors;
  for (size_t i = 0; i < out.size(); ++i)
    if (plan_.owned_whole(int(i))) out[i] = nullptr;
  return out;
}

void ShardedAdamW::add_owned_gradients(const std::vector<Tensor*>& grads) {
  for (const ShardPiece& p : plan_.pieces[size_t(comm_.rank())]) {
    if (!plan_.owned_whole(p.tensor) || !grads[size_t(p.tensor)]) continue;
    const Tensor& g = *grads[size_t(p.tensor)];
    Tensor dst = grad_.rows(p.offset, p.offset + g.numel());
    add_into(dst, g.reshape({g.numel()}));
  }
}

void ShardedAdamW::grad_ready() {
  if (reduce_stream_) current_stream_waits_for(*reduce_stream_);
}

void ShardedAdamW::discard_gradients() {
  grad_ready();
  if (reduced_now_) grad_.fill_bytes(0);
  reduced_now_ = false;
}

ShardedAdamW::PackedSpans ShardedAdamW::packed_spans(const std::vector<Tensor*>& tensors) const {
  PackedSpans out;
  out.of_rank.resize(size_t(plan_.ranks));
  for (int r = 0; r < plan_.ranks; ++r) {
    int64_t offset = 0;
    for (const Span& s : spans(tensors, r, 0, plan_.shard_numel)) {
      out.of_rank[size_t(r)].emplace_back(s, offset);
      offset = round_up(offset + s.tensor_elems.numel(), kShardPieceAlign);
    }
    out.size = std::max(out.size, offset);
  }
  return out;
}

void ShardedAdamW::gather_into(const Tensor& shard, const std::vector<Tensor*>& full) {
  // Only the tensors `full` holds, packed.
  const PackedSpans packed = packed_spans(full);
  std::vector<std::vector<FlatPiece>> pieces(size_t(plan_.ranks));
  for (int r = 0; r < plan_.ranks; ++r)
    for (const auto& [s, offset] : packed.of_rank[size_t(r)]) {
      const int64_t n = s.tensor_elems.numel();
      const Tensor src = r == comm_.rank() ? shard.rows(s.shard_begin, s.shard_begin + n) : Tensor();
      pieces[size_t(r)].push_back({s.tensor_elems, src, offset});
    }
  all_gather_pieces(comm_, pieces, packed.size, DType::f32, device_, bucket_numel_);
}

void ShardedAdamW::hand_over_copies(const std::vector<bool>& released, const AdamW::CopiesOf& copies) {
  if (std::none_of(released.begin(), released.end(), [](bool r) { return r; })) return;
  std::vector<WeightCopies> whole(released.size()), rows(released.size());
  for (size_t i = 0; i < released.size(); ++i) {
    if (!released[i]) continue;
    const std::string& name = plan_.tensors[i].name;
    if (copies) whole[i] = copies(name);
    if (row_copies_) rows[i] = row_copies_(name);
    LOCKSTEP_CHECK(whole[i].bf16 || whole[i].fp8 || rows[i].bf16 || rows[i].fp8,
                   "ShardedAdamW: the model released the master of ", name,
                   " and the step was given no copy of it to write");
  }
  // This rank's rows of the copies, from its rows of the masters: into its row copies where it
  // keeps them, else in place in the whole copies.
  for (const ShardPiece& p : plan_.pieces[size_t(comm_.rank())]) {
    if (!released[size_t(p.tensor)]) continue;
    const WeightCopies& w = whole[size_t(p.tensor)];
    const WeightCopies& r = rows[size_t(p.tensor)];
    const int64_t row = plan_.row_numel(p.tensor), n = p.row_end - p.row_begin;
    const Tensor master = master_.rows(p.offset, p.offset + n * row).reshape({n, row});
    if (r.bf16) {
      convert(*r.bf16, master);
    } else if (w.bf16) {
      Tensor dst = w.bf16->rows(p.row_begin, p.row_end).reshape({n, row});
      convert(dst, master);
    }
    if (r.fp8) quantize_rows_of(*r.fp8, master, 0, n, r.fp8_format);
    else if (w.fp8) quantize_rows_of(*w.fp8, master, p.row_begin, p.row_end, w.fp8_format);
  }
  gather_copies(whole, rows);
}

void ShardedAdamW::gather_copies(const std::vector<WeightCopies>& whole,
                                 const std::vector<WeightCopies>& rows) {
  LOCKSTEP_CHECK(whole.size() == plan_.tensors.size() && rows.size() == plan_.tensors.size(),
                 "ShardedAdamW::gather_copies: copies of ", whole.size(), " and ", rows.size(),
                 " tensors, the plan has ", plan_.tensors.size());
  // Each rank's rows of the whole copies as bytes, packed into its flat byte shard (16-byte
  // aligned); this rank's come from its row copies where it has them.
  std::vector<std::vector<FlatPiece>> pieces(size_t(plan_.ranks));
  int64_t shard_bytes = 0;
  for (int r = 0; r < plan_.ranks; ++r) {
    int64_t offset = 0;
    const auto add = [&](const Tensor& bytes, const Tensor& src) {
      pieces[size_t(r)].push_back({bytes, src, offset});
      offset = round_up(offset + bytes.numel(), 16);
    };
    const bool me = r == comm_.rank();
    for (const ShardPiece& p : plan_.pieces[size_t(r)]) {
      const WeightCopies& w = whole[size_t(p.tensor)];
      const WeightCopies& own = rows[size_t(p.tensor)];
      const int64_t n = p.row_end - p.row_begin;
      const int64_t block_begin = p.row_begin / kShardRowBlock, blocks = (n + kShardRowBlock - 1) / kShardRowBlock;
      if (w.bf16)
        add(row_bytes(*w.bf16, p.row_begin, p.row_end),
            me && own.bf16 ? row_bytes(*own.bf16, 0, n) : Tensor());
      if (w.fp8) {
        add(row_bytes(w.fp8->w.data, p.row_begin, p.row_end),
            me && own.fp8 ? row_bytes(own.fp8->w.data, 0, n) : Tensor());
        add(row_bytes(w.fp8->w.scales, block_begin, block_begin + blocks),
            me && own.fp8 ? row_bytes(own.fp8->w.scales, 0, blocks) : Tensor());
      }
    }
    shard_bytes = std::max(shard_bytes, offset);
  }
  if (shard_bytes == 0) return;
  all_gather_pieces(comm_, pieces, shard_bytes, DType::e4m3, device_, int64_t(bucket_numel_) * 4);
  for (const WeightCopies& w : whole)
    if (w.fp8 && w.fp8->wt.data.defined()) transpose_weight_blocks(*w.fp8);
}

void ShardedAdamW::gather_masters(ModelParameters& full) {
  gather_into(master_, checked(full, "gather_masters: full"));
}

DataParallelOptimizer::Moments ShardedAdamW::full_moments(const ModelParameters& params) {
  Moments out{params, params};
  for (auto [dst, shard] : {std::pair{&out.m, &m_}, std::pair{&out.v, &v_}}) {
    dst->for_each([&](const std::string&, Tensor& t) { t = Tensor::zeros(t.shape(), DType::f32, device_); });
    gather_into(*shard, checked(*dst, "moments"));
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

void ShardedAdamW::load_moment_rows(const MomentRows& read, int64_t steps) {
  LOCKSTEP_CHECK(steps >= 0, "ShardedAdamW::load_moment_rows: negative step count ", steps);
  for (auto [kind, dst] : {std::pair{"m", &m_}, std::pair{"v", &v_}}) {
    dst->fill_bytes(0);
    for (const ShardPiece& p : plan_.pieces[size_t(comm_.rank())]) {
      const int64_t row = plan_.row_numel(p.tensor), rows = p.row_end - p.row_begin;
      Shape shape = plan_.tensors[size_t(p.tensor)].shape;
      if (shape.empty()) shape = {1};
      shape[0] = rows;
      Tensor piece = dst->rows(p.offset, p.offset + rows * row).reshape(shape);
      read(kind, p.tensor, p.row_begin, p.row_end, piece);
    }
  }
  steps_ = steps;
}

}  // namespace lockstep
