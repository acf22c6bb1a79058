// rl/console.h — what a run prints on the console: one line saying what runs, then the progress of
// each phase (SFT, GRPO, evaluation) with the elapsed time and an estimate of the time left.
//
// Two forms of progress, chosen by whether stdout is a terminal (isatty, and TERM is not "dumb"):
//   - on a terminal, a live bar redrawn in place ("\r", at most 10 times a second), with the
//     lines that stay (metrics at evaluations) printed above it;
//   - in a log (a file, a pipe, CI), only the lines that stay: no carriage returns, no escapes.
// Every line, bar included, fits kConsoleColumns columns: a status that does not fit is cut at a
// field boundary (ProgressLine::fields), never in the middle of a number.
//
// The estimate of the time left is the mean time per step over the steps this process ran
// (steps done before a resume do not count), times the steps left; it is "?" before the first.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

struct Setup;

inline constexpr size_t kConsoleColumns = 100;

// "lockstep train | CPU (2 threads) | builtin (qwen3, 412k parameters) | fp8 | runs/default": the
// subcommand, the device (the GPU's name, or the CPU and its OpenMP threads), the model (where its
// weights come from: `model_source`, its family and parameter count), the precision mode (and an
// fp8 KV cache), and the output folder when `out_dir` is not empty. At most kConsoleColumns
// columns: long paths are shortened from the left ("...").
std::string run_header(std::string_view command, const Setup& setup, std::string_view model_source,
                       std::string_view out_dir);

// 0:07, 12:05, 1:02:03 (hours:minutes:seconds); "?" for a negative or non-finite time.
std::string format_duration(double seconds);

// "412k", "1.72B", "15.3M", "999": a count with three significant digits and a unit.
std::string format_count(double count);

// Where progress goes and how: for tests, the text can go to a string and the clock be a fake.
struct ConsoleSink {
  std::function<void(std::string_view)> write;  // the bytes, as a terminal would receive them
  bool live = false;                             // a terminal: draw the live bar
  std::function<double()> now;                   // seconds on a steady clock

  // stdout; live when it is a terminal and TERM is not "dumb".
  static ConsoleSink standard_output();
};

class Progress {
 public:
  // A phase of `total` steps ("sft", "grpo", "eval"); `done` of them were done before (a resumed
  // run). The bar appears at the first update.
  Progress(std::string phase, int64_t total, int64_t done, ConsoleSink sink = ConsoleSink::standard_output());
  ~Progress();  // ends the bar's line, when one is drawn
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` steps are done; `status` (short fields: "reward 0.41") follows the counts on the bar,
  // redrawn at most every 0.1 s unless `now` (a status that must show: "evaluating").
  void update(int64_t done, std::vector<std::string> status = {}, bool now = false);
  // A line that stays: the phase, the counts, elapsed and left, then `fields` (those that fit).
  // On a terminal it is printed above the bar, which is redrawn below it without a status.
  void line(int64_t done, const std::vector<std::string>& fields);

  // The text of line() without printing it (what tests check).
  std::string line_text(int64_t done, const std::vector<std::string>& fields) const;
  std::string bar_text(int64_t done, const std::vector<std::string>& status) const;

 private:
  std::string label() const;               // "sft  ", "grpo ": the phase, padded
  std::string counts(int64_t done) const;  // "125/300  0:24 elapsed, 0:33 left"
  void clear_bar();

  std::string phase_;
  int64_t total_, first_;
  ConsoleSink sink_;
  double start_;
  double last_draw_ = -1;
  bool bar_shown_ = false;
};

// "name value" with the value to 3 significant digits ("reward 0.406", "loss 1.2e-3"); empty when
// the value is NaN (not measured at this step).
std::string metric_field(std::string_view name, double value);

}  // namespace lockstep
