// rl/setup.cpp
#include "rl/setup.h"

#include <algorithm>
#include <climits>
#include <cstdio>

#include "core/error.h"
#include "core/philox.h"
#include "io/chat.h"
#include "model/hf_checkpoint.h"
#include "ops/forward_kernels.h"
#include "rl/sharded_checkpoint.h"

namespace lockstep {

Problems Problems::loaded(std::vector<Problem> problems) {
  Problems p;
  p.problems_ = std::move(problems);
  return p;
}

Problems Problems::synthetic(uint64_t seed, int level, SyntheticSplit split) {
  Problems p;
  p.synthetic_ = Synthetic{Synthetic::Task::arithmetic, seed, level, split};
  return p;
}

Problems Problems::word_problems(uint64_t seed, int max_steps, SyntheticSplit split) {
  Problems p;
  p.synthetic_ = Synthetic{Synthetic::Task::word_problems, seed, max_steps, split};
  return p;
}

int64_t Problems::size() const { return endless() ? INT64_MAX : int64_t(problems_.size()); }

const Problem& Problems::operator[](int64_t i) const { return problems_.at(size_t(i)); }

Problem Problems::draw(uint64_t seed, int64_t i) const {
  if (synthetic_) {
    const Synthetic& t = *synthetic_;
    return t.task == Synthetic::Task::arithmetic ? synthetic_problem(t.seed, t.level, t.split, uint64_t(i))
                                                 : word_problem(t.seed, t.level, t.split, uint64_t(i));
  }
  // Epoch e's order: a Fisher–Yates shuffle driven by Philox at (seed, e) — the same on every
  // machine, so a resumed run draws what the uninterrupted one would have.
  const int64_t n = size(), epoch = i / n;
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) order[size_t(k)] = k;
  for (int64_t k = n - 1; k > 0; --k) {
    const Philox4 r = philox_at(seed, uint64_t(epoch) + 1000003, uint64_t(k));
    std::swap(order[size_t(k)], order[size_t(r.v[0] % uint32_t(k + 1))]);
  }
  return problems_[size_t(order[size_t(i % n)])];
}

std::vector<Problem> Problems::head(int64_t n) const {
  const int64_t count = endless() ? n : (n <= 0 ? size() : std::min(n, size()));
  LOCKSTEP_CHECK(count > 0, "evaluation needs run.eval_problems > 0 with a generated task (\"synthetic\", "
                 "\"word-problems\")");
  std::vector<Problem> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(endless() ? draw(0, i) : problems_[size_t(i)]);
  return out;
}

namespace {

// The builtin model of the default job: Qwen3-style, widths multiples of 128 (the fp8 recipe's
// GEMM blocks) and head_dim 64 (the CUDA attention kernels'), tied embeddings over the synthetic
// task's 15 tokens.
ModelConfig builtin_config(const ModelOptions& m) {
  LOCKSTEP_CHECK(m.builtin_hidden > 0 && m.builtin_hidden % 128 == 0,
                 "model.builtin_hidden = ", m.builtin_hidden, ": must be a positive multiple of 128");
  LOCKSTEP_CHECK(m.builtin_layers > 0, "model.builtin_layers must be positive");
  ModelConfig c;
  c.family = ModelFamily::qwen3;
  c.hidden_size = m.builtin_hidden;
  c.intermediate_size = 3 * m.builtin_hidden;
  c.num_hidden_layers = m.builtin_layers;
  c.head_dim = 64;
  c.num_attention_heads = m.builtin_hidden / 64;
  c.num_key_value_heads = std::max<int64_t>(1, c.num_attention_heads / 2);
  c.vocab_size = kSyntheticVocabSize;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.eos_token_ids = {kSyntheticVocabSize - 1};
  return c;
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") {
    LOCKSTEP_CHECK(cuda_device_available(), "model.device = \"cuda\", but ",
                   built_with_cuda() ? "no GPU is visible" : "this build has no CUDA backend");
    return Device::cuda;
  }
  return cuda_device_available() ? Device::cuda : Device::cpu;
}

Problems load_set(const Config& c, const std::string& path, SyntheticSplit split) {
  if (path == "synthetic")
    return Problems::synthetic(uint64_t(c.run.seed), int(c.data.synthetic_level), split);
  if (path == "word-problems")
    return Problems::word_problems(uint64_t(c.run.seed), int(c.data.word_problem_steps), split);
  const DatasetFormat format = c.data.format == "gsm8k" ? DatasetFormat::gsm8k
                              : c.data.format == "jsonl" ? DatasetFormat::prompt_answer
                                                         : DatasetFormat::detect;
  const LoadedProblems loaded = load_problems(
      path, format, c.data.skip_bad_lines ? BadLines::skip : BadLines::fail);
  if (loaded.skipped_lines > 0)
    std::fprintf(stderr, "%s: skipped %zu bad lines\n", path.c_str(), loaded.skipped_lines);
  return Problems::loaded(loaded.problems);
}

// model.path must be a Hugging Face checkpoint folder: says which file it lacks, before any of them
// is read (the weights' file is checked where they are loaded: initial_parameters).
void check_model_folder(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string where = "model.path = " + path;
  LOCKSTEP_CHECK(fs::exists(path), where, ": no such folder (a Hugging Face checkpoint folder holds "
                 "config.json, tokenizer.json and model.safetensors)");
  LOCKSTEP_CHECK(fs::is_directory(path), where, ": a file, not a folder (a Hugging Face checkpoint "
                 "folder holds config.json, tokenizer.json and model.safetensors)");
  const fs::path dir = path;
  for (const char* file : {"config.json", "tokenizer.json"})
    LOCKSTEP_CHECK(fs::exists(dir / file), where, ": the folder has no ", file);
}

void check_model_weights(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = path;
  LOCKSTEP_CHECK(fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json"),
                 "model.path = ", path, ": the folder has no model.safetensors (nor model.safetensors.index.json)");
}

}  // namespace

Setup make_setup(const Config& config, bool need_data) {
  Setup s;
  s.config = config;
  s.device = resolve_device(config.model.device);
  // The whole process's forward kernels (ops/forward_kernels.h), before any forward runs.
  set_exact_forward(config.rollout.exact);
  const bool builtin = config.model.path == "builtin";
  if (builtin) {
    for (const auto& [key, value] : {std::pair{"data.train", &config.data.train}, {"data.test", &config.data.test}})
      LOCKSTEP_CHECK(!need_data || *value != "word-problems", key, " = \"word-problems\" is English text, which "
                     "model.path = \"builtin\" cannot read (its tokenizer knows only digits and + - * =): give a "
                     "Hugging Face model in model.path (e.g. scripts/get_model.sh smollm2-135m-instruct DIR)");
    LOCKSTEP_CHECK(!need_data || (config.data.train == "synthetic" && config.data.test == "synthetic"),
                   "model.path = \"builtin\" knows only the synthetic task's characters: set "
                   "data.train and data.test to \"synthetic\" (or give a Hugging Face model)");
    s.model_config = builtin_config(config.model);
    s.tokenizer_dir = std::filesystem::path(config.run.out_dir) / "tokenizer";
    write_synthetic_tokenizer(s.tokenizer_dir);
  } else {
    check_model_folder(config.model.path);
    s.model_config = load_model_config(config.model.path);
    s.tokenizer_dir = config.model.path;
  }
  LOCKSTEP_CHECK(!config.model.routing_replay || s.model_config.moe, "model.routing_replay = true, but ",
                 config.model.path, " is not a mixture-of-experts model (no router to replay)");
  s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(s.tokenizer_dir));
  const std::string& chat = config.data.chat_template;
  if (chat == "auto" || chat == "model") {
    if (std::optional<ChatTemplate> found = ChatTemplate::from_model_dir(s.tokenizer_dir))
      s.chat_template = std::make_shared<const ChatTemplate>(std::move(*found));
    else if (chat == "model")
      fail(s.tokenizer_dir.string() + ": data.chat_template = \"model\", but the checkpoint has no chat template "
           "(neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json)");
    else if (!builtin)
      std::fprintf(stderr, "the model has no chat template: prompts are the plain problem text (see data.chat_template)\n");
  }
  for (int64_t id : s.model_config.eos_token_ids) s.stop_token_ids.push_back(int32_t(id));
  if (const auto eos = s.tokenizer->eos_id();
      eos && std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), *eos) == s.stop_token_ids.end())
    s.stop_token_ids.push_back(*eos);
  LOCKSTEP_CHECK(!s.stop_token_ids.empty(), config.model.path,
                 ": neither config.json nor the tokenizer names an end-of-sequence token");
  if (need_data) {
    s.train = load_set(config, config.data.train, SyntheticSplit::train);
    s.test = load_set(config, config.data.test, SyntheticSplit::held_out);
  }
  return s;
}

std::vector<int32_t> Setup::prompt_tokens(const Problem& problem) const {
  std::optional<std::string_view> system;
  if (!config.data.system_prompt.empty()) system = config.data.system_prompt;
  if (chat_template)
    return chat_template->encode(*tokenizer, chat_messages(problem.prompt, system), /*add_generation_prompt=*/true,
                                 {{"enable_thinking", config.data.enable_thinking}});
  const std::string& t = config.data.chat_template;
  if (t == "none" || t == "auto")
    return tokenizer->encode(problem.prompt, /*add_special_tokens=*/config.model.path != "builtin");
  const ChatFormat format = t == "chatml"           ? ChatFormat::chatml
                            : t == "qwen3-no-think" ? ChatFormat::chatml_qwen3_no_think
                                                    : ChatFormat::llama3;
  return encode_chat(*tokenizer, format, problem.prompt, system);
}

std::string Setup::sft_target(const Problem& problem) const {
  if (config.data.train == "synthetic") return synthetic_sft_target(problem);
  const std::optional<int32_t> eos = tokenizer->eos_id();
  const std::string end = eos ? *tokenizer->id_to_token(*eos) : std::string();
  // The word problems come with a worked answer; datasets keep only the final answer, so there SFT
  // teaches the answer format ("#### N").
  if (!problem.solution.empty()) return problem.solution + end;
  return "#### " + problem.answer + end;
}

ModelParameters initial_parameters(const Setup& setup, const std::filesystem::path& checkpoint_model) {
  ModelParameters p;
  if (!checkpoint_model.empty() && is_sharded_checkpoint(checkpoint_model))
    p = load_sharded_masters(setup.model_config, checkpoint_model);
  else if (!checkpoint_model.empty())
    p = load_hf_parameters(setup.model_config, checkpoint_model.string());
  else if (setup.config.model.path == "builtin")
    p = ModelParameters::initialized(setup.model_config, uint64_t(setup.config.run.seed));
  else {
    check_model_weights(setup.config.model.path);
    p = load_hf_parameters(setup.model_config, setup.config.model.path);
    // Seeded by the run: the same masters on every rank and on a rerun.
    if (setup.config.model.dither_masters) dither_within_bf16_rounding(p, uint64_t(setup.config.run.seed));
  }
  return setup.device == Device::cpu ? p : p.copy_to(setup.device);
}

Policy::Policy(const Setup& setup, ModelParameters params) {
  const std::string& mode = setup.config.model.precision;
  const Recipe train_recipe = mode == "fp8" ? Recipe::fp8 : Recipe::bf16;
  // Both models round k and v as an fp8 KV cache does when the rollout uses one.
  const TransformerOptions options{.fp8_kv_cache = setup.config.model.kv_cache == "fp8"};
  // The rollout model shares the trainer's fp32 master tensors (Tensor copies share storage).
  if (mode == "fp8-rollout")
    rollout_ = std::make_unique<Transformer>(setup.model_config, params, Recipe::fp8, options);
  train_ = std::make_unique<Transformer>(setup.model_config, std::move(params), train_recipe, options);
  train_->set_recompute(setup.config.model.recompute);
  if (rollout_) rollout_->share_embedding_copies(*train_);
}

void Policy::release_masters() {
  train_->release_masters();
  if (rollout_) rollout_->release_masters();
}

WeightCopies Policy::copies(const std::string& name) {
  WeightCopies c = train_->weight_copies(name);
  if (rollout_) c.fp8 = rollout_->weight_copies(name).fp8;
  return c;
}

}  // namespace lockstep
