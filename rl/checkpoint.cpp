// rl/checkpoint.cpp
#include "rl/checkpoint.h"

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

void save_checkpoint(const fs::path& out_dir, const ModelConfig& config,
                     const ModelParameters& params, const DataParallelOptimizer::Moments& moments,
                     const RunState& state,
                     const fs::path& tokenizer_dir) {
  const fs::path final_dir = folder(out_dir), tmp = out_dir / "checkpoint.tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_hf_checkpoint((tmp / "model").string(), config, params, DType::f32);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    if (fs::exists(tokenizer_dir / name)) fs::copy_file(tokenizer_dir / name, tmp / "model" / name);

  NamedTensors tensors;
  for (auto [prefix, m] : {std::pair{"m.", &moments.m}, std::pair{"v.", &moments.v}})
    m->for_each([&](const std::string& name, const Tensor& t) {
      tensors.emplace_back(prefix + name, t.device() == Device::cpu ? t : t.to(Device::cpu));
    });
  write_safetensors((tmp / "optimizer.safetensors").string(), tensors);

  const nlohmann::json j = {{"sft_step", state.sft_step},
                            {"step", state.step},
                            {"optimizer_steps", state.optimizer_steps},
                            {"consecutive_skips", state.consecutive_skips}};
  write_file_atomically((tmp / "state.json").string(), j.dump(2) + "\n");

  // Swap in: the old checkpoint goes aside first, so one complete checkpoint exists at any time.
  const fs::path old = out_dir / "checkpoint.old";
  fs::remove_all(old);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  fs::remove_all(old);
}

std::optional<SavedRun> find_checkpoint(const fs::path& out_dir) {
  const fs::path dir = folder(out_dir), state_path = dir / "state.json";
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
  for (auto [prefix, p] : {std::pair{"m.", &m}, std::pair{"v.", &v}})
    p->for_each([&](const std::string& name, Tensor& t) {
      LOCKSTEP_CHECK(file.contains(prefix + name), file.path(), ": no tensor ", prefix, name);
      t = file.tensor(prefix + name);
    });
  optimizer.load_state(m, v, steps);
}

}  // namespace lockstep
