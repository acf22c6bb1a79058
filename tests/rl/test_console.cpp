// rl/console: the run's first line and the progress output, driven by a fake clock into a string:
// exact texts in a log (no carriage returns or escapes), the live bar redrawn in place on a
// terminal, the estimate of the time left (steps before a resume not counted), and every line
// within kConsoleColumns with fields left out whole, never cut.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "rl/console.h"
#include "rl/setup.h"
#include "tests/io/io_test_helpers.h"

namespace lockstep {
namespace {

using testing::TempDir;

struct FakeConsole {
  std::string text;
  double time = 0;
  ConsoleSink sink(bool live) {
    return {[this](std::string_view s) { text += s; }, live, [this] { return time; }};
  }
};

TEST(Console, Durations) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(65.4), "1:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(NAN), "?");
  EXPECT_EQ(format_duration(-1), "?");
}

TEST(Console, Counts) {
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(412'416), "412k");
  EXPECT_EQ(format_count(1'720'574'976), "1.72B");
  EXPECT_EQ(format_count(15'300'000), "15.3M");
}

TEST(Console, MetricFields) {
  EXPECT_EQ(metric_field("reward", 0.40625), "reward 0.406");
  EXPECT_EQ(metric_field("mismatch", 0), "mismatch 0");
  EXPECT_EQ(metric_field("mismatch", 0.00012345), "mismatch 0.00012");
  EXPECT_EQ(metric_field("tok/s", 123456), "tok/s 1.2e+05");
  EXPECT_EQ(metric_field("eval greedy", NAN), "");
}

// In a log only line() writes, one plain line each, with elapsed time and the time left.
TEST(Console, LogGetsPlainLines) {
  FakeConsole console;
  {
    Progress progress("grpo", 300, 0, console.sink(false));
    console.time = 4;
    progress.update(40, {"reward 0.5"});
    EXPECT_EQ(console.text, "");
    console.time = 10;
    progress.line(100, {"reward 0.5", "", "eval greedy 0.4"});
    progress.line(0, {});
  }
  EXPECT_EQ(console.text,
            "grpo 100/300  0:10 elapsed, 0:20 left  reward 0.5  eval greedy 0.4\n"
            "grpo   0/300  0:10 elapsed, ? left\n");
}

// A resumed phase: the rate comes from the steps this process ran.
TEST(Console, TimeLeftCountsOnlyThisProcessSteps) {
  FakeConsole console;
  Progress progress("sft", 900, 600, console.sink(false));
  console.time = 30;
  progress.line(750, {});
  EXPECT_EQ(console.text, "sft  750/900  0:30 elapsed, 0:30 left\n");
}

// On a terminal: a bar redrawn in place (at most every 0.1 s), lines that stay above it (the bar
// redrawn under them without its status), and the bar's line ended when the phase ends.
TEST(Console, TerminalGetsALiveBar) {
  FakeConsole console;
  {
    Progress progress("sft", 10, 0, console.sink(true));
    console.time = 1;
    progress.update(1, {"loss 2.5"});
    EXPECT_EQ(console.text, "sft  [##..................]  1/10  0:01 elapsed, 0:09 left  loss 2.5");
    console.text.clear();
    console.time = 1.05;
    progress.update(2, {"loss 2.4"});
    EXPECT_EQ(console.text, "");  // too soon
    progress.update(2, {"evaluating"}, /*now=*/true);
    EXPECT_EQ(console.text, "\r\x1b[Ksft  [####................]  2/10  0:01 elapsed, 0:04 left  evaluating");
    console.text.clear();
    console.time = 2;
    progress.line(5, {"loss 2"});
    EXPECT_EQ(console.text,
              "\r\x1b[Ksft   5/10  0:02 elapsed, 0:02 left  loss 2\n"
              "sft  [##########..........]  5/10  0:02 elapsed, 0:02 left");
    console.text.clear();
  }
  EXPECT_EQ(console.text, "\n");
}

// Fields go in order while they fit; the first that does not fit ends the line, which stays within
// kConsoleColumns; no field is cut.
TEST(Console, LinesFitTheConsole) {
  FakeConsole console;
  Progress progress("grpo", 100000, 0, console.sink(false));
  const std::vector<std::string> fields = {"reward 0.406", "eval greedy 0.398", "sampled 0.352",
                                           "len 3.12",     "entropy 0.0412",    "mismatch 0",
                                           "tok/s 1.2e+05", "a-very-long-field-that-cannot-fit-anymore"};
  const std::string line = progress.line_text(12345, fields);
  EXPECT_LE(line.size(), kConsoleColumns) << line;
  EXPECT_NE(line.find("  sampled 0.352"), std::string::npos) << line;
  EXPECT_EQ(line.find("len"), std::string::npos) << line;
  for (size_t at = line.find("  ", 20); at != std::string::npos; at = line.find("  ", at + 2)) {
    const size_t end = line.find("  ", at + 2);
    const std::string field = line.substr(at + 2, end == std::string::npos ? std::string::npos : end - at - 2);
    if (field.find("elapsed") != std::string::npos) continue;
    EXPECT_NE(std::find(fields.begin(), fields.end(), field), fields.end()) << "'" << field << "' was cut";
  }
  EXPECT_LE(progress.bar_text(12345, fields).size(), kConsoleColumns);
}

// The first line: subcommand, device, model source, family and size, precision, folder.
TEST(Console, RunHeaderSaysWhatRuns) {
  TempDir dir;
  Config config;
  config.model.device = "cpu";
  config.model.kv_cache = "fp8";
  config.run.out_dir = dir.file("run");
  const lockstep::Setup setup = make_setup(config, /*need_data=*/false);
  const std::string header = run_header("train", setup, "builtin", config.run.out_dir);
  EXPECT_EQ(header.rfind("lockstep train | CPU (", 0), 0u) << header;
  for (const char* part : {") | builtin (qwen3, ", "k parameters) | fp8, fp8 KV cache | "})
    EXPECT_NE(header.find(part), std::string::npos) << part << " not in " << header;
  EXPECT_LE(header.size(), kConsoleColumns);
  EXPECT_NE(header.find("/run"), std::string::npos) << header;  // the folder, maybe cut from the left

  const std::string long_path = "/models/" + std::string(120, 'x') + "/Qwen3-1.7B";
  const std::string cut = run_header("eval", setup, long_path, "");
  EXPECT_LE(cut.size(), kConsoleColumns) << cut;
  EXPECT_NE(cut.find("...xxx"), std::string::npos) << cut;
  EXPECT_NE(cut.find("/Qwen3-1.7B (qwen3, "), std::string::npos) << cut;
}

}  // namespace
}  // namespace lockstep
