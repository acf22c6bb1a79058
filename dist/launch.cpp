// dist/launch.cpp
#include "dist/launch.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "core/error.h"

namespace lockstep {

int parse_rank_count(std::string_view flag, std::string_view value) {
  int n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  LOCKSTEP_CHECK(ec == std::errc() && end == value.data() + value.size() && n >= 1 && n <= kMaxRanks,
                 flag, " '", value, "': expected a whole number of ranks from 1 to ", kMaxRanks);
  return n;
}

std::vector<std::string> mpirun_command(int ranks, const std::string& program,
                                        const std::vector<std::string>& args, bool as_root) {
  std::vector<std::string> c = {"mpirun", "-np", std::to_string(ranks), "--oversubscribe",
                                "--bind-to", "none"};
  if (as_root) c.push_back("--allow-run-as-root");
  c.push_back(program);
  c.insert(c.end(), args.begin(), args.end());
  return c;
}

void exec_command(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int error = errno;
  fail("could not start " + command[0] + " (" + std::strerror(error) + ")" +
       (error == ENOENT ? ": several ranks run under OpenMPI's mpirun; install openmpi-bin "
                          "(scripts/setup.sh does)"
                        : ""));
}

}  // namespace lockstep
