// rl/checkpoint.h — a run's checkpoint, everything needed to continue it exactly:
//
//   OUT_DIR/checkpoint/model/            the fp32 masters as a Hugging Face checkpoint (config.json,
//                                        model.safetensors; transformers loads it) plus the
//                                        tokenizer files, so the folder can be served as it is
//   OUT_DIR/checkpoint/optimizer.safetensors   AdamW's moments ("m.<name>", "v.<name>"), whole
//                                        tensors; each rank of a resumed run takes its own rows,
//                                        so a run resumes with any number of ranks, sharded or not
//
// This is the checkpoint of a run whose masters are whole on one rank. A run whose masters and
// moments are sharded over several ranks writes rl/sharded_checkpoint.h's instead (each rank its
// own rows), which the same find_checkpoint finds and any number of ranks reads.
//   OUT_DIR/checkpoint/state.json        where the run stands (RunState)
//
// The run's randomness is counter-based (problems, sampling seeds: functions of the run seed and
// the step), so no RNG state beyond the step is needed. The checkpoint is written into
// OUT_DIR/checkpoint.tmp, flushed to disk, and exchanged with the previous one in one atomic rename
// (io/file_io.h, replace_folder): a process killed at any point leaves the old checkpoint or the new
// one, whole, and a failed save (a full disk) throws one error naming the file and leaves the old
// one as it was. Checked by killing a writer at random points (tests/rl/test_checkpoint_faults.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "io/config.h"
#include "model/parameters.h"
#include "train/data_parallel.h"

namespace lockstep {

struct RunState {
  int64_t sft_step = 0;       // SFT steps done
  int64_t step = 0;           // GRPO steps done
  int64_t optimizer_steps = 0;  // of the optimizer whose moments are saved
  int64_t consecutive_skips = 0;
};

// The parts every checkpoint writer writes alike (rl/sharded_checkpoint.cpp too): the tokenizer's
// files copied into the checkpoint's model folder, and `state.json` in `dir` (with "shards": N
// when N > 0).
void copy_tokenizer_files(const std::filesystem::path& tokenizer_dir,
                          const std::filesystem::path& model_dir);
void write_run_state(const std::filesystem::path& dir, const RunState& state, int shards = 0,
                     bool experts_owned = false);

void save_checkpoint(const std::filesystem::path& out_dir, const ModelConfig& config,
                     const ModelParameters& params, const DataParallelOptimizer::Moments& moments,
                     const RunState& state,
                     const std::filesystem::path& tokenizer_dir);

// The checkpoint folder's model path and its state, when OUT_DIR holds a checkpoint.
struct SavedRun {
  std::filesystem::path model;
  RunState state;
};
std::optional<SavedRun> find_checkpoint(const std::filesystem::path& out_dir);

// Restores the optimizer's moments (DataParallelOptimizer::load_state) from the checkpoint;
// `params`: the masters, whose tensors the moments have.
void load_optimizer(const std::filesystem::path& out_dir, const ModelParameters& params,
                    DataParallelOptimizer& optimizer, int64_t steps);

}  // namespace lockstep
