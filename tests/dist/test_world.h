// tests/dist/test_world.h — the test binary's communicator: MPI's world under mpirun, else one
// rank (dist/world.h). One per process, shared by every test file of test_dist.
#pragma once

#include <cstdlib>
#include <memory>

#include "dist/world.h"

namespace lockstep::testing {

inline Communicator& world() {
  static std::unique_ptr<Communicator> w =
      join_world([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
  return *w;
}

}  // namespace lockstep::testing
