// rl/console.cpp
#include "rl/console.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/device.h"
#include "rl/setup.h"

namespace lockstep {

namespace {

// `text` shortened from the left to `width` columns ("...ls/Qwen3-1.7B").
std::string fit_left(std::string_view text, size_t width) {
  if (text.size() <= width) return std::string(text);
  if (width <= 3) return std::string(text.substr(text.size() - width));
  std::string out = "...";
  out.append(text.substr(text.size() - (width - 3)));
  return out;
}

// `head` followed by as many of `fields` (two spaces apart) as fit in kConsoleColumns.
std::string join_fitting(std::string head, const std::vector<std::string>& fields) {
  for (const std::string& f : fields) {
    if (f.empty()) continue;
    if (head.size() + 2 + f.size() > kConsoleColumns) break;
    head += "  " + f;
  }
  return head;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = std::llround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string format_count(double count) {
  constexpr std::pair<double, const char*> kUnits[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}};
  for (const auto& [unit, suffix] : kUnits) {
    if (count < unit) continue;
    const double v = count / unit;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f%s", v >= 100 ? 0 : v >= 10 ? 1 : 2, v, suffix);
    return buf;
  }
  return std::to_string(std::llround(count));
}

std::string metric_field(std::string_view name, double value) {
  if (std::isnan(value)) return "";
  char buf[32];
  if (value != 0 && (std::abs(value) < 1e-2 || std::abs(value) >= 1e5))
    std::snprintf(buf, sizeof buf, "%.2g", value);
  else
    std::snprintf(buf, sizeof buf, "%.3g", value);
  return std::string(name) + " " + buf;
}

std::string run_header(std::string_view command, const Setup& setup, std::string_view model_source,
                       std::string_view out_dir) {
  std::string device;
  if (setup.device == Device::cuda) {
    device = cuda_device_name();
  } else {
    const int threads = omp_get_max_threads();
    device = "CPU (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
  }
  const ModelConfig& m = setup.model_config;
  const std::string facts = " (" + std::string(model_type_name(m.family)) + ", " +
                            format_count(double(parameter_count(m))) + " parameters)";
  std::string precision = setup.config.model.precision;
  if (setup.config.model.kv_cache == "fp8") precision += ", fp8 KV cache";
  const std::string head = "lockstep " + std::string(command) + " | " + device + " | ";
  const std::string middle = facts + " | " + precision + (out_dir.empty() ? "" : " | ");
  // The two paths share what is left of the line: the model's first, the folder keeping at least
  // 16 columns or half the room (both are cut from the left, where a path says least).
  const size_t fixed = head.size() + middle.size();
  const size_t room = fixed + 8 < kConsoleColumns ? kConsoleColumns - fixed : 8;
  const size_t for_out =
      out_dir.empty() ? 0
                      : std::min(out_dir.size(), std::max(std::min<size_t>(16, room / 2),
                                                          room - std::min(room, model_source.size())));
  return head + fit_left(model_source, room - for_out) + middle + fit_left(out_dir, for_out);
}

ConsoleSink ConsoleSink::standard_output() {
  ConsoleSink s;
  s.write = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  const char* term = std::getenv("TERM");
  s.live = isatty(fileno(stdout)) && !(term && std::string_view(term) == "dumb");
  s.now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  return s;
}

Progress::Progress(std::string phase, int64_t total, int64_t done, ConsoleSink sink)
    : phase_(std::move(phase)), total_(total), first_(done), sink_(std::move(sink)), start_(sink_.now()) {}

Progress::~Progress() {
  if (bar_shown_) sink_.write("\n");
}

std::string Progress::counts(int64_t done) const {
  const double elapsed = sink_.now() - start_;
  const double left = done > first_ ? elapsed / double(done - first_) * double(total_ - done) : NAN;
  const int width = int(std::to_string(total_).size());
  char buf[96];
  std::snprintf(buf, sizeof buf, "%*lld/%lld  %s elapsed, %s left", width, (long long)done,
                (long long)total_, format_duration(elapsed).c_str(), format_duration(left).c_str());
  return buf;
}

std::string Progress::label() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%-4s ", phase_.c_str());
  return buf;
}

std::string Progress::line_text(int64_t done, const std::vector<std::string>& fields) const {
  return join_fitting(label() + counts(done), fields);
}

std::string Progress::bar_text(int64_t done, const std::vector<std::string>& status) const {
  constexpr int kBarWidth = 20;
  const double fraction = total_ > 0 ? std::clamp(double(done) / double(total_), 0.0, 1.0) : 1.0;
  const int filled = int(fraction * kBarWidth);
  std::string head = label() + "[";
  head.append(size_t(filled), '#');
  head.append(size_t(kBarWidth - filled), '.');
  head += "] " + counts(done);
  return join_fitting(std::move(head), status);
}

void Progress::clear_bar() {
  if (bar_shown_) sink_.write("\r\x1b[K");  // to the line's start, erase to its end
  bar_shown_ = false;
}

void Progress::update(int64_t done, std::vector<std::string> status, bool now) {
  if (!sink_.live) return;
  const double t = sink_.now();
  if (!now && bar_shown_ && done < total_ && t - last_draw_ < 0.1) return;
  last_draw_ = t;
  const std::string text = bar_text(done, status);
  clear_bar();
  sink_.write(text);
  bar_shown_ = true;
}

void Progress::line(int64_t done, const std::vector<std::string>& fields) {
  const std::string text = line_text(done, fields) + "\n";
  if (!sink_.live) {
    sink_.write(text);
    return;
  }
  const bool redraw = bar_shown_;
  clear_bar();
  sink_.write(text);
  if (redraw) {  // without its status, which the line that stays has said (or outdated)
    last_draw_ = -1;
    update(done);
  }
}

}  // namespace lockstep
