// tests/dist/rank_failure_probe.cpp — a program for tests/dist/ranks_end_to_end.sh. Its ranks meet
// at a barrier; then rank R fails as the first argument says while the others wait for it in a
// collective (without the failure handling they would wait forever):
//   rank_failure_probe error R   rank R throws an Error, reported as `lockstep` reports one
//                                (dist/world.h abort_ranks)
//   rank_failure_probe die R     rank R is killed (SIGKILL)
//   rank_failure_probe hang R    rank R sleeps; the others' watchdog (LOCKSTEP_DIST_TIMEOUT_S) ends them
//   rank_failure_probe none 0    no failure: every rank gets the sum and exits 0
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "dist/world.h"

using namespace lockstep;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: rank_failure_probe error|die|hang|none RANK\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int failing = std::atoi(argv[2]);
  std::unique_ptr<Communicator> world;
  try {
    world = join_world([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
    world->barrier();
    if (world->rank() == failing) {
      if (mode == "error") fail("a planted failure on rank " + std::to_string(failing));
      if (mode == "die") raise(SIGKILL);
      if (mode == "hang") sleep(600);
    }
    Tensor t = Tensor::empty({1}, DType::f32);
    *t.data_as<float>() = 1.0f;
    world->all_reduce_sum(t);
    std::printf("rank %d: sum %g\n", world->rank(), double(*t.data_as<float>()));
  } catch (const std::exception& e) {
    if (world) abort_ranks(*world, e.what());
    std::fprintf(stderr, "rank_failure_probe: %s\n", e.what());
    return 1;
  }
  world.reset();
  return 0;
}
