// tests/rl/test_metrics_log.cpp — the metrics JSONL (rl/metrics.h): numbers and lists written in
// order, non-finite values as null, and the lines after a resumed run's step dropped.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "rl/metrics.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(MetricsLog, WritesNumbersThenListsWithNullForNonFinite) {
  const fs::path dir = fs::temp_directory_path() / "lockstep_test_metrics_log";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path path = dir / "metrics.jsonl";
  const std::string first =
      R"({"step":1,"a":0.5,"b":null,"by_bin":[0.25,null,2.0],"tokens":[3.0,0.0,1.0],"empty":[]})";
  {
    MetricsLog log(path, 0);
    log.write(1, {{"a", 0.5}, {"b", NAN}},
              {{"by_bin", {0.25, NAN, 2.0}}, {"tokens", {3, 0, 1}}, {"empty", {}}});
    log.write(2, {{"a", INFINITY}});
  }
  EXPECT_EQ(lines_of(path), (std::vector<std::string>{first, R"({"step":2,"a":null})"}));
  { MetricsLog resumed(path, 1); }  // a run resumed from step 1 redoes step 2
  EXPECT_EQ(lines_of(path), (std::vector<std::string>{first}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
