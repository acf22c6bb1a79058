// dist/world.h — which ranks this process belongs to.
//
// lockstep's ranks are MPI processes: `lockstep train --gpus N` starts N of them on this host
// through mpirun (dist/launch.h), and `mpirun -np N lockstep train ...` (one host or many) does the
// same by hand. A process started by mpirun joins MPI's world (dist/mpi_communicator.h); NCCL,
// for CUDA tensors, is set up through it (rank 0 makes the unique id, MPI broadcasts it), so no
// address or port has to be given. Any other process is one rank alone (dist/single_rank.h) and
// needs no MPI at all.
//
// The usual variables of other launchers (torchrun's) are checked, not obeyed: RANK, WORLD_SIZE
// and LOCAL_RANK, where set, must agree with the world found (a job script that expects another
// layout gets one error naming the variable, not a silently different run), and WORLD_SIZE > 1
// without mpirun is an error that says how to launch. MASTER_ADDR and MASTER_PORT are not read:
// mpirun's own wire-up replaces them.
//
// LOCKSTEP_DIST_TIMEOUT_S (seconds, default 1800): how long one collective may wait for the other
// ranks before this rank stops with an error (a rank that hangs; one that dies is reported by
// mpirun at once). It must cover the longest stretch one rank works alone: rank 0 writing a
// checkpoint while the others wait.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "dist/communicator.h"

namespace lockstep {

using EnvLookup = std::function<const char*(const char* name)>;

// What the environment says about this process's place.
struct WorldEnv {
  bool under_mpirun = false;  // OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK is set
  std::optional<int> rank, world_size, local_rank;  // RANK, WORLD_SIZE, LOCAL_RANK
  double timeout_seconds = 1800;                    // LOCKSTEP_DIST_TIMEOUT_S
};

// Reads the variables; a value that is not a whole number in range is an error naming it.
WorldEnv read_world_env(const EnvLookup& env);
// Checks RANK, WORLD_SIZE and LOCAL_RANK against the world found (an error naming the variable).
void check_world_env(const WorldEnv& env, int rank, int size, int local_rank);

// This process's communicator: MPI's world under mpirun, else one rank.
std::unique_ptr<Communicator> join_world(const EnvLookup& env);

// A rank's error: "[rank R] lockstep: what" on stderr, then every rank ends (Communicator::abort;
// mpirun reports the rank that aborted).
[[noreturn]] void abort_ranks(Communicator& comm, const char* what);

// Whether this build can run several ranks (it found MPI).
bool built_with_mpi();

}  // namespace lockstep
