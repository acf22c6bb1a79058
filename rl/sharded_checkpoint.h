// rl/sharded_checkpoint.h — the checkpoint of a run whose fp32 masters and AdamW moments are
// sharded over N ranks (train/sharded_optimizer.h): no rank holds the whole state, so each rank
// writes its own rows and no rank gathers the rest.
//
//   OUT_DIR/checkpoint/shards/rank-R-of-N.safetensors   rank R's rows of the masters and moments:
//                                        one tensor per piece of the shard plan, named
//                                        "master.<name>@<first row>", "m.<…>", "v.<…>", shaped
//                                        [rows, …] (train/shard_plan.h: whole 128-row blocks)
//   OUT_DIR/checkpoint/model/            config.json and the tokenizer files (rank 0); no weights
//   OUT_DIR/checkpoint/state.json        RunState as rl/checkpoint.h writes it, plus "shards": N
//                                        and, with expert parallelism, "experts_owned": true (each
//                                        expert's rows in its owner's file, train/shard_plan.h)
//
// The plan is a pure function of the model's shapes, N and "experts_owned", so a reader remakes it
// from them and knows which file holds which rows. Reading with any number of ranks: the moments of a rank's own
// rows are read from the files that hold them (with the same N, its own file only); the whole
// masters a model is built from are put together from every file (as a run's start always holds
// them whole, until the optimizer takes its rows and the model releases them). `lockstep eval`,
// `generate` and `export` read the masters the same way, so the export stays one ordinary folder.
//
// Crash safety as rl/checkpoint.h: everything is written into OUT_DIR/checkpoint.tmp, which then
// replaces the previous checkpoint (rank 0 renames, after every rank's file is complete); a crash
// leaves the old checkpoint or the new one. A rank whose write fails makes every rank throw.
#pragma once

#include <filesystem>

#include "dist/communicator.h"
#include "io/config.h"
#include "model/parameters.h"
#include "rl/checkpoint.h"
#include "train/sharded_optimizer.h"

namespace lockstep {

// A collective: every rank calls it with its optimizer.
void save_sharded_checkpoint(const std::filesystem::path& out_dir, const ModelConfig& config,
                             Communicator& comm, const ShardedAdamW& optimizer, const RunState& state,
                             const std::filesystem::path& tokenizer_dir);

// Whether the checkpoint whose model folder is `checkpoint_model` (SavedRun::model) is sharded.
bool is_sharded_checkpoint(const std::filesystem::path& checkpoint_model);

// The whole fp32 masters of a sharded checkpoint, on the CPU.
ModelParameters load_sharded_masters(const ModelConfig& config, const std::filesystem::path& checkpoint_model);

// The moments of a sharded checkpoint into `optimizer` (written with any number of ranks):
// a ShardedAdamW reads its own rows, any other optimizer the whole moments. `shapes`: every
// tensor of the masters (their names and shapes).
void load_sharded_optimizer(const std::filesystem::path& checkpoint_model, const ModelParameters& shapes,
                            DataParallelOptimizer& optimizer, int64_t steps);

}  // namespace lockstep
