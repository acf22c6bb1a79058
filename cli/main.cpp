// cli/main.cpp — the `lockstep` command.
//
//   lockstep train    [CONFIG.toml] [--section.key=value ...]   GRPO (after sft.steps of SFT)
//   lockstep sft      [CONFIG.toml] [--section.key=value ...]   supervised fine-tuning only
//   lockstep eval     [CONFIG.toml] [--section.key=value ...]   held-out accuracy of a model
//   lockstep generate [CONFIG.toml] [--section.key=value ...]   complete generate.prompt
//   lockstep export   [CONFIG.toml] [--section.key=value ...]   the model as a checkpoint to serve
//   lockstep plot     [RUN_DIR] [PLOT OPTIONS]                  RUN_DIR/metrics.png from its metrics
//   lockstep plot --compare RUN_DIR... [PLOT OPTIONS]           several runs overlaid in one PNG
//   lockstep help [SUBCOMMAND], lockstep --help, lockstep <subcommand> --help
//   lockstep <subcommand> [CONFIG.toml] [--section.key=value ...] --check
//                                  the configuration checked and printed as TOML; nothing runs
//   lockstep train|sft --gpus N ...                             N data-parallel ranks on this host
//                                  (through mpirun: dist/launch.h; `mpirun -np N lockstep train`
//                                  does the same by hand)
//
// With no config file every key has its default: the built-in default job (a tiny model learning
// synthetic arithmetic, SFT then GRPO in the unified fp8 mode), in runs/default.
//
// Exit status: 0 done, 1 an error (one message on stderr), 2 a usage error, 130 interrupted by
// SIGINT (a checkpoint was saved). With several ranks, rank 0 prints the progress and writes
// run.out_dir; an error on any rank is printed with its rank ("[rank 1] lockstep: ...") and ends
// every rank (mpirun reports which one failed).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/config.h"
#include "core/error.h"
#include "dist/launch.h"
#include "dist/world.h"
#include "model/hf_checkpoint.h"
#include "rl/checkpoint.h"
#include "rl/console.h"
#include "rl/eval.h"
#include "rl/plot.h"
#include "rl/setup.h"
#include "rl/train.h"
#include "rollout/engine.h"
#include "tasks/synthetic.h"

using namespace lockstep;

namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: lockstep <train|sft|eval|generate|export> [CONFIG.toml] [--section.key=value ...]\n"
    "       lockstep plot [RUN_DIR] [--out=PNG] [--labels=NAME] [--steps=A:B] [--bin-tokens=N]\n"
    "       lockstep plot --compare RUN_DIR... [--out=PNG] [--labels=N1,N2,...] [--steps=A:B]\n"
    "                     [--bin-tokens=N]\n"
    "       lockstep <train|sft|eval|generate|export> [CONFIG.toml] [--section.key=value ...] --check\n"
    "       lockstep <subcommand> --help     (or: lockstep help <subcommand>)\n";

constexpr const char* kSubcommands =
    "\nsubcommands:\n"
    "  train      SFT warm start (sft.steps), then GRPO (run.steps); writes run.out_dir\n"
    "  sft        supervised fine-tuning only\n"
    "  eval       held-out pass@1 (greedy and sampled) of model.path, or of the checkpoint in\n"
    "             run.out_dir when model.path is \"builtin\"\n"
    "  generate   complete --generate.prompt=... with the same model\n"
    "  export     write the same model as a Hugging Face checkpoint to serve: block-FP8 (the fp8\n"
    "             recipe's own E4M3 weights, as Qwen3-8B-FP8) or bf16, in export.out\n"
    "  plot       draw a run's curves (RUN_DIR/metrics.png), or overlay runs (--compare)\n"
    "\nWith no config file and no options, `lockstep train` runs the built-in default job.\n"
    "--check reads and checks the configuration (every key, type and range), prints it as TOML\n"
    "with every key resolved, and exits; model and data files are opened only by a run.\n";

constexpr const char* kPlotHelp =
    "\nlockstep plot [RUN_DIR]: RUN_DIR/metrics.png from RUN_DIR/metrics.jsonl and\n"
    "sft_metrics.jsonl (RUN_DIR defaults to runs/default).\n"
    "lockstep plot --compare RUN_DIR...: the runs overlaid, one colour per run, with a legend\n"
    "naming each by its folder; written to compare.png in the first run's parent folder.\n"
    "A metrics file (e.g. docs/results/*.jsonl) may stand for a run folder: it is read as the\n"
    "run's metrics.jsonl, named by its file name, and plotted to the same name with .png.\n"
    "Options (both forms):\n"
    "  --out=PNG         the picture's path instead\n"
    "  --labels=A,B,...  the runs' names in the legend, one per run folder, in order\n"
    "  --steps=A:B       the GRPO steps the mismatch-by-position panel averages over (A: or :B\n"
    "                    leave an end open; default: every step)\n"
    "  --bin-tokens=N    response positions per mismatch bin (default: each run folder's\n"
    "                    config.toml run.mismatch_bin_tokens, else 256)\n";

constexpr std::string_view kCommands[] = {"train", "sft", "eval", "generate", "export", "plot"};

constexpr const char* kRanksHelp =
    "\n--gpus N (train, sft): N data-parallel ranks on this host, one per GPU (or, with\n"
    "--model.device=cpu, N CPU ranks), started through mpirun; rollout.prompts_per_step must divide\n"
    "by N. The same as `mpirun -np N lockstep train ...`, which also spans hosts.\n";

// This process's ranks (train and sft); read by main's error path.
std::unique_ptr<Communicator> g_world;

bool is_help(std::string_view a) { return a == "--help" || a == "-h" || a == "help"; }

int help(const std::string& command) {
  if (command.empty()) {
    std::printf("%s%s", kUsage, kSubcommands);
    return 0;
  }
  if (std::ranges::find(kCommands, command) == std::end(kCommands)) {
    std::fprintf(stderr, "lockstep: unknown subcommand '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  std::printf("%s\n%s", kUsage, command == "plot" ? kPlotHelp : config_help(command).c_str());
  if (command == "train" || command == "sft") std::printf("%s", kRanksHelp);
  return 0;
}

// The model to evaluate or generate with, and where its weights come from. model.path wins when it
// names a model; with model.path = "builtin" (the default job's tiny model, which has no weights of
// its own), the checkpoint in run.out_dir when there is one.
struct Served {
  Setup setup;
  fs::path checkpoint;  // empty: the configured model
  std::string source;   // for the console
  std::string note;     // a line after the first, or empty
};

Served serving_setup(const Config& config, bool need_data) {
  const std::optional<SavedRun> saved = find_checkpoint(config.run.out_dir);
  if (config.model.path != "builtin" || !saved) {
    Served s{make_setup(config, need_data), {}, config.model.path, ""};
    if (config.model.path == "builtin") {
      s.source = "builtin, untrained";
      s.note = "no checkpoint in " + config.run.out_dir + ": the builtin model is its seeded initialization";
    }
    return s;
  }
  // The checkpoint is a Hugging Face folder with its tokenizer: served as such.
  Config c = config;
  c.model.path = saved->model.string();
  Served s{make_setup(c, need_data), saved->model, saved->model.string(), ""};
  s.setup.config.model.path = config.model.path;  // prompts are made as for the builtin model
  return s;
}

int eval(const Config& config) {
  const Served served = serving_setup(config, /*need_data=*/true);
  const Setup& setup = served.setup;
  std::printf("%s\n", run_header("eval", setup, served.source, "").c_str());
  if (!served.note.empty()) std::printf("%s\n", served.note.c_str());
  std::fflush(stdout);  // before the first step, in a log too
  Policy policy(setup, initial_parameters(setup, served.checkpoint));
  Engine engine(policy.rollout(), {.num_blocks = 4096, .block_size = config.rollout.block_size},
                setup.tokenizer.get());
  Evaluator evaluator(setup, engine);
  const int64_t problems = evaluator.count(config.run.eval_problems);
  EvalResult r;
  {
    // Every problem twice: greedy, then sampled; a line after each chunk of problems.
    Progress progress("eval", 2 * problems, 0);
    progress.update(0, {"greedy, then sampled"}, /*now=*/true);
    r = evaluator.evaluate(config.run.eval_problems,
                           [&](int64_t done, int64_t) { progress.line(done, {}); });
  }
  std::printf("held-out accuracy on %lld problems: greedy %.4f, sampled (temperature %g) %.4f\n",
              (long long)r.problems, r.greedy, config.rollout.temperature, r.sampled);
  return 0;
}

int generate(const Config& config) {
  LOCKSTEP_CHECK(!config.generate.prompt.empty(), "generate.prompt is empty: give --generate.prompt=...");
  const Served served = serving_setup(config, /*need_data=*/false);
  const Setup& setup = served.setup;
  if (setup.model_config.vocab_size == kSyntheticVocabSize)
    check_synthetic_text(config.generate.prompt, "generate.prompt");
  std::printf("%s\n", run_header("generate", setup, served.source, "").c_str());
  if (!served.note.empty()) std::printf("%s\n", served.note.c_str());
  std::fflush(stdout);  // before the first step, in a log too
  Policy policy(setup, initial_parameters(setup, served.checkpoint));
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

// "k_proj, v_proj" for the layers' tensors named in `names`: the module kinds, each once.
std::string module_kinds(const std::vector<std::string>& names) {
  std::vector<std::string> kinds;
  for (const std::string& name : names) {
    const std::string stem = name.substr(0, name.rfind(".weight"));
    const std::string kind = stem.substr(stem.rfind('.') + 1);
    if (std::ranges::find(kinds, kind) == kinds.end()) kinds.push_back(kind);
  }
  std::string out;
  for (const std::string& k : kinds) out += (out.empty() ? "" : ", ") + k;
  return out;
}

// `lockstep export`: the model eval and generate would serve, written as a Hugging Face checkpoint
// with its tokenizer files. On the CPU: exporting needs no GPU.
int export_model(Config config) {
  config.model.device = "cpu";
  config.data.chat_template = "none";  // no prompts are made
  const Served served = serving_setup(config, /*need_data=*/false);
  const Setup& setup = served.setup;
  const fs::path out = config.export_.out.empty() ? fs::path(config.run.out_dir) / "export"
                                                  : fs::path(config.export_.out);
  std::printf("%s\n", run_header("export", setup, served.source, out.string()).c_str());
  if (!served.note.empty()) std::printf("%s\n", served.note.c_str());
  std::fflush(stdout);
  const ModelParameters params = initial_parameters(setup, served.checkpoint);
  std::vector<std::string> files;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                           "special_tokens_map.json", "generation_config.json"})
    if (fs::is_regular_file(setup.tokenizer_dir / name)) files.push_back((setup.tokenizer_dir / name).string());
  if (config.export_.format == "bf16") {
    save_hf_checkpoint(out.string(), setup.model_config, params, DType::bf16, files);
    std::printf("wrote %s: bf16 weights, config.json and the tokenizer\n", out.c_str());
    return 0;
  }
  const Fp8Export report = save_fp8_hf_checkpoint(out.string(), setup.model_config, params, files);
  std::printf("wrote %s: block-FP8 (e4m3, one fp32 scale per 128x128 block), config.json and the "
              "tokenizer\n", out.c_str());
  const size_t total = report.exact.size() + report.requantized.size();
  std::printf("%zu of %zu projection weights hold the fp8 recipe's own E4M3 bytes and scales\n",
              report.exact.size(), total);
  if (!report.requantized.empty())
    std::printf("the other %zu (%s) start inside a 128-row block of lockstep's fused weight:\n"
                "they were quantized afresh on the checkpoint's own 128x128 grid\n",
                report.requantized.size(), module_kinds(report.requantized).c_str());
  if (config.model.precision == "bf16")
    std::printf("note: model.precision is bf16, whose rollout reads bf16 weights; these E4M3 "
                "weights are the fp8 recipe's quantization of them\n");
  return 0;
}

// A number of a plot option, or an error naming the option.
double plot_number(std::string_view text, std::string_view option) {
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  LOCKSTEP_CHECK(!s.empty() && end == s.c_str() + s.size() && std::isfinite(value), "plot ", option, ": '", text,
                 "' is not a number");
  return value;
}

// --steps=A:B, A: or :B.
StepWindow plot_steps(std::string_view text) {
  const size_t colon = text.find(':');
  LOCKSTEP_CHECK(colon != std::string_view::npos && text.size() > 1, "plot --steps: '", text,
                 "' is not FIRST:LAST (or FIRST: or :LAST)");
  StepWindow window;
  if (colon > 0) window.first = plot_number(text.substr(0, colon), "--steps");
  if (colon + 1 < text.size()) window.last = plot_number(text.substr(colon + 1), "--steps");
  LOCKSTEP_CHECK(window.first <= window.last, "plot --steps: '", text, "' ends before it starts");
  return window;
}

// A run folder's bins of mismatch by position: its config.toml's, else the default's.
int64_t run_bin_tokens(const fs::path& dir) {
  const fs::path config = dir / "config.toml";
  if (fs::is_regular_file(dir) || !fs::exists(config)) return Config().run.mismatch_bin_tokens;
  return load_config(&config, {}).run.mismatch_bin_tokens;
}

// `lockstep plot [RUN_DIR] [options]` and `lockstep plot --compare RUN_DIR... [options]`.
int plot(std::vector<std::string> args) {
  const bool compare = !args.empty() && args[0] == "--compare";
  const std::string_view form = compare ? "plot --compare" : "plot";
  fs::path out;
  std::vector<fs::path> dirs;
  std::vector<std::string> labels;
  std::optional<int64_t> bin_tokens;
  PlotOptions options;
  for (size_t i = compare ? 1 : 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a.starts_with("--out=")) {
      out = a.substr(6);
      LOCKSTEP_CHECK(!out.empty(), form, " --out=: the picture's path is empty");
    } else if (a.starts_with("--labels=")) {
      labels.clear();
      for (std::string_view rest = a.substr(9);;) {
        const size_t comma = rest.find(',');
        labels.emplace_back(rest.substr(0, comma));
        LOCKSTEP_CHECK(!labels.back().empty(), form, " --labels: label ", labels.size(), " is empty in '", a, "'");
        if (comma == std::string_view::npos) break;
        rest = rest.substr(comma + 1);
      }
    } else if (a.starts_with("--steps=")) {
      options.steps = plot_steps(a.substr(8));
    } else if (a.starts_with("--bin-tokens=")) {
      const double n = plot_number(a.substr(13), "--bin-tokens");
      LOCKSTEP_CHECK(n >= 1 && n == std::floor(n) && n < 1e15, "plot --bin-tokens: ", a.substr(13),
                     " is not a whole number >= 1");
      bin_tokens = int64_t(n);
    } else {
      LOCKSTEP_CHECK(!a.starts_with("--"), form, ": unknown option '", a,
                     "' (expected --out=PNG, --labels=..., --steps=A:B or --bin-tokens=N)");
      dirs.emplace_back(a);
    }
  }
  if (compare) {
    LOCKSTEP_CHECK(!dirs.empty(), "plot --compare needs at least one run folder");
  } else {
    LOCKSTEP_CHECK(dirs.size() <= 1, "plot takes one run folder (or --compare RUN_DIR...), not ", dirs.size());
    if (dirs.empty()) dirs.emplace_back(Config().run.out_dir);
  }
  LOCKSTEP_CHECK(labels.empty() || labels.size() == dirs.size(), form, " --labels: ", labels.size(),
                 " labels for ", dirs.size(), " run folders");
  std::vector<PlottedRun> runs;
  for (size_t r = 0; r < dirs.size(); ++r)
    runs.push_back({dirs[r], labels.empty() ? std::string() : labels[r],
                    bin_tokens ? *bin_tokens : run_bin_tokens(dirs[r])});
  if (compare) {
    if (out.empty()) out = dirs[0].lexically_normal().parent_path() / "compare.png";
    plot_compare(runs, out, options);
  } else {
    if (out.empty())
      out = fs::is_regular_file(dirs[0]) ? fs::path(dirs[0]).replace_extension(".png") : dirs[0] / "metrics.png";
    plot_run(runs[0], out, options);
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

// `--gpus N` or `--gpus=N`, taken out of `args` (train and sft only).
std::optional<int> take_rank_count(std::vector<std::string>& args, const std::string& command) {
  std::optional<int> n;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == "--gpus") {
      LOCKSTEP_CHECK(i + 1 < args.size(), "--gpus needs a value: --gpus N");
      value = args[i + 1];
      args.erase(args.begin() + ptrdiff_t(i), args.begin() + ptrdiff_t(i) + 2);
    } else if (args[i].starts_with("--gpus=")) {
      value = args[i].substr(7);
      args.erase(args.begin() + ptrdiff_t(i));
    } else {
      continue;
    }
    LOCKSTEP_CHECK(command == "train" || command == "sft", "--gpus applies to train and sft, not ",
                   command);
    LOCKSTEP_CHECK(!n, "--gpus is given twice");
    n = parse_rank_count("--gpus", value);
    --i;
  }
  return n;
}

// `--gpus N` outside mpirun: checks what can be checked once, then runs N copies of this command
// (without --gpus) under mpirun in place of this process.
[[noreturn]] void launch_ranks(const Config& config, int ranks, char** argv) {
  LOCKSTEP_CHECK(built_with_mpi(), "--gpus ", ranks, ": this build of lockstep has no MPI "
                 "(libopenmpi-dev was missing when it was built; scripts/setup.sh installs it)");
  check_data_parallel(config, ranks);
  const int visible = cuda_device_count();
  const bool on_gpus = config.model.device == "cuda" || (config.model.device == "auto" && visible > 0);
  LOCKSTEP_CHECK(!on_gpus || ranks <= visible, "--gpus ", ranks, ": ", visible,
                 visible == 1 ? " GPU is" : " GPUs are", " visible (one rank per GPU; "
                 "--model.device=cpu runs CPU ranks)");
  // CPU ranks share the cores; a user's OMP_NUM_THREADS is kept.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  setenv("OMP_NUM_THREADS", std::to_string(std::max(1u, cores / unsigned(ranks))).c_str(), 0);
  // mpirun gives its ranks a terminal of their own for stdout; a log gets plain lines as with one
  // process (rl/console.h: TERM=dumb).
  if (!isatty(fileno(stdout))) setenv("TERM", "dumb", 1);
  // OpenMPI 4's shared-memory transport copies between processes with process_vm_readv, which
  // containers often forbid (ptrace); copying through its shared buffers always works.
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  std::vector<std::string> args;
  for (char** a = argv + 1; *a; ++a) {
    const std::string_view s(*a);
    if (s == "--gpus") {
      ++a;
      continue;
    }
    if (!s.starts_with("--gpus=")) args.emplace_back(s);
  }
  exec_command(mpirun_command(ranks, fs::read_symlink("/proc/self/exe").string(), args, geteuid() == 0));
}

// A rank of several: its GPU is that of its local rank (unless on the CPU), and only rank 0 prints
// progress (the others' stdout goes nowhere; their errors still reach stderr).
void join_as_rank(const Config& config, Communicator& world) {
  if (config.model.device != "cpu" && cuda_device_count() > 0) select_cuda_device(world.local_rank());
  if (!world.is_main()) LOCKSTEP_CHECK(std::freopen("/dev/null", "w", stdout), "rank ", world.rank(),
                                       ": cannot send its console output to /dev/null");
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (is_help(command)) return help(args.empty() ? "" : args[0]);
  if (std::ranges::find(kCommands, command) == std::end(kCommands)) {
    std::fprintf(stderr, "lockstep: unknown subcommand '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return help(command);
  if (command == "plot") return plot(args);
  // --check: what the run would read, without running it (the examples/ test runs it on every file).
  const bool check_only = std::erase(args, std::string("--check")) > 0;
  const std::optional<int> gpus = take_rank_count(args, command);
  std::optional<fs::path> file;
  if (!args.empty() && !args[0].starts_with("--")) {
    file = args[0];
    args.erase(args.begin());
  }
  const Config config = load_config(file ? &*file : nullptr, args);
  if (check_only) {
    std::fputs(to_toml(config).c_str(), stdout);
    return 0;
  }
  if (command == "train" || command == "sft") {
    const EnvLookup env = [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
    if (gpus && *gpus > 1 && !read_world_env(env).under_mpirun) launch_ranks(config, *gpus, argv);
    g_world = join_world(env);
    Communicator& world = *g_world;
    LOCKSTEP_CHECK(!gpus || *gpus == world.size(), "--gpus ", *gpus, ", but this process is ",
                   world.describe(), " (started by mpirun with -np ", world.size(),
                   "): give one or the other");
    if (world.size() > 1) join_as_rank(config, world);
    const std::string toml = to_toml(config);
    const TrainSummary s =
        command == "train" ? run_train(config, {}, world, toml) : run_sft(config, {}, world, toml);
    if (s.interrupted) {
      std::printf("interrupted: checkpoint saved in %s (continue with --run.resume=true)\n",
                  config.run.out_dir.c_str());
      return 130;
    }
    if (s.already_complete) {
      std::printf("the run is already complete: nothing to do (a larger --%s continues it)\n",
                  command == "train" ? "run.steps" : "sft.steps");
      if (!std::isnan(s.final_accuracy))
        std::printf("its last held-out accuracy (greedy): %.4f\n", s.final_accuracy);
      return 0;
    }
    if (!std::isnan(s.sft_accuracy))
      std::printf("held-out accuracy (greedy) after SFT: %.4f\n", s.sft_accuracy);
    if (command == "train" && config.run.steps > 0 && world.is_main()) {
      std::printf("held-out accuracy (greedy) after %lld GRPO steps: %.4f\n",
                  (long long)config.run.steps, s.final_accuracy);
      plot_run({config.run.out_dir, {}, config.run.mismatch_bin_tokens}, fs::path(config.run.out_dir) / "metrics.png");
      std::printf("curves: %s\n", (fs::path(config.run.out_dir) / "metrics.png").c_str());
    }
    return 0;
  }
  if (const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE"); ranks && std::string_view(ranks) != "1")
    fail("lockstep " + command + " runs as one process, not as " + ranks +
         " ranks under mpirun (train and sft run as several)");
  if (command == "eval") return eval(config);
  if (command == "export") return export_model(config);
  return generate(config);
}

// OpenMP's threads wait for work by spinning for a while (libgomp's default) before they sleep. On
// a machine whose cores are busy with other work, a spinning thread takes the core from the thread
// that would finish the work, at every barrier: beside a compile on 2 cores the default job's steps
// became several times slower. Waiting passively sleeps at once and costs a wake-up per parallel
// region. The runtime reads OMP_WAIT_POLICY only as the program loads, so when it is not set the
// program starts itself again with it set; a user's own setting (even an empty one) is kept.
void wait_passively_unless_told(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only when it failed: go on with the runtime's default
}

// One error message on stderr; with several ranks it names the rank, and every rank ends.
int fail_with(const char* what) {
  if (g_world && g_world->size() > 1) abort_ranks(*g_world, what);
  std::fprintf(stderr, "lockstep: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively_unless_told(argv);
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    return fail_with(e.what());
  }
  g_world.reset();  // MPI_Finalize, after every rank's work
  return status;
}
