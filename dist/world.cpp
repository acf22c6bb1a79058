// dist/world.cpp
#include "dist/world.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "dist/single_rank.h"
#if LOCKSTEP_HAS_MPI
#include "dist/mpi_communicator.h"
#endif

namespace lockstep {

namespace {

std::optional<int> whole_number(const EnvLookup& env, const char* name, int min) {
  const char* value = env(name);
  if (!value) return std::nullopt;
  const std::string_view s(value);
  int n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  LOCKSTEP_CHECK(ec == std::errc() && end == s.data() + s.size() && n >= min, "environment variable ",
                 name, "='", s, "': expected a whole number ≥ ", min);
  return n;
}

}  // namespace

WorldEnv read_world_env(const EnvLookup& env) {
  WorldEnv w;
  w.under_mpirun = env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK");
  w.rank = whole_number(env, "RANK", 0);
  w.world_size = whole_number(env, "WORLD_SIZE", 1);
  w.local_rank = whole_number(env, "LOCAL_RANK", 0);
  if (const char* t = env("LOCKSTEP_DIST_TIMEOUT_S")) {
    const std::string_view s(t);
    double seconds = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seconds);
    LOCKSTEP_CHECK(ec == std::errc() && end == s.data() + s.size() && seconds > 0,
                   "environment variable LOCKSTEP_DIST_TIMEOUT_S='", s,
                   "': expected a number of seconds > 0");
    w.timeout_seconds = seconds;
  }
  return w;
}

void check_world_env(const WorldEnv& env, int rank, int size, int local_rank) {
  const std::string where = env.under_mpirun ? "mpirun started " + std::to_string(size) + " ranks"
                                             : "this process was not started by mpirun (one rank)";
  if (env.world_size && *env.world_size != size) {
    LOCKSTEP_CHECK(env.under_mpirun || *env.world_size <= 1, "environment variable WORLD_SIZE=",
                   *env.world_size, ", but ", where, ": lockstep's ranks are MPI processes; start ",
                   *env.world_size, " of them with `lockstep train --gpus ", *env.world_size,
                   "` or `mpirun -np ", *env.world_size, " lockstep train ...`");
    fail("environment variable WORLD_SIZE=" + std::to_string(*env.world_size) + ", but " + where);
  }
  LOCKSTEP_CHECK(!env.rank || *env.rank == rank, "environment variable RANK=", env.rank.value_or(0),
                 ", but this process is rank ", rank, " (", where, ")");
  LOCKSTEP_CHECK(!env.local_rank || *env.local_rank == local_rank, "environment variable LOCAL_RANK=",
                 env.local_rank.value_or(0), ", but this process is local rank ", local_rank,
                 " on its host (", where, ")");
}

std::unique_ptr<Communicator> join_world(const EnvLookup& env) {
  const WorldEnv w = read_world_env(env);
  if (!w.under_mpirun) {
    check_world_env(w, 0, 1, 0);
    return std::make_unique<SingleRankCommunicator>();
  }
#if LOCKSTEP_HAS_MPI
  auto world = std::make_unique<MpiCommunicator>(w.timeout_seconds);
  // A rank whose variables disagree ends every rank (the others are already in the world).
  try {
    check_world_env(w, world->rank(), world->size(), world->local_rank());
  } catch (const Error& e) {
    abort_ranks(*world, e.what());
  }
  return world;
#else
  fail("this process was started by mpirun, but this build of lockstep has no MPI (libopenmpi-dev "
       "was missing when it was built; scripts/setup.sh installs it)");
#endif
}

void abort_ranks(Communicator& comm, const char* what) {
  std::fflush(stdout);
  std::fprintf(stderr, "[rank %d] lockstep: %s\n", comm.rank(), what);
  comm.abort(1);
  std::_Exit(1);  // (abort does not return)
}

bool built_with_mpi() {
#if LOCKSTEP_HAS_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace lockstep
