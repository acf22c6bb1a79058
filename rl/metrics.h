// rl/metrics.h — a run's metrics: one JSON object per step in a JSONL file (rl/plot.h draws it),
// and a progress line on the console.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {

// Field name and value, in the order they are written; a non-finite value is written as null.
using Metrics = std::vector<std::pair<std::string, double>>;
// Fields whose value is a list (e.g. one value per bin), written as JSON arrays after the Metrics;
// a non-finite element is written as null.
using MetricSeries = std::vector<std::pair<std::string, std::vector<double>>>;

class MetricsLog {
 public:
  // Appends to `path`. Lines of steps after `keep_through` are dropped first (a resumed run goes
  // on from its checkpoint's step; what the interrupted run logged after it is redone).
  MetricsLog(const std::filesystem::path& path, int64_t keep_through);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(int64_t step, const Metrics& metrics, const MetricSeries& series = {});

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// The value of `name` in `metrics` (NaN when absent).
double metric(const Metrics& metrics, const std::string& name);

// The last finite value of `name` in the metrics JSONL at `path` (NaN when the file or the value is
// missing; unreadable lines are passed over).
double last_logged(const std::filesystem::path& path, const std::string& name);

}  // namespace lockstep
