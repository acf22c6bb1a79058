// rollout/forward_comparison.cpp
#include "rollout/forward_comparison.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <utility>

#include "core/dtypes.h"
#include "core/error.h"
#include "model/micro_batch.h"
#include "rollout/engine.h"

namespace lockstep {

namespace {

// One op's output row on the host: the activation's bytes, and for an fp8 GEMM input its E4M3
// codes and scales.
struct HostRow {
  DType act_dtype = DType::f32;
  std::vector<uint8_t> act, codes;
  std::vector<float> scales;
};

Tensor on_host(const Tensor& t) { return t.device() == Device::cpu ? t : t.to(Device::cpu); }

// Rows [begin, end) of a tapped value, on the host.
std::vector<HostRow> host_rows(const LinearInput& v, int64_t begin, int64_t end) {
  std::vector<HostRow> out(size_t(end - begin));
  if (v.act.defined()) {
    const Tensor a = on_host(v.act.rows(begin, end));
    const size_t width = a.nbytes() / out.size();
    const auto* p = static_cast<const uint8_t*>(a.data());
    for (size_t r = 0; r < out.size(); ++r) {
      out[r].act_dtype = a.dtype();
      out[r].act.assign(p + r * width, p + (r + 1) * width);
    }
  }
  if (v.rows.data.defined()) {
    const Tensor codes = on_host(v.rows.data.rows(begin, end));
    const Tensor scales = on_host(v.rows.scales);  // [groups, T]: one row's scales are a column
    const int64_t cols = codes.dim(1), groups = scales.dim(0), all_rows = scales.dim(1);
    const auto* p = static_cast<const uint8_t*>(codes.data());
    const float* s = scales.data_as<float>();
    for (size_t r = 0; r < out.size(); ++r) {
      out[r].codes.assign(p + int64_t(r) * cols, p + int64_t(r + 1) * cols);
      for (int64_t g = 0; g < groups; ++g)
        out[r].scales.push_back(s[g * all_rows + begin + int64_t(r)]);
    }
  }
  return out;
}

float element(const HostRow& r, size_t i) {
  if (r.act_dtype == DType::bf16) {
    bf16 b;
    std::memcpy(&b, r.act.data() + 2 * i, 2);
    return bf16_to_float(b);
  }
  float f;
  std::memcpy(&f, r.act.data() + 4 * i, 4);
  return f;
}

double abs_diff(float a, float b) {
  if (float_bits(a) == float_bits(b)) return 0;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  return std::fabs(double(a) - double(b));
}

// Adds the comparison of one rollout row with the training row of the same token; returns whether
// they are equal.
bool compare_row(OpComparison& c, const HostRow& roll, const HostRow& train) {
  ++c.rows;
  const bool act = !roll.act.empty() && !train.act.empty();
  const bool fp8 = !roll.codes.empty() && !train.codes.empty();
  if ((roll.act.empty() && roll.codes.empty()) || (train.act.empty() && train.codes.empty()) ||
      (!act && !fp8) || (act && (roll.act_dtype != train.act_dtype || roll.act.size() != train.act.size())) ||
      (fp8 && roll.codes.size() != train.codes.size())) {
    c.forms_differ = true;
    return false;
  }
  bool equal = true;
  if (act) {
    equal = roll.act == train.act;
    if (!equal) {
      const size_t n = roll.act.size() / dtype_size(roll.act_dtype);
      for (size_t i = 0; i < n; ++i)
        c.max_abs_diff = std::max(c.max_abs_diff, abs_diff(element(roll, i), element(train, i)));
    }
  }
  if (fp8) {
    const bool same_scales =
        std::memcmp(roll.scales.data(), train.scales.data(), roll.scales.size() * 4) == 0;
    equal = equal && same_scales && roll.codes == train.codes;
    c.codes += int64_t(roll.codes.size());
    for (size_t i = 0; i < roll.codes.size(); ++i) {
      if (roll.codes[i] == train.codes[i] && same_scales) continue;
      c.codes_differ += roll.codes[i] != train.codes[i];
      if (act) continue;  // the activation's difference is the one reported
      const size_t g = i / kQuantGroup;
      c.max_abs_diff = std::max(
          c.max_abs_diff, abs_diff(e4m3_to_float(e4m3{roll.codes[i]}) * roll.scales[g],
                                   e4m3_to_float(e4m3{train.codes[i]}) * train.scales[g]));
    }
  }
  c.rows_equal += equal;
  return equal;
}

void add_logprob(LogprobComparison& c, float rollout, float training) {
  ++c.tokens;
  c.not_equal += float_bits(rollout) != float_bits(training);
  const double d = abs_diff(rollout, training);
  c.mean_abs_diff += d;  // a sum until finish()
  c.max_abs_diff = std::max(c.max_abs_diff, d);
}

void finish(LogprobComparison& c) {
  if (c.tokens > 0) c.mean_abs_diff /= double(c.tokens);
}

// The model's tap while in scope (the model outlives the comparison: it keeps no tap into it).
struct TapScope {
  Transformer& model;
  TapScope(Transformer& m, ActivationTap tap) : model(m) { m.set_activation_tap(std::move(tap)); }
  ~TapScope() { model.set_activation_tap(nullptr); }
};

// Row keys: (sequence, position) of the tapped sequences.
using RowKey = std::pair<int64_t, int64_t>;
using OpKey = std::pair<int64_t, std::string>;

// Calls `each(row, sequence, position)` for the rows of `chunks` in row order, and returns the
// first and one past the last row of the tapped sequences (begin = end: none).
template <class Each>
std::pair<int64_t, int64_t> tapped_rows(std::span<const Engine::StepChunk> chunks, bool one_per_chunk,
                                        int64_t tapped, Each each) {
  int64_t row = 0, first = -1, last = -1;
  for (const Engine::StepChunk& c : chunks) {
    const int64_t begin = one_per_chunk ? c.end - 1 : c.begin;
    for (int64_t p = begin; p < c.end; ++p, ++row) {
      if (int64_t(c.request) >= tapped) continue;
      if (first < 0) first = row;
      last = row;
      each(row, int64_t(c.request), p);
    }
  }
  return first < 0 ? std::pair<int64_t, int64_t>{0, 0} : std::pair<int64_t, int64_t>{first, last + 1};
}

std::vector<std::vector<GeneratedSample>> generate(Transformer& model,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   const ForwardComparisonOptions& o, bool graphs,
                                                   Engine::StepObserver observer = nullptr,
                                                   int64_t* preemptions = nullptr) {
  // As rl/train.cpp's engine_options sizes the engine (unless cache_blocks says otherwise): every
  // sequence resident at once (no preemption), all of them in every decode step; the cache's size
  // bounds the decode graph's block tables, which set its attention's split count.
  int64_t blocks = 1;
  for (const auto& p : prompts)
    blocks += (int64_t(p.size()) + o.new_tokens + o.block_size - 1) / o.block_size;
  if (o.cache_blocks > 0) blocks = o.cache_blocks;
  Engine engine(model, {.num_blocks = blocks,
                        .block_size = o.block_size,
                        .max_step_tokens = o.step_tokens,
                        .max_step_sequences = std::max<int64_t>(256, int64_t(prompts.size())),
                        .cuda_graphs = graphs});
  if (observer) engine.observe_steps(std::move(observer));
  std::vector<GenerationRequest> requests;
  for (size_t r = 0; r < prompts.size(); ++r) {
    GenerationRequest q;
    q.prompt = prompts[r];
    q.sampling.temperature = o.temperature;
    q.sampling.max_new_tokens = o.new_tokens;
    q.sampling.seed = o.seed + r;
    requests.push_back(std::move(q));
  }
  auto results = engine.generate(requests);
  if (preemptions) *preemptions = engine.stats().preemptions;
  return results;
}

}  // namespace

ForwardComparison compare_rollout_forward(Transformer& rollout, Transformer& training,
                                          const std::vector<std::vector<int32_t>>& prompts,
                                          const ForwardComparisonOptions& o) {
  LOCKSTEP_CHECK(rollout.config() == training.config(),
                 "compare_rollout_forward: the rollout and training models have different configs");
  LOCKSTEP_CHECK(!prompts.empty(), "compare_rollout_forward: no prompts");
  LOCKSTEP_CHECK(o.new_tokens >= 1, "compare_rollout_forward: new_tokens must be at least 1, got ",
                 o.new_tokens);
  LOCKSTEP_CHECK(o.step_tokens >= int64_t(prompts.size()), "compare_rollout_forward: the step token ",
                 "budget (", o.step_tokens, ") must hold a decode step of all ", prompts.size(),
                 " sequences");
  LOCKSTEP_CHECK(o.tapped_sequences >= 0 && o.train_tokens > 0,
                 "compare_rollout_forward: tapped_sequences must be >= 0 and train_tokens > 0");
  const int64_t final_layer = rollout.config().num_hidden_layers;

  // 1. The tapped generation: every op's rows of the tapped sequences, by op and token.
  std::map<OpKey, std::map<RowKey, HostRow>> rollout_rows;
  std::vector<OpKey> order;  // ops in the order the forward runs them
  std::vector<Engine::StepChunk> step;
  int64_t preemptions = 0;
  const auto rollout_tap = [&](int64_t layer, std::string_view op, const LinearInput& v) {
    const OpKey key{layer, std::string(op)};
    auto [it, added] = rollout_rows.try_emplace(key);
    if (added) order.push_back(key);
    const bool one_per_chunk = layer == final_layer;  // forward_infer's final norm: last rows
    std::vector<std::pair<int64_t, RowKey>> keys;
    const auto [begin, end] = tapped_rows(step, one_per_chunk, o.tapped_sequences,
                                          [&](int64_t row, int64_t seq, int64_t pos) {
                                            keys.push_back({row, {seq, pos}});
                                          });
    if (begin == end) return;
    std::vector<HostRow> rows = host_rows(v, begin, end);
    for (const auto& [row, rk] : keys) it->second[rk] = std::move(rows[size_t(row - begin)]);
  };
  const auto results = [&] {
    const TapScope tap(rollout, rollout_tap);
    return generate(rollout, prompts, o, false, [&](std::span<const Engine::StepChunk> chunks) {
      step.assign(chunks.begin(), chunks.end());
    }, &preemptions);
  }();

  // 2. The training forward over prompt + generated tokens, in micro-batches of whole sequences
  // in request order (the tapped ones, the first, lead the first micro-batch).
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> lengths;
  for (size_t r = 0; r < prompts.size(); ++r) {
    seqs.push_back(prompts[r]);
    seqs.back().insert(seqs.back().end(), results[r][0].tokens.begin(), results[r][0].tokens.end());
    lengths.push_back(int64_t(seqs.back().size()));
  }
  std::map<OpKey, OpComparison> compared, compared_decode;  // prompt rows, generated rows
  std::set<RowKey> equal_final_norm;  // tokens whose final-norm rows are bit-identical
  std::vector<std::vector<float>> train_logprobs(seqs.size());
  const float temperature = o.temperature > 0 ? o.temperature : 1.0f;
  for (const SequenceRange& range : plan_micro_batches(lengths, o.train_tokens)) {
    std::vector<int32_t> tokens, targets, cu{0};
    for (size_t s = range.first; s < range.last; ++s) {
      tokens.insert(tokens.end(), seqs[s].begin(), seqs[s].end());
      targets.insert(targets.end(), seqs[s].begin() + 1, seqs[s].end());
      targets.push_back(0);  // the last row's target: ignored
      cu.push_back(int32_t(tokens.size()));
    }
    // The tapped rows of this micro-batch: rows of sequences < tapped_sequences, leading it.
    std::vector<Engine::StepChunk> chunks;
    for (size_t s = range.first; s < range.last; ++s)
      chunks.push_back({s, 0, 0, lengths[s]});
    const TapScope tap(training, [&](int64_t layer, std::string_view op, const LinearInput& v) {
      const OpKey key{layer, std::string(op)};
      const auto found = rollout_rows.find(key);
      if (found == rollout_rows.end()) return;  // an op the rollout did not run
      std::vector<std::pair<int64_t, RowKey>> keys;
      const auto [begin, end] =
          tapped_rows(chunks, false, o.tapped_sequences, [&](int64_t row, int64_t seq, int64_t pos) {
            if (found->second.contains({seq, pos})) keys.push_back({row, {seq, pos}});
          });
      if (keys.empty()) return;
      const std::vector<HostRow> rows = host_rows(v, begin, end);
      for (const auto& [row, rk] : keys) {
        const bool decode = rk.second >= int64_t(prompts[size_t(rk.first)].size());
        OpComparison& c = (decode ? compared_decode : compared)[key];
        if (compare_row(c, found->second.at(rk), rows[size_t(row - begin)]) && layer == final_layer)
          equal_final_norm.insert(rk);
      }
    });
    const TrainForward f =
        training.forward(make_train_batch(tokens, targets, cu, training.config().vocab_size,
                                          training.device()),
                         temperature, false);
    const Tensor lp = on_host(f.logprob);
    for (size_t s = range.first; s < range.last; ++s) {
      const float* p = lp.data_as<float>() + cu[s - range.first];
      train_logprobs[s].assign(p, p + lengths[s]);
    }
  }

  ForwardComparison out;
  out.preemptions = preemptions;
  for (const OpKey& key : order)
    for (bool decode : {false, true}) {
      const auto& from = decode ? compared_decode : compared;
      const auto it = from.find(key);
      if (it == from.end()) continue;
      OpComparison c = it->second;
      c.layer = key.first;
      c.op = key.second;
      c.decode = decode;
      out.ops.push_back(std::move(c));
    }
  // Generated token i of sequence r: row P − 1 + i of the training forward gives its logprob.
  for (size_t r = 0; r < seqs.size(); ++r) {
    const GeneratedSample& g = results[r][0];
    for (size_t i = 0; i < g.logprobs.size(); ++i) {
      const int64_t row = int64_t(prompts[r].size() - 1 + i);
      add_logprob(out.logprobs, g.logprobs[i], train_logprobs[r][size_t(row)]);
      if (equal_final_norm.contains({int64_t(r), row}))
        add_logprob(out.head_logprobs, g.logprobs[i], train_logprobs[r][size_t(row)]);
    }
  }
  finish(out.logprobs);
  finish(out.head_logprobs);

  // 3. The same generation with CUDA graphs, untapped: its logprobs where its tokens are the
  // tapped generation's.
  if (o.cuda_graphs && rollout.device() == Device::cuda) {
    out.graphs_run = true;
    const auto graph = generate(rollout, prompts, o, true);
    for (size_t r = 0; r < seqs.size(); ++r) {
      const GeneratedSample &g = graph[r][0], &e = results[r][0];
      for (size_t i = 0; i < g.tokens.size(); ++i) {
        if (g.tokens[i] != e.tokens[i]) {
          ++out.graph_tokens_differ;
          break;
        }
        out.graph_logprobs_not_equal_to_eager += float_bits(g.logprobs[i]) != float_bits(e.logprobs[i]);
        add_logprob(out.graph_logprobs, g.logprobs[i], train_logprobs[r][prompts[r].size() - 1 + i]);
      }
    }
    finish(out.graph_logprobs);
  }
  return out;
}

}  // namespace lockstep
