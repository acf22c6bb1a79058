// cli/config.cpp — the schema of the run configuration (one table: schema() below), and reading,
// checking, listing and writing the keys through it. toml++ is used header-only in this file alone,
// so the library needs no toml++ shared object at run time.
#include "cli/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <toml++/toml.h>
#include <type_traits>

#include "core/error.h"
#include "io/file_io.h"

namespace lockstep {

using detail::concat;

namespace {

// ---- TOML text of values ---------------------------------------------------------------------

// Shortest text that reads back as the same double, in TOML float syntax (toml++'s own printer
// writes 17 digits: 0.10000000000000001).
std::string toml_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, x).ptr;
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// A TOML basic string: quotes, backslashes and control characters escaped, other bytes as given.
std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string toml_text(bool v) { return v ? "true" : "false"; }
std::string toml_text(int64_t v) { return std::to_string(v); }
std::string toml_text(double v) { return toml_float(v); }
std::string toml_text(const std::string& v) { return toml_string(v); }
std::string toml_text(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + toml_string(v[i]);
  return out + "]";
}

// What a node is, for "got ...": its type and its value as TOML.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "string " + toml_string(**node.as_string());
    case toml::node_type::integer: return "integer " + toml_text(**node.as_integer());
    case toml::node_type::floating_point: return "float " + toml_float(**node.as_floating_point());
    case toml::node_type::boolean: return "boolean " + toml_text(**node.as_boolean());
    case toml::node_type::array: {
      std::string out = "array [";
      const toml::array& a = *node.as_array();
      for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + describe(a[i]);
      return out + "]";
    }
    default: return concat(node.type());  // table, date, time, date-time
  }
}

// ---- Types and rules -------------------------------------------------------------------------

template <class T>
struct TypeName;
template <>
struct TypeName<bool> {
  static constexpr const char *name = "boolean", *with_article = "a boolean";
};
template <>
struct TypeName<int64_t> {
  static constexpr const char *name = "integer", *with_article = "an integer";
};
template <>
struct TypeName<double> {
  static constexpr const char *name = "float", *with_article = "a float";
};
template <>
struct TypeName<std::string> {
  static constexpr const char *name = "string", *with_article = "a string";
};
template <>
struct TypeName<std::vector<std::string>> {
  static constexpr const char *name = "array of strings", *with_article = "an array of strings";
};

// The value of `node` as a T, or nothing when the node has another type. An integer is a float
// too (`lr = 1`), never the other way round.
template <class T>
std::optional<T> value_as(const toml::node& node) {
  if constexpr (std::is_same_v<T, double>) {
    if (const auto* i = node.as_integer()) return double(**i);
    return node.value_exact<double>();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    const toml::array* a = node.as_array();
    if (!a) return std::nullopt;
    T out;
    for (const toml::node& e : *a) {
      if (!e.is_string()) return std::nullopt;
      out.push_back(**e.as_string());
    }
    return out;
  } else {
    return node.value_exact<T>();
  }
}

// What a value must be beyond its type; `text` completes "must be ..." and the help's type column.
template <class T>
struct Rule {
  std::function<bool(const T&)> ok;
  std::string text;
};
// Integer keys are checked as doubles (exact for every value a key can sensibly hold), so one
// set of number rules serves both.
template <class T>
using RuleFor = Rule<std::conditional_t<std::is_same_v<T, int64_t>, double, T>>;

Rule<double> above(double lo) {
  return {[lo](double x) { return x > lo; }, "> " + concat(lo)};
}
Rule<double> at_least(double lo) {
  return {[lo](double x) { return x >= lo; }, "≥ " + concat(lo)};
}
Rule<double> in_closed(double lo, double hi) {
  return {[=](double x) { return x >= lo && x <= hi; }, concat("in [", lo, ", ", hi, "]")};
}
Rule<double> in_closed_open(double lo, double hi) {
  return {[=](double x) { return x >= lo && x < hi; }, concat("in [", lo, ", ", hi, ")")};
}
Rule<double> in_open_closed(double lo, double hi) {
  return {[=](double x) { return x > lo && x <= hi; }, concat("in (", lo, ", ", hi, "]")};
}
Rule<double> off_or_at_least(double lo) {
  return {[lo](double x) { return x == 0 || x >= lo; }, concat("0 (off) or ≥ ", lo)};
}
Rule<double> off_or_above(double lo) {
  return {[lo](double x) { return x == 0 || x > lo; }, concat("0 (off) or > ", lo)};
}
Rule<std::string> one_of(std::vector<std::string> allowed) {
  std::string text = "one of ";
  for (size_t i = 0; i < allowed.size(); ++i) text += (i ? ", " : "") + toml_string(allowed[i]);
  return {[allowed](const std::string& s) {
            return std::find(allowed.begin(), allowed.end(), s) != allowed.end();
          },
          text};
}
Rule<std::string> non_empty() {
  return {[](const std::string& s) { return !s.empty(); }, "non-empty"};
}
Rule<std::vector<std::string>> non_empty_strings() {
  return {[](const std::vector<std::string>& v) {
            return std::none_of(v.begin(), v.end(), [](const std::string& s) { return s.empty(); });
          },
          "non-empty strings"};
}

// ---- The schema ------------------------------------------------------------------------------

// One key of a struct `Owner`: a section struct while the schema is written, Config after.
template <class Owner>
struct Field {
  std::string name;  // "temperature", then "rollout.temperature"
  std::string type;  // "float, > 0": the help's type column
  std::string help;
  bool is_string;  // an unquoted command-line value is the string itself
  // Sets the key from a TOML value; a bad value throws Error("must be ..., got ...").
  std::function<void(Owner&, const toml::node&)> set;
  std::function<std::string(const Owner&)> get;  // the value as TOML text
};

template <class S, class T>
Field<S> field(std::string name, T S::*member, std::string help, RuleFor<T> rule = {}) {
  std::string type = TypeName<T>::name;
  if (rule.ok) type += ", " + rule.text;
  auto set = [member, rule](S& owner, const toml::node& node) {
    const std::optional<T> v = value_as<T>(node);
    if (!v) fail(concat("must be ", TypeName<T>::with_article, ", got ", describe(node)));
    if constexpr (std::is_same_v<T, double>) {
      if (!std::isfinite(*v)) fail("must be finite, got " + toml_text(*v));
    }
    if (rule.ok && !rule.ok(*v)) fail(concat("must be ", rule.text, ", got ", toml_text(*v)));
    owner.*member = *v;
  };
  auto get = [member](const S& owner) { return toml_text(owner.*member); };
  return {std::move(name), std::move(type), std::move(help), std::is_same_v<T, std::string>,
          std::move(set), std::move(get)};
}

struct Section {
  std::string name, help;
  std::vector<std::string_view> commands;  // the subcommands that read it
  std::vector<Field<Config>> keys;         // named "section.key"
};

template <class S>
Section section(std::string name, std::string help, std::vector<std::string_view> commands,
                S Config::*member, std::vector<Field<S>> fields) {
  Section s{name, std::move(help), std::move(commands), {}};
  for (Field<S>& f : fields) {
    auto set = [member, set_in = std::move(f.set)](Config& c, const toml::node& n) {
      set_in(c.*member, n);
    };
    auto get = [member, get_in = std::move(f.get)](const Config& c) { return get_in(c.*member); };
    s.keys.push_back({name + "." + f.name, std::move(f.type), std::move(f.help), f.is_string,
                      std::move(set), std::move(get)});
  }
  return s;
}

constexpr std::string_view kCommands[] = {"train", "sft", "eval", "generate", "export", "plot"};

// Every key: its name, struct member, description and rule. Adding a key is one line here (and
// its member in config.h).
const std::vector<Section>& schema() {
  using M = ModelOptions;
  using D = DataOptions;
  using R = RolloutOptions;
  using L = LossOptions;
  using O = OptimOptions;
  using F = SftOptions;
  using U = RunOptions;
  using G = GenerateOptions;
  using X = ExportOptions;
  static const std::vector<Section> sections = {
    section<M>("model", "the policy model", {"train", "sft", "eval", "generate", "export"}, &Config::model, {
      field("path", &M::path, "Hugging Face checkpoint folder, or \"builtin\"", non_empty()),
      field("precision", &M::precision, "numeric recipe (fp8-rollout: bf16 training, fp8 rollout)",
            one_of({"fp8", "bf16", "fp8-rollout"})),
      field("device", &M::device, "where to run (auto: cuda when a GPU is visible)",
            one_of({"auto", "cpu", "cuda"})),
      field("kv_cache", &M::kv_cache,
            "rollout KV cache dtype (fp8: half the memory; training rounds k and v the same way)",
            one_of({"bf16", "fp8"})),
      field("recompute", &M::recompute,
            "recompute activations and the LM-head logits in the backward, saving memory"),
      field("dither_masters", &M::dither_masters,
            "move a checkpoint's fp32 masters off the bf16 grid within their bf16 rounding (the bf16 "
            "model is unchanged): small first updates then change bf16 copies and fp8 ties alike"),
      field("routing_replay", &M::routing_replay,
            "mixture-of-experts models: the training forward and backward send each token to the "
            "experts the rollout chose (slime's rollout routing replay), weighted by the training "
            "router's probabilities of them; metric routing_disagreement then says how often the "
            "training router would have chosen others"),
      field("builtin_hidden", &M::builtin_hidden, "hidden size of the builtin model", at_least(1)),
      field("builtin_layers", &M::builtin_layers, "layers of the builtin model", at_least(1)),
    }),
    section<D>("data", "problems and prompts", {"train", "sft", "eval", "generate"}, &Config::data, {
      field("train", &D::train,
            "training problems: JSONL file, \"synthetic\" or \"word-problems\" (English: a Hugging Face model)",
            non_empty()),
      field("test", &D::test, "evaluation problems: JSONL file, \"synthetic\" or \"word-problems\"",
            non_empty()),
      field("format", &D::format, "JSONL layout (auto: from the first line: \"question\" is gsm8k, \"prompt\" jsonl)",
            one_of({"auto", "gsm8k", "jsonl"})),
      field("skip_bad_lines", &D::skip_bad_lines, "skip unreadable JSONL lines instead of failing"),
      field("synthetic_level", &D::synthetic_level, "difficulty of synthetic problems", at_least(1)),
      field("word_problem_steps", &D::word_problem_steps,
            "most arithmetic operations of a word problem (the count is uniform from 1)", in_closed(1, 3)),
      field("chat_template", &D::chat_template,
            "prompt format: auto = the checkpoint's own chat template, else the plain text; model = its "
            "template (an error without one); none = the plain text; or a format written out",
            one_of({"auto", "model", "none", "chatml", "qwen3-no-think", "llama3"})),
      field("system_prompt", &D::system_prompt, "system message of chat templates (empty: none)"),
      field("enable_thinking", &D::enable_thinking,
            "passed to the checkpoint's chat template (Qwen3: false closes an empty <think></think>)"),
    }),
    section<R>("rollout", "generation of the training batch", {"train", "eval"}, &Config::rollout, {
      field("prompts_per_step", &R::prompts_per_step, "prompts per step (B)", at_least(1)),
      field("samples_per_prompt", &R::samples_per_prompt, "samples of each prompt (G)", at_least(2)),
      field("temperature", &R::temperature, "sampling temperature", above(0)),
      field("top_p", &R::top_p, "nucleus sampling probability mass", in_open_closed(0, 1)),
      field("top_k", &R::top_k, "sample among the k most likely tokens (0: off)", at_least(0)),
      field("max_new_tokens", &R::max_new_tokens, "longest response, in tokens", at_least(1)),
      field("stop", &R::stop, "strings that end a response (besides end-of-sequence tokens)",
            non_empty_strings()),
      field("kv_cache_fraction", &R::kv_cache_fraction, "share of free GPU memory for the KV cache",
            in_open_closed(0, 1)),
      field("block_size", &R::block_size, "tokens per KV-cache block", at_least(1)),
      field("exact", &R::exact,
            "GPU: the rollout and the training forward run the same kernels in the same summation "
            "order (no cuDNN attention, decode rows in the training attention's key order, bf16 "
            "GEMMs without split-K, fp8 FProp batch-invariant), so the rollout's logprobs are the "
            "training forward's bit for bit and the old-logprob recompute is skipped "
            "(loss.reuse_rollout_logprobs defaults to true); slower decoding and fp8 training "
            "forward. The CPU is exact always. Not with model.precision = fp8-rollout"),
      field("exact_check_every", &R::exact_check_every,
            "with reused rollout logprobs (rollout.exact or loss.reuse_rollout_logprobs): the first "
            "step and every N-th after it recompute the old logprobs anyway, only to log "
            "mismatch_abs and mismatch_tokens_differ against the rollout's (0: never)",
            at_least(0)),
    }),
    section<L>("loss", "advantages and the policy loss", {"train"}, &Config::loss, {
      field("scale_rewards", &L::scale_rewards,
            "advantage A = (r - group mean) / (std + 1e-6): group = the group's std (GRPO), batch = "
            "one std over the step's groups (TRL scale_rewards=\"batch\"), none = no division "
            "(Dr.GRPO); stds divide by n - 1",
            one_of({"group", "batch", "none"})),
      field("clip_low", &L::clip_low,
            "PPO clip: for A < 0 the ratio R = pi/pi_old is clipped below at 1 - clip_low. With "
            "ppo_epochs = 1 and mini_batches = 1 (the defaults) R = 1 and no clip acts; only TIS does",
            in_closed_open(0, 1)),
      field("clip_high", &L::clip_high,
            "PPO clip: for A > 0, R is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)",
            at_least(0)),
      field("clip_ratio_c", &L::clip_ratio_c,
            "dual-clip PPO (verl's clip_ratio_c): for A < 0 the loss stops growing at R > c, "
            "-A*c; the log-ratio is clamped to +-20 before exp either way",
            off_or_above(1)),
      field("aggregation", &L::aggregation,
            "how token losses become the loss: token-mean = sum / response tokens of the "
            "mini-batch; sequence-mean = mean over sequences of each one's token mean; "
            "sequence-mean-token-sum = mean over sequences of token sums (verl); token-sum-norm = "
            "sum / (sequences x rollout.max_new_tokens) (Dr.GRPO's constant length, TRL dr_grpo)",
            one_of({"token-mean", "sequence-mean", "sequence-mean-token-sum", "token-sum-norm"})),
      field("kl_coef", &L::kl_coef,
            "weight of the KL penalty to a frozen copy of the policy as RL starts (0: none, and no "
            "reference model)", at_least(0)),
      field("kl_estimator", &L::kl_estimator,
            "KL(pi || ref) per token: k1 = log pi - log ref, k3 = exp(ref - pi) - (ref - pi) - 1 (logs)",
            one_of({"k1", "k3"})),
      field("tis_cap", &L::tis_cap,
            "truncated importance sampling (0: off): the policy loss is weighted by min(exp(old - "
            "rollout), tis_cap), old and rollout being the training forward's and the rollout's "
            "logprobs; acts in every precision mode (the weight is 1 where they agree, e.g. fp8 on "
            "the CPU); metric tis_clip_frac = share of tokens capped",
            off_or_at_least(1)),
      field("adaptive_clip", &L::adaptive_clip,
            "QuRL's adaptive clipping range (needs tis_cap): where exp(old - rollout) = rho > tis_cap, "
            "the upper clip becomes (1 + clip_high) * rho / tis_cap"),
      field("dynamic_sampling", &L::dynamic_sampling,
            "DAPO: drop groups whose rewards are all equal and roll out further batches of "
            "prompts_per_step prompts until prompts_per_step groups differ (metrics groups_kept, "
            "rollout_batches)"),
      field("dynamic_sampling_max_draws", &L::dynamic_sampling_max_draws,
            "most rollout batches per step with dynamic_sampling; when they run out the step "
            "trains on the groups found (none: no update)", at_least(1)),
      field("overlong_buffer", &L::overlong_buffer,
            "DAPO's overlong penalty (0: off): a response of L tokens gets reward - penalty * "
            "min(1, (L - (max_new_tokens - overlong_buffer)) / overlong_buffer) when positive",
            at_least(0)),
      field("overlong_penalty", &L::overlong_penalty,
            "the overlong penalty's full size (at max_new_tokens tokens)", at_least(0)),
      field("reuse_rollout_logprobs", &L::reuse_rollout_logprobs,
            "old logprobs from the rollout engine instead of a training-forward recompute (then "
            "tis_cap cannot act: old = rollout)"),
      field("router_aux_loss_coef", &L::router_aux_loss_coef,
            "mixture-of-experts models: weight of the load-balancing loss (transformers' "
            "load_balancing_loss_func) added to each mini-batch's loss; -1 = the model's config.json "
            "(router_aux_loss_coef when output_router_logits is true, else 0); metric "
            "router_aux_loss",
            Rule<double>{[](double x) { return x == -1 || x >= 0; }, "-1 (the model's) or ≥ 0"}),
      field("router_z_coef", &L::router_z_coef,
            "mixture-of-experts models: weight of ST-MoE's router z-loss, the mean over every sparse "
            "layer's tokens of logsumexp(router logits)^2, added to each mini-batch's loss (0: off); "
            "metric router_z_loss when on",
            at_least(0)),
    }),
    section<O>("optim", "AdamW and the learning-rate schedule", {"train", "sft"}, &Config::optim, {
      field("lr", &O::lr, "peak learning rate of RL", above(0)),
      field("min_lr", &O::min_lr,
            "the cosine's floor: lr = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2", at_least(0)),
      field("schedule", &O::schedule,
            "learning rate after the warm-up, as HF's schedules under torch's LambdaLR: cosine "
            "p runs over the RL phase's optimizer steps (run.steps x ppo_epochs x mini_batches), "
            "the last step above min_lr",
            one_of({"constant", "cosine"})),
      field("warmup_steps", &O::warmup_steps,
            "optimizer steps (not RL steps) of linear warm-up: step k (from 1) at lr * (k - 1) / "
            "warmup_steps, so the first at 0", at_least(0)),
      field("weight_decay", &O::weight_decay, "decoupled weight decay", at_least(0)),
      field("beta1", &O::beta1, "first-moment decay", in_closed_open(0, 1)),
      field("beta2", &O::beta2, "second-moment decay", in_closed_open(0, 1)),
      field("eps", &O::eps, "added to the root of the second moment", above(0)),
      field("max_grad_norm", &O::max_grad_norm, "global gradient-norm clip (0: off)", at_least(0)),
      field("ppo_epochs", &O::ppo_epochs,
            "passes over each rollout batch (> 1: the ratio to the old policy moves and clips act)",
            at_least(1)),
      field("mini_batches", &O::mini_batches,
            "optimizer steps per pass, over consecutive slices of the batch's sequences (at most "
            "one per sequence)", at_least(1)),
      field("micro_batch_tokens", &O::micro_batch_tokens, "most tokens in one forward/backward",
            at_least(1)),
      field("shard_state", &O::shard_state,
            "with several ranks, each keeps the fp32 masters, AdamW moments and gradients of its "
            "own rows only (gradients reduce-scattered layer by layer in the backward, the updated "
            "bf16/fp8 weight copies all-gathered, sharded checkpoints); false: every rank keeps "
            "the whole state"),
      field("reduce_per_layer", &O::reduce_per_layer,
            "with optim.shard_state and several ranks: each micro-batch's backward reduce-scatters "
            "each layer's gradients as soon as it has them (one layer's f32 gradients held, the "
            "whole gradient sent once per micro-batch, beside the backward); false: the whole "
            "local f32 gradient is summed over a mini-batch's micro-batches and reduce-scattered "
            "once per optimizer step (4 more bytes per parameter, 1/k of the traffic with k "
            "micro-batches)"),
      field("shard_weights", &O::shard_weights,
            "with optim.shard_state and several ranks, also the bf16/fp8 "
            "weight copies the GEMMs read (ZeRO-3): between uses each rank keeps its own rows of every layer matrix; each "
            "layer's whole copies are all-gathered before its forward and backward (the next "
            "layer's beside the compute) and freed after, and the rollout's are gathered once "
            "before generation and freed after it (the embedding, LM head and norms stay whole; "
            "a separate fp8 rollout model keeps its whole copies)"),
      field("expert_parallel", &O::expert_parallel,
            "sparse models, with optim.shard_state and several ranks: rank r of N owns experts "
            "[r·E/N, (r+1)·E/N) of every sparse layer whole (their masters, moments, gradients "
            "and weight copies) and runs them in training on every rank's tokens, which an "
            "all-to-all sends to it and brings back (the router stays replicated); with "
            "optim.shard_weights no layer gathers the experts' copies (only the rollout's "
            "hand-over does); E must be a multiple of N"),
    }),
    section<F>("sft", "supervised fine-tuning", {"train", "sft"}, &Config::sft, {
      field("steps", &F::steps, "SFT optimizer steps (`train` runs them before RL; 0: none)", at_least(0)),
      field("lr", &F::lr, "peak learning rate", above(0)),
      field("batch_size", &F::batch_size, "sequences per step", at_least(1)),
      field("warmup_steps", &F::warmup_steps,
            "SFT steps (one optimizer step each) of linear warm-up, as optim.warmup_steps: the "
            "first at lr 0", at_least(0)),
    }),
    section<U>("run", "length, seed and outputs", {"train", "sft", "eval", "generate", "export", "plot"},
               &Config::run, {
      field("steps", &U::steps, "GRPO steps (0: none)", at_least(0)),
      field("seed", &U::seed, "seed of every random choice", at_least(0)),
      field("out_dir", &U::out_dir, "folder of metrics, checkpoints and this config", non_empty()),
      field("eval_every", &U::eval_every, "evaluate every this many steps (0: off)", at_least(0)),
      field("eval_problems", &U::eval_problems, "test problems per evaluation (0: all)", at_least(0)),
      field("checkpoint_every", &U::checkpoint_every,
            "steps between checkpoints (0: at the end only; -1: never, for timing runs)", at_least(-1)),
      field("resume", &U::resume, "continue from the latest checkpoint in out_dir"),
      field("max_skipped_steps", &U::max_skipped_steps, "consecutive non-finite steps tolerated",
            at_least(0)),
      field("log_every", &U::log_every,
            "a console line every this many steps, besides evaluations (0: only at evaluations, "
            "or every twentieth of a phase without them)", at_least(0)),
      field("mismatch_bin_tokens", &U::mismatch_bin_tokens,
            "response positions per bin of the train/rollout mismatch by position (metrics.jsonl)",
            at_least(1)),
    }),
    section<G>("generate", "text generation from one prompt", {"generate"}, &Config::generate, {
      field("prompt", &G::prompt, "the user message (the chat template applies)"),
      field("max_new_tokens", &G::max_new_tokens, "longest response, in tokens", at_least(1)),
      field("temperature", &G::temperature, "sampling temperature (0: greedy)", at_least(0)),
      field("n", &G::n, "responses to generate", at_least(1)),
    }),
    section<X>("export", "a Hugging Face checkpoint to serve", {"export"}, &Config::export_, {
      field("out", &X::out, "the folder to write (empty: run.out_dir/export)"),
      field("format", &X::format,
            "fp8: block-FP8 as Qwen3-8B-FP8 (E4M3 weights, fp32 scale per 128x128 block; the "
            "fp8 recipe's own bytes), bf16: plain bf16", one_of({"fp8", "bf16"})),
    }),
  };
  return sections;
}

// ---- Lookup with suggestions -----------------------------------------------------------------

const Section* find_section(std::string_view name) {
  for (const Section& s : schema())
    if (s.name == name) return &s;
  return nullptr;
}

const Field<Config>* find_key(std::string_view name) {
  for (const Section& s : schema())
    for (const Field<Config>& k : s.keys)
      if (k.name == name) return &k;
  return nullptr;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string_view after_dot(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

// " (did you mean a or b?)" for the known keys closest to `name`, or "" when none is close: a key
// of that name in another section, else the keys at the smallest edit distance, where a wrong
// section costs 2 on top of the key's own distance.
std::string suggest_key(std::string_view name) {
  std::vector<std::string_view> best;
  size_t best_distance = 3;  // the farthest a suggestion may be
  for (const Section& s : schema()) {
    for (const Field<Config>& k : s.keys) {
      const size_t d = std::min(edit_distance(name, k.name),
                                edit_distance(after_dot(name), after_dot(k.name)) + 2);
      if (d < best_distance) best.clear(), best_distance = d;
      if (d == best_distance) best.push_back(k.name);
    }
  }
  if (best.empty()) return "";
  std::string out = " (did you mean ";
  for (size_t i = 0; i < best.size(); ++i) out += concat(i ? " or " : "", best[i]);
  return out + "?)";
}

std::string suggest_section(std::string_view name) {
  for (const Section& s : schema())
    if (edit_distance(name, s.name) <= 2) return " (did you mean [" + s.name + "]?)";
  return "";
}

// ---- Reading ---------------------------------------------------------------------------------

// `where` names the source for messages: "run.toml:12" or "option --rollout.top_p". The key's
// name goes into `given`.
void set_key(Config& config, std::string_view name, const toml::node& node,
             const std::string& where, std::set<std::string>& given) {
  const Field<Config>* key = find_key(name);
  if (!key) {
    if (find_section(name))
      fail(concat(where, ": [", name, "] must be a table of keys, got ", describe(node)));
    fail(concat(where, ": unknown key ", name, suggest_key(name)));
  }
  try {
    key->set(config, node);
  } catch (const Error& e) {
    fail(concat(where, ": ", name, " ", e.what()));
  }
  given.insert(key->name);
}

// toml++ 3.3 (Debian 12's) reaches __builtin_unreachable, undefined behaviour, when it asks whether
// a character of U+00A1–U+0499, U+2D6E–U+3167 or U+FB16–U+FEFE is whitespace (its
// is_non_ascii_horizontal_whitespace; found by tests/fuzz/fuzz_cli_config.cpp). It asks that of a
// character outside a string or comment (a quote inside a bare value opens no string), and of the
// first one after a line-ending backslash in a """ string. TOML allows non-ASCII characters only
// inside strings and comments, so this refuses any outside them, and the rare one right after a
// line-ending backslash, before toml++ sees the text. `where` names the text ("file.toml",
// "option --key").
void check_non_ascii_placement(std::string_view text, const std::string& where) {
  size_t line = 1, line_start = 0;
  const auto refuse = [&](size_t i, const char* what) {
    fail(concat(where, ":", line, ":", i - line_start + 1, ": TOML syntax error: a non-ASCII character ",
                what));
  };
  const auto newline = [&](size_t i) {
    ++line;
    line_start = i + 1;
  };
  // toml++ scans a bare value (number, date, true, inf…) up to a blank, `,` `]` `}` `#` or the line's
  // end, asking is_whitespace of every character, a quote included: `v = -"é"` and `v = 1.["é"]` are
  // one bare value to it. So a quote opens a string only outside a bare value, at the start of a line
  // or after = [ { , or a dotted key's `.`; elsewhere what follows it counts as outside a string.
  std::string brackets;        // open '[' arrays, '{' inline tables, 'h' table headers, innermost last
  bool value_next = false;     // a value, not a key, starts at the next character that is not blank
  bool in_bare_value = false;  // inside a bare value
  char last = '\0';            // the last character on this line outside strings, comments and blanks
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const bool blank = c == ' ' || c == '\t' || c == '\r';
    if (c == '\n' || c == '#' || blank || c == ',' || c == ']' || c == '}') in_bare_value = false;
    const bool opens_string =
        !in_bare_value && (c == '"' || c == '\'') && (last == '\0' || std::strchr("=[{,.", last));
    if (c == '\n') {
      newline(i++);
      last = '\0';
      while (!brackets.empty() && brackets.back() != '[') brackets.pop_back();  // only arrays span lines
      value_next = !brackets.empty();
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (blank) {
      ++i;
    } else if (opens_string) {
      last = c;
      value_next = false;
      const bool basic = c == '"';
      const bool multi_line = text.substr(i, 3) == std::string(3, c);
      i += multi_line ? 3 : 1;
      while (i < text.size()) {
        if (text[i] == c && (!multi_line || text.substr(i, 3) == std::string(3, c))) {
          i += multi_line ? 3 : 1;
          // A """ string may end in one or two quotes of its own: """a""""" is 'a""'.
          for (int extra = 0; multi_line && extra < 2 && i < text.size() && text[i] == c; ++extra) ++i;
          break;
        }
        if (text[i] == '\n') {
          if (!multi_line) break;  // an unterminated string: toml++ says so
          newline(i);
        } else if (basic && text[i] == '\\') {
          size_t j = i + 1;
          while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) {
            if (text[j] == '\n') newline(j);
            ++j;
          }
          if (multi_line && j > i + 1 && j < text.size() && static_cast<unsigned char>(text[j]) >= 0x80)
            refuse(j, "right after a line-ending backslash is not supported here (toml++ 3.3)");
          i = j > i + 1 ? j : i + 2;  // an escape: the escaped character cannot end the string
          continue;
        }
        ++i;
      }
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      refuse(i, "outside a string or comment (TOML allows them only there)");
    } else {
      if (!in_bare_value) {
        if (c == '=') {
          value_next = true;
        } else if (c == '[') {
          brackets += value_next ? '[' : 'h';
        } else if (c == '{') {
          brackets += '{';
          value_next = false;
        } else if (c == ',') {
          value_next = !brackets.empty() && brackets.back() == '[';
        } else if (c == ']' || c == '}') {
          if (!brackets.empty()) brackets.pop_back();
          value_next = false;
        } else if (value_next) {
          in_bare_value = true;
          value_next = false;
        }
      }
      last = c;
      ++i;
    }
  }
}

void apply_file(Config& config, const std::filesystem::path& file, std::set<std::string>& given) {
  const std::string path = file.string();
  const std::string text = read_file(path, "config");
  check_non_ascii_placement(text, path);
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    fail(concat(path, ":", e.source().begin.line, ":", e.source().begin.column,
                ": TOML syntax error: ", e.description()));
  }
  const auto where = [&](const toml::key& k) { return concat(path, ":", k.source().begin.line); };
  for (auto&& [name, node] : root) {
    const toml::table* table = node.as_table();
    if (!table) {
      set_key(config, name.str(), node, where(name), given);
      continue;
    }
    // The keys of an unknown section are unknown keys, each with its suggestion; only an empty
    // unknown section needs its own message.
    if (table->empty() && !find_section(name.str()))
      fail(concat(where(name), ": unknown section [", name.str(), "]",
                  suggest_section(name.str())));
    for (auto&& [key, value] : *table)
      set_key(config, concat(name.str(), ".", key.str()), value, where(key), given);
  }
}

// `--section.key=value` or `--section.key value`; the value is parsed as TOML (see config.h).
void apply_overrides(Config& config, std::span<const std::string> args, std::set<std::string>& given) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!arg.starts_with("--") || arg.size() == 2)
      fail(concat("unexpected argument '", arg, "': expected an option --section.key=value"));
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string where = "option --" + name;
    const Field<Config>* key = find_key(name);
    if (!key) fail(concat(where, ": unknown key ", name, suggest_key(name)));
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 == args.size())
        fail(concat(where, ": needs a value (--", name, "=VALUE or --", name, " VALUE)"));
      value = args[++i];
    }
    const bool bare = key->is_string && !value.starts_with('"') && !value.starts_with('\'');
    const std::string line = "v = " + (bare ? toml_string(value) : value);
    check_non_ascii_placement(line, where);
    toml::table parsed;
    try {
      parsed = toml::parse(line, std::string_view(where));
    } catch (const toml::parse_error& e) {
      fail(concat(where, ": ", name, " expects ", key->type, ", got '", value,
                  "', which is not a TOML value (", e.description(), ")"));
    }
    if (parsed.size() != 1)
      fail(concat(where, ": ", name, " must be one TOML value, got '", value, "'"));
    set_key(config, name, *parsed.get("v"), where, given);
  }
}

// Keys that constrain each other, once every source is in.
void check_consistency(const Config& c) {
  LOCKSTEP_CHECK(c.optim.min_lr <= c.optim.lr, "config: optim.min_lr (", toml_float(c.optim.min_lr),
                 ") must be ≤ optim.lr (", toml_float(c.optim.lr), ")");
  LOCKSTEP_CHECK(!c.loss.adaptive_clip || c.loss.tis_cap > 0,
                 "config: loss.adaptive_clip = true needs truncated importance sampling: "
                 "loss.tis_cap ≥ 1 (got 0)");
  LOCKSTEP_CHECK(c.loss.tis_cap == 0 || !c.loss.reuse_rollout_logprobs,
                 "config: loss.tis_cap = ", toml_float(c.loss.tis_cap),
                 " cannot act with loss.reuse_rollout_logprobs = true", c.rollout.exact ? " (rollout.exact's default)" : "",
                 ": the old logprobs are then the rollout's, so the weight exp(old - rollout) is 1 "
                 "everywhere; turn one off");
  LOCKSTEP_CHECK(!c.rollout.exact || c.model.precision != "fp8-rollout",
                 "config: rollout.exact = true cannot hold with model.precision = \"fp8-rollout\": its "
                 "rollout runs fp8 GEMMs and its training forward bf16 ones, so their logprobs differ "
                 "by construction; choose model.precision = \"bf16\" or \"fp8\" (one recipe for both), "
                 "or rollout.exact = false");
  LOCKSTEP_CHECK(c.loss.overlong_buffer <= c.rollout.max_new_tokens, "config: loss.overlong_buffer (",
                 c.loss.overlong_buffer, ") must be ≤ rollout.max_new_tokens (",
                 c.rollout.max_new_tokens, ")");
}

}  // namespace

Config load_config(const std::filesystem::path* file, std::span<const std::string> overrides) {
  Config config;
  std::set<std::string> given;  // the keys a source set
  if (file) apply_file(config, *file, given);
  apply_overrides(config, overrides, given);
  // Exact rollout logprobs are the old policy's: no recompute, unless asked for.
  if (config.rollout.exact && !given.contains("loss.reuse_rollout_logprobs"))
    config.loss.reuse_rollout_logprobs = true;
  check_consistency(config);
  return config;
}

// ---- Writing ---------------------------------------------------------------------------------

namespace {

// "key = value" padded to a column (long values overflow it), then `comment`.
void append_commented(std::string& out, const std::string& line, std::string_view comment) {
  constexpr size_t kColumn = 40;
  out += line;
  out.append(line.size() < kColumn ? kColumn - line.size() : 1, ' ');
  out += comment;
  out += '\n';
}

// Columns of UTF-8 text: its code points (no wide characters appear in the help).
size_t columns(std::string_view s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// `text` as lines of at most `width` columns, each after `indent`, broken at spaces.
std::string wrapped(std::string_view text, std::string_view indent, size_t width) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (!line.empty() && columns(indent) + columns(line) + 1 + columns(word) > width) {
      out += concat(indent, line, "\n");
      line.clear();
    }
    line += concat(line.empty() ? "" : " ", word);
    start = end + 1;
  }
  if (!line.empty()) out += concat(indent, line, "\n");
  return out;
}

}  // namespace

std::string config_help(std::string_view subcommand) {
  const bool all = subcommand.empty();
  if (!all && std::ranges::find(kCommands, subcommand) == std::end(kCommands)) {
    std::string known;
    for (std::string_view c : kCommands) known += concat(known.empty() ? "" : ", ", c);
    fail(concat("config_help: unknown subcommand '", subcommand, "' (known: ", known, ")"));
  }
  const Config defaults;
  std::string out = concat(
      "Configuration", all ? "" : concat(" of `lockstep ", subcommand, "`"),
      ": keys under [section] in the TOML config file, or on the command line as\n"
      "--section.key=value or --section.key value (a TOML value; strings may be unquoted). The\n"
      "command line wins over the file, the file over the defaults.\n"
      "Each key: name = default, its type, then what it does.\n");
  for (const Section& s : schema()) {
    if (!all && std::ranges::find(s.commands, subcommand) == s.commands.end()) continue;
    out += concat("\n[", s.name, "]  ", s.help, "\n");
    for (const Field<Config>& k : s.keys) {
      append_commented(out, concat("  ", after_dot(k.name), " = ", k.get(defaults)), k.type);
      out += wrapped(k.help, "      ", 100);
    }
  }
  return out;
}

std::string to_toml(const Config& config) {
  std::string out = "# lockstep configuration: every key, as resolved for this run\n";
  for (const Section& s : schema()) {
    out += concat("\n[", s.name, "]  # ", s.help, "\n");
    for (const Field<Config>& k : s.keys)
      append_commented(out, concat(after_dot(k.name), " = ", k.get(config)), "# " + k.help);
  }
  return out;
}

}  // namespace lockstep
