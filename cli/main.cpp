// cli/main.cpp — the `lockstep` command.
//
//   lockstep train    [CONFIG.toml] [--section.key=value ...]   GRPO (after sft.steps of SFT)
//   lockstep sft      [CONFIG.toml] [--section.key=value ...]   supervised fine-tuning only
//   lockstep eval     [CONFIG.toml] [--section.key=value ...]   held-out accuracy of a model
//   lockstep generate [CONFIG.toml] [--section.key=value ...]   complete generate.prompt
//   lockstep plot     [RUN_DIR]                                 RUN_DIR/metrics.png from its metrics
//   lockstep <subcommand> --help
//
// With no config file every key has its default: the built-in default job (a tiny model learning
// synthetic arithmetic, SFT then GRPO in the unified fp8 mode), in runs/default.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/config.h"
#include "core/error.h"
#include "rl/checkpoint.h"
#include "rl/eval.h"
#include "rl/plot.h"
#include "rl/setup.h"
#include "rl/train.h"
#include "rollout/engine.h"

using namespace lockstep;

namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: lockstep <train|sft|eval|generate|plot> [CONFIG.toml] [--section.key=value ...]\n"
    "       lockstep plot [RUN_DIR]\n"
    "       lockstep <subcommand> --help\n";

// The parameters to evaluate or generate with: the run's checkpoint when run.out_dir has one,
// otherwise the configured model.
ModelParameters serving_parameters(const Setup& setup) {
  const std::optional<SavedRun> saved = find_checkpoint(setup.config.run.out_dir);
  if (saved) std::printf("using the checkpoint in %s\n", saved->model.c_str());
  return initial_parameters(setup, saved ? saved->model : fs::path());
}

int eval(const Config& config) {
  const Setup setup = make_setup(config, /*need_data=*/true);
  Policy policy(setup, serving_parameters(setup));
  Engine engine(policy.rollout(), {.num_blocks = 4096, .block_size = config.rollout.block_size},
                setup.tokenizer.get());
  const EvalResult r = Evaluator(setup, engine).evaluate(config.run.eval_problems);
  std::printf("held-out accuracy on %lld problems: greedy %.4f, sampled (temperature %g) %.4f\n",
              (long long)r.problems, r.greedy, config.rollout.temperature, r.sampled);
  return 0;
}

int generate(const Config& config) {
  LOCKSTEP_CHECK(!config.generate.prompt.empty(), "generate.prompt is empty: give --generate.prompt=...");
  const Setup setup = make_setup(config, /*need_data=*/false);
  Policy policy(setup, serving_parameters(setup));
  Engine engine(policy.rollout(), {.num_blocks = 4096, .block_size = config.rollout.block_size},
                setup.tokenizer.get());
  GenerationRequest r;
  r.prompt = setup.prompt_tokens({config.generate.prompt, ""});
  r.sampling.n = config.generate.n;
  r.sampling.temperature = float(config.generate.temperature);
  r.sampling.max_new_tokens = config.generate.max_new_tokens;
  r.sampling.stop_token_ids = setup.stop_token_ids;
  r.sampling.seed = uint64_t(config.run.seed);
  const auto samples = engine.generate({r});
  for (const GeneratedSample& s : samples[0])
    std::printf("%s%s  [%s]\n", config.generate.prompt.c_str(),
                setup.tokenizer->decode(s.tokens, true).c_str(),
                std::string(finish_reason_name(s.finish_reason)).c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::printf("%s\n%s", kUsage, command == "plot" ? "" : config_help(command).c_str());
      return 0;
    }
  if (command == "plot") {
    LOCKSTEP_CHECK(args.size() <= 1, "plot takes one argument, the run folder");
    const fs::path dir = args.empty() ? fs::path(Config().run.out_dir) : fs::path(args[0]);
    plot_run(dir / "metrics.jsonl", dir / "metrics.png");
    std::printf("wrote %s\n", (dir / "metrics.png").c_str());
    return 0;
  }
  std::optional<fs::path> file;
  if (!args.empty() && !args[0].starts_with("--")) {
    file = args[0];
    args.erase(args.begin());
  }
  const Config config = load_config(file ? &*file : nullptr, args);
  if (command == "train" || command == "sft") {
    const TrainSummary s = command == "train" ? run_train(config) : run_sft(config);
    if (s.interrupted) {
      std::printf("interrupted: checkpoint saved in %s (continue with --run.resume=true)\n",
                  config.run.out_dir.c_str());
      return 130;
    }
    if (!std::isnan(s.sft_accuracy))
      std::printf("held-out accuracy (greedy) after SFT: %.4f\n", s.sft_accuracy);
    if (command == "train" && config.run.steps > 0) {
      std::printf("held-out accuracy (greedy) after %lld GRPO steps: %.4f\n",
                  (long long)config.run.steps, s.final_accuracy);
      plot_run(fs::path(config.run.out_dir) / "metrics.jsonl",
               fs::path(config.run.out_dir) / "metrics.png");
      std::printf("curves: %s\n", (fs::path(config.run.out_dir) / "metrics.png").c_str());
    }
    return 0;
  }
  if (command == "eval") return eval(config);
  if (command == "generate") return generate(config);
  std::fprintf(stderr, "lockstep: unknown subcommand '%s'\n%s", command.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
    return 1;
  }
}
