// rl/metrics.cpp
#include "rl/metrics.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file_io.h"

namespace lockstep {

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t keep_through) : path_(path) {
  if (std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step") && j["step"].is_number() && j["step"] <= keep_through)
        kept += line + "\n";
    }
    write_file_atomically(path.string(), kept);
  }
  file_ = std::fopen(path.c_str(), "a");
  LOCKSTEP_CHECK(file_ != nullptr, path.string(), ": cannot open for writing");
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

namespace {
nlohmann::ordered_json json_number(double value) {
  return std::isfinite(value) ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
}
}  // namespace

void MetricsLog::write(int64_t step, const Metrics& metrics, const MetricSeries& series) {
  nlohmann::ordered_json j;
  j["step"] = step;
  for (const auto& [name, value] : metrics) j[name] = json_number(value);
  for (const auto& [name, values] : series) {
    nlohmann::ordered_json& list = j[name] = nlohmann::ordered_json::array();
    for (double v : values) list.push_back(json_number(v));
  }
  const std::string line = j.dump() + "\n";
  LOCKSTEP_CHECK(std::fputs(line.c_str(), file_) >= 0 && std::fflush(file_) == 0, path_.string(),
                 ": write failed");
}

double metric(const Metrics& metrics, const std::string& name) {
  for (const auto& [n, v] : metrics)
    if (n == name) return v;
  return NAN;
}

double last_logged(const std::filesystem::path& path, const std::string& name) {
  std::ifstream in(path);
  double last = NAN;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains(name) && j[name].is_number()) last = j[name].get<double>();
  }
  return last;
}

}  // namespace lockstep
