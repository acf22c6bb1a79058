// rl/sharded_checkpoint.cpp
#include "rl/sharded_checkpoint.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/host_values.h"
#include "io/file_io.h"
#include "io/safetensors.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

fs::path shard_file(const fs::path& dir, int rank, int ranks) {
  return dir / ("rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".safetensors");
}

std::string piece_name(const char* kind, const std::string& tensor, int64_t row_begin) {
  return std::string(kind) + "." + tensor + "@" + std::to_string(row_begin);
}

std::vector<ShardedTensor> shapes_of(const ModelParameters& p) {
  std::vector<ShardedTensor> out;
  p.for_each([&](const std::string& name, const Tensor& t) { out.push_back({name, t.shape()}); });
  return out;
}

// Runs `write` on every rank; when it fails on any, every rank throws (this rank's message, or one
// naming the failure elsewhere), so that no rank waits in a later collective for one that gave up.
template <class Fn>
void on_every_rank(Communicator& comm, const char* what, Fn&& write) {
  std::string error;
  try {
    write();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const bool failed_here = !error.empty();
  if (any_rank(comm, failed_here))
    LOCKSTEP_CHECK(false, what, failed_here ? ": " + error : std::string(": it failed on another rank"));
}

// The files of a sharded checkpoint and the plan they were written with (state.json's "shards",
// and "experts_owned" when expert parallelism gave each expert to its rank): rows of any tensor.
class ShardFiles {
 public:
  ShardFiles(const fs::path& checkpoint_model, const std::vector<ShardedTensor>& shapes) {
    const fs::path dir = checkpoint_model.parent_path();
    const fs::path state = dir / "state.json";
    const auto j = nlohmann::json::parse(read_file(state.string(), "checkpoint state"), nullptr, false);
    LOCKSTEP_CHECK(j.is_object() && j.contains("shards") && j["shards"].is_number_integer() && j["shards"] >= 1,
                   state.string(), ": expected a positive integer \"shards\" (a sharded checkpoint)");
    const int ranks = j["shards"].get<int>();
    std::vector<ShardedTensor> tensors = shapes;
    if (j.value("experts_owned", false)) assign_experts_to_owners(tensors, ranks);
    plan_ = plan_shards(tensors, ranks);
    for (int r = 0; r < ranks; ++r) {
      const fs::path f = shard_file(dir / "shards", r, ranks);
      LOCKSTEP_CHECK(fs::exists(f), dir.string(), ": the checkpoint was written by ", ranks,
                     " ranks and has no ", f.filename().string());
      files_.push_back(std::make_unique<SafetensorsFile>(f.string()));
    }
  }

  const ShardPlan& plan() const { return plan_; }

  // dst (f32 [row_end − row_begin, …], any device) = rows [row_begin, row_end) of tensor `i`'s `kind`.
  void read(const char* kind, int i, int64_t row_begin, int64_t row_end, Tensor& dst) const {
    int64_t covered = 0;
    for (int r = 0; r < plan_.ranks; ++r)
      for (const ShardPiece& p : plan_.pieces[size_t(r)]) {
        const int64_t b = std::max(row_begin, p.row_begin), e = std::min(row_end, p.row_end);
        if (p.tensor != i || b >= e) continue;
        const SafetensorsFile& f = *files_[size_t(r)];
        const std::string name = piece_name(kind, plan_.tensors[size_t(i)].name, p.row_begin);
        LOCKSTEP_CHECK(f.contains(name), f.path(), ": no tensor ", name);
        Shape expected = plan_.tensors[size_t(i)].shape;
        expected[0] = p.row_end - p.row_begin;
        const Tensor saved = f.tensor(name);
        LOCKSTEP_CHECK(saved.dtype() == DType::f32 && saved.shape() == expected, f.path(), ": ", name,
                       " is ", saved.describe(), ", expected f32", shape_string(expected));
        Tensor part = dst.rows(b - row_begin, e - row_begin);
        part.copy_from(saved.rows(b - p.row_begin, e - p.row_begin));
        covered += e - b;
      }
    LOCKSTEP_CHECK(covered == row_end - row_begin, "sharded checkpoint: rows ", row_begin, "..", row_end,
                   " of ", plan_.tensors[size_t(i)].name, " are not all in its files");
  }

  // Every tensor of `kind`, whole, into `out` (of the plan's names and shapes, f32).
  void read_whole(const char* kind, ModelParameters& out) const {
    int i = 0;
    out.for_each([&](const std::string&, Tensor& t) {
      read(kind, i, 0, plan_.rows(i), t);
      ++i;
    });
  }

 private:
  ShardPlan plan_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace

void save_sharded_checkpoint(const fs::path& out_dir, const ModelConfig& config, Communicator& comm,
                             const ShardedAdamW& optimizer, const RunState& state,
                             const fs::path& tokenizer_dir) {
  const fs::path final_dir = out_dir / "checkpoint", tmp = out_dir / "checkpoint.tmp";
  const ShardPlan& plan = optimizer.plan();
  on_every_rank(comm, "sharded checkpoint: preparing checkpoint.tmp", [&] {
    if (!comm.is_main()) return;
    recover_replaced_folder(final_dir.string());  // as rl/checkpoint.cpp's save_checkpoint
    fs::remove_all(tmp);
    fs::create_directories(tmp / "shards");
    fs::create_directories(tmp / "model");
  });
  on_every_rank(comm, "sharded checkpoint: writing this rank's shard", [&] {
    NamedTensors tensors;
    for (auto [kind, shard] : {std::pair{"master", &optimizer.master_shard()},
                               std::pair{"m", &optimizer.first_moment_shard()},
                               std::pair{"v", &optimizer.second_moment_shard()}}) {
      const Tensor host = shard->device() == Device::cpu ? *shard : shard->to(Device::cpu);
      for (const ShardPiece& p : plan.pieces[size_t(comm.rank())]) {
        const int64_t rows = p.row_end - p.row_begin;
        Shape shape = plan.tensors[size_t(p.tensor)].shape;
        shape[0] = rows;
        tensors.emplace_back(piece_name(kind, plan.tensors[size_t(p.tensor)].name, p.row_begin),
                             host.rows(p.offset, p.offset + rows * plan.row_numel(p.tensor)).reshape(shape));
      }
    }
    write_safetensors(shard_file(tmp / "shards", comm.rank(), comm.size()).string(), tensors);
  });
  on_every_rank(comm, "sharded checkpoint: swapping it in", [&] {
    if (!comm.is_main()) return;
    save_model_config(config, (tmp / "model" / "config.json").string());
    copy_tokenizer_files(tokenizer_dir, tmp / "model");
    write_run_state(tmp, state, comm.size(), plan.has_owned_tensors());
    // One complete checkpoint at every moment (io/file_io.h), as rl/checkpoint.cpp's.
    replace_folder(tmp.string(), final_dir.string());
  });
}

bool is_sharded_checkpoint(const fs::path& checkpoint_model) {
  return fs::is_directory(checkpoint_model.parent_path() / "shards");
}

ModelParameters load_sharded_masters(const ModelConfig& config, const fs::path& checkpoint_model) {
  ModelParameters out = ModelParameters::zeros(config);
  ShardFiles(checkpoint_model, shapes_of(out)).read_whole("master", out);
  return out;
}

void load_sharded_optimizer(const fs::path& checkpoint_model, const ModelParameters& shapes,
                            DataParallelOptimizer& optimizer, int64_t steps) {
  const ShardFiles files(checkpoint_model, shapes_of(shapes));
  if (auto* sharded = dynamic_cast<ShardedAdamW*>(&optimizer)) {
    sharded->load_moment_rows(
        [&](const char* kind, int tensor, int64_t b, int64_t e, Tensor& dst) { files.read(kind, tensor, b, e, dst); },
        steps);
    return;
  }
  ModelParameters m = shapes.copy_to(Device::cpu), v = shapes.copy_to(Device::cpu);
  files.read_whole("m", m);
  files.read_whole("v", v);
  optimizer.load_state(m, v, steps);
}

}  // namespace lockstep
