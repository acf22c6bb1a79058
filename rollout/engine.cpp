// rollout/engine.cpp
#include "rollout/engine.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "core/error.h"
#include "ops/sample.h"
#include "rollout/decode_graph.h"
#include "rollout/scheduler.h"

namespace lockstep {

namespace {

// The engine's side of a scheduler sequence (same index as the scheduler's id).
struct Sequence {
  size_t request = 0;
  uint64_t sample = 0;          // the Philox stream
  int64_t forks = 0;            // samples to fork off once the shared prompt is prefilled
  std::vector<int32_t> tokens;  // prompt, then generated
  std::vector<float> logprobs;
  std::string text;  // the generated text, kept for stop strings only
  std::vector<int32_t> expert_ids = {};  // GeneratedSample's, of the tokens computed so far
};

// A token to draw this step: from logits row `row` for sequence `seq`.
struct Draw {
  int64_t seq = 0, row = 0;
};

// The options with num_blocks made from memory_fraction when it is 0.
EngineOptions checked(EngineOptions o, const Transformer& model) {
  LOCKSTEP_CHECK(o.block_size > 0, "engine: block_size must be positive, got ", o.block_size);
  LOCKSTEP_CHECK(o.num_blocks >= 0 && o.memory_fraction >= 0 && o.memory_fraction <= 1 &&
                     (o.num_blocks > 0) != (o.memory_fraction > 0),
                 "engine: set either num_blocks > 0 or memory_fraction in (0, 1], got num_blocks ",
                 o.num_blocks, " and memory_fraction ", o.memory_fraction);
  if (o.num_blocks == 0) {
    LOCKSTEP_CHECK(model.device() == Device::cuda, "engine: memory_fraction sizes the KV cache ",
                   "from free GPU memory, and the model is on the CPU: set num_blocks");
    const int64_t block =
        KvCache::block_bytes(model.config(), model.kv_cache_dtype(), o.block_size);
    const size_t free = device_memory_stats().free;
    o.num_blocks = std::min(int64_t(o.memory_fraction * double(free) / double(block)),
                            INT32_MAX / o.block_size - 1);
    LOCKSTEP_CHECK(o.num_blocks > 0, "engine: memory_fraction ", o.memory_fraction, " of the ",
                   free, " free GPU bytes holds no KV block of ", block, " bytes");
  }
  LOCKSTEP_CHECK(o.num_blocks < INT32_MAX / o.block_size,
                 "engine: (num_blocks + 1) · block_size = (", o.num_blocks, " + 1) · ",
                 o.block_size, " slots (the +1: the scratch block) do not fit the i32 slot indices");
  LOCKSTEP_CHECK(o.max_step_tokens > 0 && o.max_step_sequences > 0,
                 "engine: max_step_tokens and max_step_sequences must be positive, got ",
                 o.max_step_tokens, " and ", o.max_step_sequences);
  return o;
}

// What a step uploads: the InferBatch, the copy-on-write pairs (i32 [C, 2]) and the sample specs
// of its draws, built in one host buffer (each part 16-byte aligned) that goes to the device in
// one copy. Block table rows are padded with block 0, never read.
struct StepInputs {
  InferBatch batch;
  Tensor copies;
  Tensor specs;  // a view of `storage`
  Tensor storage;
};

StepInputs build_step(const StepPlan& plan, const Scheduler& scheduler,
                      const std::vector<Sequence>& seqs, std::span<const int32_t> copies,
                      std::span<const SampleSpec> specs, Device device) {
  const int64_t block = scheduler.block_size(), s_count = int64_t(plan.chunks.size());
  int64_t t_count = 0, width = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    t_count += c.end - c.begin;
    width = std::max(width, int64_t(scheduler.blocks(c.seq).size()));
  }
  const int64_t spec_words = int64_t(sizeof(SampleSpec) / sizeof(int32_t));
  // tokens, positions, slots, cu_seqlens_q, context_lens, block_tables, last_rows, copies, specs
  const int64_t sizes[9] = {t_count, t_count, t_count, s_count + 1, s_count, s_count * width,
                            s_count, int64_t(copies.size()), int64_t(specs.size()) * spec_words};
  int64_t offsets[10] = {0};
  for (int i = 0; i < 9; ++i) offsets[i + 1] = offsets[i] + (sizes[i] + 3) / 4 * 4;
  Tensor host = Tensor::zeros({offsets[9]}, DType::i32);
  int32_t* part[9];
  for (int i = 0; i < 9; ++i) part[i] = host.data_as<int32_t>() + offsets[i];

  int64_t t = 0;
  for (int64_t s = 0; s < s_count; ++s) {
    const ScheduledChunk& c = plan.chunks[size_t(s)];
    const std::vector<int32_t>& blocks = scheduler.blocks(c.seq);
    for (int64_t p = c.begin; p < c.end; ++p, ++t) {
      part[0][t] = seqs[size_t(c.seq)].tokens[size_t(p)];
      part[1][t] = int32_t(p);
      part[2][t] = int32_t(blocks[size_t(p / block)] * block + p % block);
    }
    part[3][s + 1] = int32_t(t);
    part[4][s] = int32_t(c.end);
    std::copy(blocks.begin(), blocks.end(), part[5] + s * width);
    part[6][s] = int32_t(t) - 1;
  }
  std::copy(copies.begin(), copies.end(), part[7]);
  if (!specs.empty()) std::memcpy(part[8], specs.data(), specs.size_bytes());

  const Tensor all = device == Device::cpu ? host : host.to(device);
  auto view = [&](int i) { return all.rows(offsets[i], offsets[i] + sizes[i]); };
  return {{view(0), view(1), view(2), view(3), view(4), view(5).reshape({s_count, width}), view(6)},
          view(7).reshape({int64_t(copies.size()) / 2, 2}),
          Tensor::view_of(all.data_as<int32_t>() + offsets[8],
                          {int64_t(specs.size()), kSampleSpecWords}, DType::i64, device),
          all};
}

// Writes each sparse layer's choices for the step's rows (InferBatch::routing read back: host i32
// [sparse layers, R, k], the rows in the plan's order) into the sequences the rows belong to.
void record_routing(const StepPlan& plan, const Tensor& routing, std::vector<Sequence>& seqs) {
  const int64_t count = routing.dim(0), stride = routing.dim(1), k = routing.dim(2);
  const int32_t* all = routing.data_as<int32_t>();
  int64_t row = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    std::vector<int32_t>& ids = seqs[size_t(c.seq)].expert_ids;
    ids.resize(std::max(ids.size(), size_t(c.end * count * k)));
    for (int64_t p = c.begin; p < c.end; ++p, ++row)
      for (int64_t l = 0; l < count; ++l)
        std::copy_n(all + (l * stride + row) * k, k, ids.begin() + (p * count + l) * k);
  }
}

// A step without the decode graph: its inputs built and uploaded in one copy, the forward, the
// head and the sampler run op by op; with `routing`, the rows' routing goes to their sequences.
// Returns the draws in host memory: tokens i32 [D] then logprobs f32 [D] (undefined without
// draws).
Tensor eager_step(Transformer& model, KvCache& cache, const StepPlan& plan,
                  const Scheduler& scheduler, std::vector<Sequence>& seqs,
                  std::span<const int32_t> copies, std::span<const SampleSpec> specs, bool routing) {
  const Device device = model.device();
  const StepInputs in = build_step(plan, scheduler, seqs, copies, specs, device);
  copy_cache_blocks(cache, in.copies, copies);
  const ModelConfig& config = model.config();
  InferBatch batch = in.batch;
  if (routing && config.moe)
    batch.routing = Tensor::empty({config.sparse_layers(), batch.tokens.dim(0), config.moe->num_experts_per_tok},
                                  DType::i32, device);
  const Tensor hidden = model.forward_infer(batch, cache);
  if (batch.routing.defined()) record_routing(plan, batch.routing.to(Device::cpu), seqs);
  if (specs.empty()) return Tensor();
  // Tokens and logprobs on the model's device; only they come back to the host (in one copy:
  // the step's one wait for the device).
  const int64_t count = int64_t(specs.size());
  const Tensor out = Tensor::empty({2 * count}, DType::i32, device);
  Tensor tokens = out.rows(0, count);
  Tensor logprobs = Tensor::view_of(out.data_as<int32_t>() + count, {count}, DType::f32, device);
  sample_tokens(tokens, logprobs, model.logits(hidden), in.specs);
  return device == Device::cpu ? out : out.to(Device::cpu);
}

// The stop rules of rollout/engine.h after `s` got its latest token.
std::optional<FinishReason> finish_reason(Sequence& s, const GenerationRequest& request,
                                          const Tokenizer* tokenizer) {
  const SamplingParams& p = request.sampling;
  const int32_t token = s.tokens.back();
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end())
    return FinishReason::stop;
  if (!p.stop_strings.empty()) {
    const size_t before = s.text.size();
    s.text += tokenizer->decode(std::span<const int32_t>(&token, 1));
    for (const std::string& stop : p.stop_strings) {
      // The text before held no stop string, so a new match ends in the new piece.
      const size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
      if (s.text.find(stop, from) != std::string::npos) return FinishReason::stop;
    }
  }
  if (s.tokens.size() - request.prompt.size() == size_t(p.max_new_tokens))
    return FinishReason::length;
  return std::nullopt;
}

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
  return reason == FinishReason::stop ? "stop" : "length";
}

Engine::Engine(Transformer& model, const EngineOptions& options, const Tokenizer* tokenizer)
    : model_(model),
      options_(checked(options, model)),
      tokenizer_(tokenizer),
      cache_(model.config(), model.kv_cache_dtype(), options_.num_blocks + 1,
             options_.block_size, model.device()) {
  make_decode_graph();
}

void Engine::weights_moved() {
  decode_.reset();
  make_decode_graph();
}

void Engine::make_decode_graph() {
  if (model_.device() != Device::cuda) return;
  // The decode graph's block tables reach the model's context, or the cache when it is smaller.
  const int64_t positions = model_.config().max_position_embeddings;
  int64_t max_blocks = options_.num_blocks;
  if (positions > 0)
    max_blocks = std::min(max_blocks, (positions + options_.block_size - 1) / options_.block_size);
  // A sparse model whose forward reads its routing's expert counts back (Transformer::
  // decode_reads_nothing_back) cannot be captured: its decode steps run eagerly.
  decode_ = std::make_unique<DecodeGraph>(model_, cache_, options_.max_step_sequences, max_blocks,
                                          options_.cuda_graphs && model_.decode_reads_nothing_back(),
                                          options_.record_routing);
}

Engine::~Engine() = default;

void Engine::check_request(const GenerationRequest& request, size_t index) const {
  const std::string what = "request " + std::to_string(index);
  const SamplingParams& p = request.sampling;
  const int64_t vocab = model_.config().vocab_size, length = int64_t(request.prompt.size());
  LOCKSTEP_CHECK(length > 0, what, ": the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i)
    LOCKSTEP_CHECK(request.prompt[i] >= 0 && request.prompt[i] < vocab, what, ": prompt[", i,
                   "] = ", request.prompt[i], " is outside the vocabulary [0, ", vocab, ")");
  LOCKSTEP_CHECK(p.n >= 1, what, ": n must be at least 1, got ", p.n);
  LOCKSTEP_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, what,
                 ": temperature must be finite and >= 0, got ", p.temperature);
  LOCKSTEP_CHECK(p.top_p > 0 && p.top_p <= 1, what, ": top_p must be in (0, 1], got ", p.top_p);
  LOCKSTEP_CHECK(p.top_k >= 0, what, ": top_k must be >= 0 (0: no limit), got ", p.top_k);
  LOCKSTEP_CHECK(p.max_new_tokens >= 1, what, ": max_new_tokens must be at least 1, got ",
                 p.max_new_tokens);
  for (size_t i = 0; i < p.stop_strings.size(); ++i)
    LOCKSTEP_CHECK(!p.stop_strings[i].empty(), what, ": stop_strings[", i, "] is empty");
  LOCKSTEP_CHECK(p.stop_strings.empty() || tokenizer_ != nullptr, what,
                 ": stop_strings need a tokenizer, and the engine was given none");
  const int64_t capacity = options_.num_blocks * options_.block_size;
  LOCKSTEP_CHECK(p.max_new_tokens - 1 <= capacity - length, what, ": the prompt (", length,
                 " tokens) and max_new_tokens (", p.max_new_tokens, ") need more than the KV ",
                 "cache's ", capacity, " token slots (num_blocks · block_size)");
}

std::vector<std::vector<GeneratedSample>> Engine::generate(
    const std::vector<GenerationRequest>& requests) {
  for (size_t r = 0; r < requests.size(); ++r) check_request(requests[r], r);
  std::vector<std::vector<GeneratedSample>> results(requests.size());
  Scheduler scheduler(options_.num_blocks, options_.block_size, options_.max_step_tokens,
                      options_.max_step_sequences);
  std::vector<Sequence> seqs;  // by scheduler id
  for (size_t r = 0; r < requests.size(); ++r) {
    const int64_t n = requests[r].sampling.n;
    results[r].resize(size_t(n));
    for (int64_t j = 0; j < (options_.share_prompts ? 1 : n); ++j) {
      scheduler.add(int64_t(requests[r].prompt.size()));
      seqs.push_back(
          {r, uint64_t(j), options_.share_prompts ? n - 1 : 0, requests[r].prompt, {}, {}});
    }
  }

  const int64_t vocab = model_.config().vocab_size;
  if (decode_) decode_->pause();
  const double host_seconds_before = decode_ ? decode_->host_seconds() : 0.0;
  while (!scheduler.idle()) {
    const StepPlan plan = scheduler.schedule();
    ++stats_.steps;
    stats_.block_copies += int64_t(plan.copies.size());
    for (const ScheduledChunk& c : plan.chunks) stats_.tokens_computed += c.end - c.begin;

    // A decode step for the decode graph: every sequence computes its newest token and draws the
    // next, none forks, and every block table fits the graph's.
    bool decode = decode_ != nullptr;
    for (const ScheduledChunk& c : plan.chunks) {
      const Sequence& s = seqs[size_t(c.seq)];
      decode = decode && c.end - c.begin == 1 && c.end == int64_t(s.tokens.size()) &&
               s.forks == 0 && int64_t(scheduler.blocks(c.seq).size()) <= decode_->max_blocks();
    }

    // A token for each sequence whose chunk reaches its last token (a prompt whose prefill
    // continues next step gets none); a shared prompt first forks its other samples.
    std::vector<Draw> draws;
    for (size_t row = 0; row < plan.chunks.size(); ++row) {
      const int64_t seq = plan.chunks[row].seq;
      if (plan.chunks[row].end < int64_t(seqs[size_t(seq)].tokens.size())) continue;
      draws.push_back({seq, int64_t(row)});
      if (const int64_t forks = seqs[size_t(seq)].forks; forks > 0) {
        seqs[size_t(seq)].forks = 0;
        const int64_t first = scheduler.fork(seq, forks);
        for (int64_t i = 0; i < forks; ++i) {
          Sequence child = seqs[size_t(seq)];
          child.sample = uint64_t(i + 1);
          seqs.push_back(std::move(child));
          draws.push_back({first + i, int64_t(row)});
        }
      }
    }
    std::vector<SampleSpec> specs;
    for (const Draw& d : draws) {
      const Sequence& s = seqs[size_t(d.seq)];
      const SamplingParams& p = requests[s.request].sampling;
      specs.push_back({.seed = p.seed,
                       .stream = s.sample,
                       .position = s.tokens.size(),
                       .row = int32_t(d.row),
                       .temperature = p.temperature,
                       .top_p = p.top_p,
                       .top_k = p.top_k < vocab ? int32_t(p.top_k) : 0});
    }
    std::vector<int32_t> copies;
    for (const BlockCopy& c : plan.copies) copies.insert(copies.end(), {c.src, c.dst});

    if (observer_) {
      std::vector<StepChunk> chunks;
      for (const ScheduledChunk& c : plan.chunks) {
        const Sequence& s = seqs[size_t(c.seq)];
        chunks.push_back({s.request, int64_t(s.sample), c.begin, c.end});
      }
      observer_(chunks);
    }
    DecodeGraph::Drawn drawn;
    Tensor eager;  // holds an eager step's draws
    if (decode) {
      std::vector<DecodeGraph::Row> rows;
      for (size_t i = 0; i < plan.chunks.size(); ++i) {
        const ScheduledChunk& c = plan.chunks[i];
        rows.push_back({seqs[size_t(c.seq)].tokens.back(), int32_t(c.begin),
                        scheduler.blocks(c.seq), specs[i]});
      }
      drawn = decode_->run(rows, copies);
      if (options_.record_routing && drawn.routing.defined()) record_routing(plan, drawn.routing, seqs);
      ++stats_.decode_steps;
    } else {
      if (decode_) decode_->pause();
      eager = eager_step(model_, cache_, plan, scheduler, seqs, copies, specs, options_.record_routing);
      if (draws.empty()) continue;
      drawn = {{eager.data_as<int32_t>(), draws.size()},
               {static_cast<const float*>(eager.data()) + draws.size(), draws.size()}};
    }
    const int32_t* token = drawn.tokens.data();
    const float* logprob = drawn.logprobs.data();

    // A forked sample was copied before the step ran its prompt's last chunk: its routing is the
    // sequence's that ran it (taken before that one can finish and hand its routing over).
    if (options_.record_routing)
      for (const Draw& d : draws)
        if (const int64_t ran = plan.chunks[size_t(d.row)].seq; ran != d.seq)
          seqs[size_t(d.seq)].expert_ids = seqs[size_t(ran)].expert_ids;
    for (size_t i = 0; i < draws.size(); ++i) {
      Sequence& s = seqs[size_t(draws[i].seq)];
      LOCKSTEP_CHECK(token[i] >= 0, "engine: request ", s.request, ", sample ", s.sample,
                     ": the logits at position ", s.tokens.size(), " hold a NaN or have no ",
                     "finite maximum (a diverged model?)");
      s.tokens.push_back(token[i]);
      s.logprobs.push_back(logprob[i]);
      const std::optional<FinishReason> reason = finish_reason(s, requests[s.request], tokenizer_);
      if (!reason) {
        scheduler.append(draws[i].seq);
        continue;
      }
      scheduler.finish(draws[i].seq);
      GeneratedSample& out_sample = results[s.request][s.sample];
      out_sample.tokens.assign(s.tokens.begin() + ptrdiff_t(requests[s.request].prompt.size()),
                               s.tokens.end());
      out_sample.logprobs = std::move(s.logprobs);
      out_sample.expert_ids = std::move(s.expert_ids);
      out_sample.finish_reason = *reason;
      s = Sequence();  // free its memory
    }
  }
  stats_.preemptions += scheduler.preemptions();
  if (decode_) stats_.decode_host_seconds += decode_->host_seconds() - host_seconds_before;
  return results;
}

}  // namespace lockstep
