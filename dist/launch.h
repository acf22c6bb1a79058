// dist/launch.h — `lockstep train --gpus N` on one host: the command starts itself N times under
// mpirun (OpenMPI's, from Debian's openmpi-bin) and waits for them; mpirun forwards their output,
// ends them all when one fails, and returns the first failure's exit status. Each rank then joins
// MPI's world (dist/world.h) and drives the GPU of its local rank (or, with --model.device=cpu,
// runs on the CPU: N CPU ranks share the host's cores, OMP_NUM_THREADS = cores / N unless set).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

// The value of `--gpus`: a whole number from 1 to kMaxRanks (an error naming the flag otherwise).
int parse_rank_count(std::string_view flag, std::string_view value);
constexpr int kMaxRanks = 1024;

// The mpirun command line running `program args...` as `ranks` processes on this host. As root,
// OpenMPI wants --allow-run-as-root; --oversubscribe lets CPU ranks outnumber cores (tests with 3
// ranks on 2 cores); --bind-to none leaves each rank's OpenMP threads free to spread.
std::vector<std::string> mpirun_command(int ranks, const std::string& program,
                                        const std::vector<std::string>& args, bool as_root);

// Runs `command` (mpirun first) in place of this process; throws when mpirun cannot be started.
[[noreturn]] void exec_command(const std::vector<std::string>& command);

}  // namespace lockstep
