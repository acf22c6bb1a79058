// rl/checkpoint.cpp
#include "rl/checkpoint.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "model/hf_checkpoint.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

fs::path folder(const fs::path& out_dir) { return out_dir / "checkpoint"; }

}  // namespace

void copy_tokenizer_files(const fs::path& tokenizer_dir, const fs::path& model_dir) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    if (fs::exists(tokenizer_dir / name)) fs::copy_file(tokenizer_dir / name, model_dir / name);
}

void write_run_state(const fs::path& dir, const RunState& state, int shards, bool experts_owned) {
  nlohmann::json j = {{"sft_step", state.sft_step},
                      {"step", state.step},
                      {"optimizer_steps", state.optimizer_steps},
                      {"consecutive_skips", state.consecutive_skips}};
  if (shards > 0) j["shards"] = shards;
  if (experts_owned) j["experts_owned"] = true;
  write_file_atomically((dir / "state.json").string(), j.dump(2) + "\n");
}

void save_checkpoint(const fs::path& out_dir, const ModelConfig& config,
                     const ModelParameters& params, const DataParallelOptimizer::Moments& moments,
                     const RunState& state,
                     const fs::path& tokenizer_dir) {
  const fs::path final_dir = folder(out_dir), tmp = out_dir / "checkpoint.tmp";
  try {
    // A crash in an earlier save may have left the previous checkpoint aside (replace_folder's
    // fallback); it goes back before anything else is touched.
    recover_replaced_folder(final_dir.string());
    fs::remove_all(tmp);  // what a crash in an earlier save left half-written
    fs::create_directories(tmp);
    save_hf_checkpoint((tmp / "model").string(), config, params, DType::f32);
    copy_tokenizer_files(tokenizer_dir, tmp / "model");

    NamedTensors tensors;
    // (Pairs, not structured bindings, which clang 14's lambdas cannot capture.)
    for (const auto& moment : {std::pair{"m.", &moments.m}, std::pair{"v.", &moments.v}})
      moment.second->for_each([&](const std::string& name, const Tensor& t) {
        tensors.emplace_back(moment.first + name, t.device() == Device::cpu ? t : t.to(Device::cpu));
      });
    write_safetensors((tmp / "optimizer.safetensors").string(), tensors);

    write_run_state(tmp, state);

    // One complete checkpoint exists at every moment: the old one until the atomic exchange, the
    // new one after it.
    replace_folder(tmp.string(), final_dir.string());
  } catch (const std::exception& e) {
    // A full disk or another failure: the half-written folder goes (it would only hold space; a
    // resume never reads it), the previous checkpoint stays as it was.
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    fail(detail::concat("cannot save the checkpoint ", final_dir.string(), " (the previous one, if any, is unchanged): ",
                        e.what()));
  }
}

std::optional<SavedRun> find_checkpoint(const fs::path& out_dir) {
  const fs::path dir = folder(out_dir), state_path = dir / "state.json";
  if (recover_replaced_folder(dir.string()))
    std::fprintf(stderr, "lockstep: %s was missing after an interrupted save; restored it from %s.old\n",
                 dir.c_str(), dir.c_str());
  if (!fs::exists(state_path)) return std::nullopt;
  const auto j = nlohmann::json::parse(read_file(state_path.string(), "checkpoint state"), nullptr,
                                       false);
  auto field = [&](const char* key) {
    LOCKSTEP_CHECK(j.is_object() && j.contains(key) && j[key].is_number_integer() && j[key] >= 0,
                   state_path.string(), ": expected a non-negative integer \"", key, "\"");
    return j[key].get<int64_t>();
  };
  SavedRun run;
  run.model = dir / "model";
  run.state = {field("sft_step"), field("step"), field("optimizer_steps"), field("consecutive_skips")};
  return run;
}

void load_optimizer(const fs::path& out_dir, const ModelParameters& params,
                    DataParallelOptimizer& optimizer, int64_t steps) {
  const SafetensorsFile file((folder(out_dir) / "optimizer.safetensors").string());
  ModelParameters m = params, v = params;  // the names and shapes; every tensor is replaced
  for (const auto& moment : {std::pair{"m.", &m}, std::pair{"v.", &v}})
    moment.second->for_each([&](const std::string& name, Tensor& t) {
      const std::string saved = moment.first + name;
      LOCKSTEP_CHECK(file.contains(saved), file.path(), ": no tensor ", saved);
      t = file.tensor(saved);
    });
  optimizer.load_state(m, v, steps);
}

}  // namespace lockstep
