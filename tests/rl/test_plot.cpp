// rl/plot and io/png: the PNG writer checked by an independent minimal reader (signature, chunk
// order, IHDR fields, every CRC, inflated pixels equal to the input bit for bit), and plot_run's
// picture checked by where each series' exact colour lands: in its own panel only, a rising reward
// drawn rising, the time stack in order, a gap where a value is null and a line across steps where
// a field is absent. The picture is drawn without anti-aliasing, so colours are exact and every
// check is an exact pixel count or position; no tolerance is needed.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "io/file_io.h"
#include "io/png.h"
#include "rl/plot.h"
#include "tests/io/io_test_helpers.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_bytes;

// --- a minimal PNG reader: 8-bit RGB, filter type None, as io/png.h promises --------------------

struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::vector<std::string> chunks;  // chunk types in file order
  Rgb at(uint32_t x, uint32_t y) const {
    const uint8_t* p = &rgb[(size_t(y) * width + x) * 3];
    return {p[0], p[1], p[2]};
  }
};

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
         uint32_t(uint8_t(s[at + 3]));
}

// Throws std::runtime_error on anything a PNG decoder would reject.
Image read_png(const std::string& path) {
  const std::string file = read_file(path, "png");
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("bad PNG: " + what);
  };
  check(file.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0, "signature");
  Image image;
  std::string idat;
  size_t at = 8;
  while (at < file.size()) {
    check(at + 12 <= file.size(), "truncated chunk header");
    const uint32_t length = be32(file, at);
    check(at + 12 + length <= file.size(), "truncated chunk");
    const std::string type = file.substr(at + 4, 4), data = file.substr(at + 8, length);
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(file.data() + at + 4), length + 4);
    check(be32(file, at + 8 + length) == crc, type + " CRC");
    check(!image.chunks.empty() || type == "IHDR", "IHDR must come first");
    check(image.chunks.empty() || image.chunks.back() != "IEND", "data after IEND");
    image.chunks.push_back(type);
    if (type == "IHDR") {
      check(length == 13, "IHDR length");
      image.width = be32(data, 0), image.height = be32(data, 4);
      check(data.substr(8) == std::string("\x08\x02\x00\x00\x00", 5), "IHDR depth/colour/methods");
    } else if (type == "IDAT") {
      idat += data;
    } else {
      check(type == "IEND" && length == 0, "unexpected chunk " + type);
    }
    at += 12 + length;
  }
  check(!image.chunks.empty() && image.chunks.back() == "IEND", "no IEND");
  const size_t row = size_t(image.width) * 3 + 1;
  std::vector<uint8_t> raw(row * image.height + 1);  // one spare byte: more data than rows is an error
  uLongf raw_size = raw.size();
  check(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) == Z_OK,
        "zlib stream");
  check(raw_size == row * image.height, "inflated size");
  for (uint32_t y = 0; y < image.height; ++y) {
    check(raw[y * row] == 0, "filter type");
    image.rgb.insert(image.rgb.end(), raw.begin() + ptrdiff_t(y * row + 1), raw.begin() + ptrdiff_t((y + 1) * row));
  }
  return image;
}

TEST(Png, SmallKnownImageDecodes) {
  TempDir dir;
  const std::vector<uint8_t> rgb = {255, 0,  0,  0,   255, 0,  0,  0,  255,  // red green blue
                                    17,  34, 51, 255, 255, 255, 0, 0,  0};   // a grey, white, black
  write_png(dir.file("small.png"), 3, 2, rgb);
  const Image image = read_png(dir.file("small.png"));
  EXPECT_EQ(image.width, 3u);
  EXPECT_EQ(image.height, 2u);
  EXPECT_EQ(image.chunks, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  EXPECT_EQ(image.rgb, rgb);
  EXPECT_EQ(image.at(0, 1), (Rgb{17, 34, 51}));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"small.png"});  // no temporary file left behind
}

TEST(Png, NoiseImageSpansSeveralIdatChunks) {
  TempDir dir;
  const uint32_t width = 1000, height = 700;  // 2.1 MB of incompressible bytes: three IDAT chunks
  std::vector<uint8_t> rgb(size_t(width) * height * 3);
  std::mt19937 rng(7);
  for (uint8_t& b : rgb) b = uint8_t(rng());
  write_png(dir.file("noise.png"), width, height, rgb);
  const Image image = read_png(dir.file("noise.png"));
  EXPECT_EQ(image.width, width);
  EXPECT_EQ(image.height, height);
  EXPECT_EQ(std::count(image.chunks.begin(), image.chunks.end(), "IDAT"), 3);
  EXPECT_TRUE(image.rgb == rgb);
}

TEST(Png, BadArgumentsAreErrors) {
  TempDir dir;
  const std::vector<uint8_t> rgb(12, 7);
  expect_error([&] { write_png(dir.file("a.png"), 2, 3, rgb); }, {"a.png", "rgb", "2*3*3", "12"});
  expect_error([&] { write_png(dir.file("a.png"), 0, 4, rgb); }, {"a.png", "width and height", "0 x 4"});
  expect_error([&] { write_png(dir.file("missing/a.png"), 2, 2, rgb); }, {"cannot write", "missing/a.png"});
  EXPECT_TRUE(dir.list().empty());
}

// --- plot_run ----------------------------------------------------------------------------------

// Pixels of one colour inside a region of the picture.
struct Hits {
  std::vector<uint32_t> xs, ys;
  size_t count() const { return xs.size(); }
};

Hits find(const Image& image, Rgb colour, uint32_t x0, uint32_t y0, uint32_t x1, uint32_t y1) {
  Hits hits;
  for (uint32_t y = y0; y < y1; ++y)
    for (uint32_t x = x0; x < x1; ++x)
      if (image.at(x, y) == colour) hits.xs.push_back(x), hits.ys.push_back(y);
  return hits;
}

// The panels fill the picture below its header strip, kPlotColumns across, row by row; their plot
// areas lie below the legend strip, which takes at most a panel's top fifth: below it is data only.
struct PanelRect {
  uint32_t x0, y0, x1, y1;
};
PanelRect panel_rect(int panel) {
  const uint32_t w = kPlotWidth / kPlotColumns, h = (kPlotHeight - kPlotHeaderHeight) / kPlotRows;
  const uint32_t col = uint32_t(panel % kPlotColumns), row = uint32_t(panel / kPlotColumns);
  return {col * w, kPlotHeaderHeight + row * h, (col + 1) * w, kPlotHeaderHeight + (row + 1) * h};
}
Hits find_in_panel(const Image& image, Rgb colour, int panel, bool data_only) {
  const PanelRect q = panel_rect(panel);
  return find(image, colour, q.x0, data_only ? q.y0 + (q.y1 - q.y0) / 5 : q.y0, q.x1, q.y1);
}

// Every metric the loop writes, steps 0..steps-1: reward and accuracy rising linearly (a zigzag on
// top), eval every steps/10 steps on a line of its own (merged into the step's record), mismatch
// metrics spanning decades, the mismatch by position (its third bin empty), the time split,
// throughput and response length; plus fields plot_run ignores. Lines are
// written in a shuffled order: the plot sorts by step.
std::string full_metrics(int steps = 100) {
  std::vector<std::string> lines;
  for (int s = 0; s < steps; ++s) {
    const double t = s / (steps - 1.0), zigzag = (s % 2 ? 0.03 : -0.03);
    const double k = 1e-4 * steps;  // the mismatch by position: runs of different lengths differ
    std::ostringstream line;
    line << R"({"step": )" << s << R"(, "reward_mean": )" << 0.1 + 0.8 * t + zigzag << R"(, "accuracy": )"
         << 0.05 + 0.7 * t << R"(, "mismatch_abs": )" << 0.02 * (1 - 0.5 * t) << R"(, "mismatch_mult_prob_error": )"
         << 1.01 << R"(, "mismatch_k3": )" << 2e-4 * (1 + t) << R"(, "tis_clip_frac": )" << 3e-3
         << R"(, "time_rollout": )" << 10 + 2 * t << R"(, "time_scoring": 1.5, "time_recompute": 3, "time_update": )"
         << 6 << R"(, "time_handover": 0.9, "tokens_per_s": )" << 20000 + 5000 * t
         << R"(, "response_length": )" << 4 + 2 * t << R"(, "lr": 1e-6, "entropy": 0.5, "note": "ignored")"
         << R"(, "mismatch_abs_by_position": [)" << k << ", " << 2 * k << ", null, " << 4 * k
         << R"(], "mismatch_tokens_by_position": [50, 40, 0, 9]})";
    lines.push_back(line.str());
    if (s % (steps / 10) == 0)
      lines.push_back(R"({"step": )" + std::to_string(s) + R"(, "eval_accuracy_greedy": )" +
                      std::to_string(0.2 + 0.5 * t) + R"(, "eval_accuracy_sampled": )" + std::to_string(0.1 + 0.4 * t) +
                      "}");
  }
  // Shuffle whole steps, keeping each step's eval line after its train line (later values win).
  std::mt19937 rng(3);
  std::shuffle(lines.begin(), lines.end(), rng);
  std::stable_partition(lines.begin(), lines.end(), [](const std::string& l) { return l.find("eval") == l.npos; });
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

// SFT's metrics, steps 1..steps: the loss falling from 2.5 to 0.05 (geometrically), eval every
// steps/5 steps on the step's line, as rl/train.cpp writes them; `scale` multiplies the loss.
std::string sft_metrics(int steps = 200, double scale = 1) {
  std::string text;
  for (int s = 1; s <= steps; ++s) {
    const double t = (s - 1) / (steps - 1.0);
    text += R"({"step": )" + std::to_string(s) + R"(, "loss": )" + std::to_string(scale * 2.5 * std::pow(0.02, t)) +
            R"(, "lr": 0.002, "grad_norm": 1.5, "skipped": 0, "time_step": 0.05)";
    if (s % (steps / 5) == 0)
      text += R"(, "eval_accuracy_greedy": )" + std::to_string(0.2 * t) + R"(, "eval_accuracy_sampled": )" +
              std::to_string(0.15 * t);
    text += "}\n";
  }
  return text;
}

const char* const kPanelFields[kPlotPanels][5] = {
    {"reward_mean", "accuracy", nullptr, nullptr, nullptr},
    {"eval_accuracy_greedy", "eval_accuracy_sampled", nullptr, nullptr, nullptr},
    {"mismatch_abs", "mismatch_mult_prob_error", "mismatch_k3", "tis_clip_frac", nullptr},
    {"mismatch_abs_by_position", nullptr, nullptr, nullptr, nullptr},
    {"time_rollout", "time_scoring", "time_recompute", "time_update", "time_handover"},
    {"tokens_per_s", nullptr, nullptr, nullptr, nullptr},
    {"response_length", nullptr, nullptr, nullptr, nullptr},
    {"sft_loss", nullptr, nullptr, nullptr, nullptr},
};
constexpr int kRewardPanel = 0, kEvalPanel = 1, kTimePanel = 4, kThroughputPanel = 5, kSftPanel = 7;
static_assert(kMismatchPositionPanel == 3);

int panel_of(std::string_view field) {
  for (int panel = 0; panel < kPlotPanels; ++panel)
    for (const char* f : kPanelFields[panel])
      if (f && f == field) return panel;
  throw std::runtime_error("no panel for " + std::string(field));
}

class Plot : public ::testing::Test {
 protected:
  // Writes the run's metrics (an empty text: no such file) and plots the folder.
  Image plot(const std::string& metrics, const std::string& sft = "") {
    if (!metrics.empty()) write_bytes(dir.file("metrics.jsonl"), metrics);
    if (!sft.empty()) write_bytes(dir.file("sft_metrics.jsonl"), sft);
    plot_run(dir.path(), dir.file("run.png"));
    return read_png(dir.file("run.png"));
  }
  TempDir dir;
};

TEST_F(Plot, EverySeriesIsDrawnInItsOwnPanelOnly) {
  const Image image = plot(full_metrics(), sft_metrics());
  ASSERT_EQ(image.width, uint32_t(kPlotWidth));
  ASSERT_EQ(image.height, uint32_t(kPlotHeight));
  for (int panel = 0; panel < kPlotPanels; ++panel)
    for (const char* field : kPanelFields[panel]) {
      if (!field) continue;
      const Rgb colour = series_colour(field);
      // A 2-px line or a band across the plot area has well over 1000 pixels; overlaps hide some.
      EXPECT_GT(find_in_panel(image, colour, panel, true).count(), 300u) << field;
      for (int other = 0; other < kPlotPanels; ++other)
        if (other != panel) {
          EXPECT_EQ(find_in_panel(image, colour, other, false).count(), 0u) << field;
        }
    }
}

// 100 steps are drawn as they are; 2000 (denser than a point per 2 px) as a tinted band under a
// moving average in the series colour.
class RisingReward : public Plot, public ::testing::WithParamInterface<int> {};

TEST_P(RisingReward, IsDrawnRising) {
  const Image image = plot(full_metrics(GetParam()));
  const Hits reward = find_in_panel(image, series_colour("reward_mean"), 0, true);
  ASSERT_GT(reward.count(), 0u);
  const auto [x_min, x_max] = std::minmax_element(reward.xs.begin(), reward.xs.end());
  const uint32_t quarter = (*x_max - *x_min) / 4;
  uint32_t left_lowest = 0, right_lowest = 0, left_highest = UINT32_MAX, right_highest = UINT32_MAX;
  for (size_t i = 0; i < reward.count(); ++i) {  // rows grow downwards
    const uint32_t x = reward.xs[i], y = reward.ys[i];
    if (x <= *x_min + quarter) left_lowest = std::max(left_lowest, y), left_highest = std::min(left_highest, y);
    if (x >= *x_max - quarter) right_lowest = std::max(right_lowest, y), right_highest = std::min(right_highest, y);
  }
  // Reward 0.1 → 0.9 over a plot area ~350 px tall: the right quarter sits ≥ 100 px above the left.
  EXPECT_GT(left_lowest, right_lowest + 100);
  EXPECT_GT(left_highest, right_highest + 100);
}
INSTANTIATE_TEST_SUITE_P(Plot, RisingReward, ::testing::Values(100, 2000));

TEST_F(Plot, TimeSplitIsStackedBottomToTop) {
  const Image image = plot(full_metrics());
  double previous_mean_row = kPlotHeight;
  for (const char* field : kPanelFields[kTimePanel]) {
    const Hits hits = find_in_panel(image, series_colour(field), kTimePanel, true);
    ASSERT_GT(hits.count(), 0u) << field;
    double mean_row = 0;
    for (const uint32_t y : hits.ys) mean_row += y;
    mean_row /= double(hits.count());
    EXPECT_LT(mean_row, previous_mean_row) << field << " is not above the component under it";
    previous_mean_row = mean_row;
  }
}

// Distinct columns holding the field's colour in the middle tenth of its x extent in its panel, and
// the number of columns there.
std::pair<size_t, size_t> columns_in_middle(const Image& image, const char* field) {
  const Hits hits = find_in_panel(image, series_colour(field), panel_of(field), true);
  if (hits.count() == 0) return {0, 0};
  const auto [x_min, x_max] = std::minmax_element(hits.xs.begin(), hits.xs.end());
  const uint32_t from = *x_min + (*x_max - *x_min) * 45 / 100, to = *x_min + (*x_max - *x_min) * 55 / 100;
  std::vector<uint32_t> columns;
  for (const uint32_t x : hits.xs)
    if (x >= from && x <= to) columns.push_back(x);
  std::sort(columns.begin(), columns.end());
  return {size_t(std::unique(columns.begin(), columns.end()) - columns.begin()), size_t(to - from + 1)};
}

// Absent = not measured: eval (every 10 steps) is one connected line. Null = missing: a gap.
TEST_F(Plot, NullBreaksTheLineAbsentDoesNot) {
  std::string metrics;
  for (int s = 0; s < 100; ++s) {
    const bool missing = s >= 40 && s < 60;
    metrics += R"({"step": )" + std::to_string(s) + R"(, "reward_mean": )" + (missing ? "null" : "0.5") +
               R"(, "accuracy": 0.4)" + (s % 10 == 0 ? R"(, "eval_accuracy_greedy": 0.45)" : "") + "}\n";
  }
  const Image image = plot(metrics);
  EXPECT_EQ(columns_in_middle(image, "reward_mean").first, 0u);  // steps 40..59 are null
  const auto [eval_columns, width] = columns_in_middle(image, "eval_accuracy_greedy");
  EXPECT_EQ(eval_columns, width);  // steps 40 and 50 joined across the steps without eval
  // accuracy, dashed, is not interrupted by the null rewards: dashes across the middle.
  const auto [accuracy_columns, accuracy_width] = columns_in_middle(image, "accuracy");
  EXPECT_GE(accuracy_columns * 2, accuracy_width);
}

// Later lines of a step add to its record and override its fields: a resumed run rewriting steps
// 40..59 with null rewards leaves a gap, and accuracy logged on separate lines keeps the rewards.
TEST_F(Plot, LinesOfOneStepAreMerged) {
  std::string metrics;
  for (int s = 0; s < 100; ++s) metrics += R"({"step": )" + std::to_string(s) + R"(, "reward_mean": 0.5})" "\n";
  for (int s = 0; s < 100; ++s) metrics += R"({"step": )" + std::to_string(s) + R"(, "accuracy": 0.4})" "\n";
  for (int s = 40; s < 60; ++s) metrics += R"({"step": )" + std::to_string(s) + R"(, "reward_mean": null})" "\n";
  const Image image = plot(metrics);
  EXPECT_GT(find_in_panel(image, series_colour("reward_mean"), 0, true).count(), 300u);
  EXPECT_EQ(columns_in_middle(image, "reward_mean").first, 0u);
  const auto [accuracy_columns, width] = columns_in_middle(image, "accuracy");
  EXPECT_GE(accuracy_columns * 2, width);  // dashed, but there
}

TEST_F(Plot, MissingFieldsAreLeftOut) {
  std::string metrics;
  for (int s = 1; s <= 30; ++s) metrics += R"({"step": )" + std::to_string(s * 10) + R"(, "reward_mean": 0.3})" "\n";
  const Image image = plot(metrics);
  ASSERT_EQ(image.width, uint32_t(kPlotWidth));
  EXPECT_GT(find_in_panel(image, series_colour("reward_mean"), 0, true).count(), 300u);
  for (const char* field : {"accuracy", "eval_accuracy_greedy", "mismatch_abs", "time_rollout", "tokens_per_s"})
    EXPECT_EQ(find(image, series_colour(field), 0, 0, kPlotWidth, kPlotHeight).count(), 0u) << field;
}

TEST_F(Plot, OneStepIsEnough) {
  const Image image = plot(R"({"step": 3, "reward_mean": 0.7, "time_rollout": 2, "tokens_per_s": 900})" "\n");
  EXPECT_GT(find_in_panel(image, series_colour("reward_mean"), 0, true).count(), 0u);    // a marker
  EXPECT_GT(find_in_panel(image, series_colour("time_rollout"), kTimePanel, true).count(), 0u);  // a thin bar
  EXPECT_GT(find_in_panel(image, series_colour("tokens_per_s"), kThroughputPanel, true).count(), 0u);
}

TEST_F(Plot, MalformedLinesNameFileAndLine) {
  const std::string good = R"({"step": 1, "reward_mean": 0.5})" "\n";
  const struct {
    std::string text;
    std::vector<std::string_view> parts;
  } cases[] = {
      {good + "\n" + "{\"step\": 2, \"reward_mean\": 0.5\n", {"metrics.jsonl:3:", "invalid JSON"}},
      {good + "[1, 2]\n", {"metrics.jsonl:2:", "JSON object", "array"}},
      {good + R"({"step": 2, "reward_mean": 1e400})" "\n", {"metrics.jsonl:2:", "invalid JSON", "overflow"}},
      {good + R"({"reward_mean": 0.5})" "\n", {"metrics.jsonl:2:", "\"step\" is missing"}},
      {R"({"step": "3"})" "\n", {"metrics.jsonl:1:", "\"step\" must be a finite number", "string"}},
      {good + good + R"({"step": 4, "accuracy": "high"})" "\r\n",
       {"metrics.jsonl:3:", "\"accuracy\"", "number or null", "string"}},
      {"\n \n", {"metrics.jsonl", "no metrics"}},
  };
  for (const auto& c : cases) {
    write_bytes(dir.file("metrics.jsonl"), c.text);
    try {
      plot_run(dir.path(), dir.file("run.png"));
      ADD_FAILURE() << "no error for: " << c.text;
    } catch (const Error& e) {
      for (std::string_view part : c.parts)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    }
  }
  expect_error([&] { plot_run(dir.path() / "absent", dir.file("run.png")); },
               {"absent", "no metrics.jsonl or sft_metrics.jsonl"});
  expect_error([] { series_colour("lr"); }, {"\"lr\"", "not a plotted"});
  EXPECT_EQ(dir.list(), std::vector<std::string>{"metrics.jsonl"});  // no picture, no temporary file
}

// The SFT phase: its loss in its own panel, falling; its evaluations in panel (a) to the left of
// GRPO's (SFT steps are plotted before step 0), and its end joined to GRPO's first evaluation.
TEST_F(Plot, SftPhaseIsPlottedBeforeGrpo) {
  const Image image = plot(full_metrics(), sft_metrics());
  const Hits loss = find_in_panel(image, series_colour("sft_loss"), kSftPanel, true);
  ASSERT_GT(loss.count(), 300u);
  const auto [x_min, x_max] = std::minmax_element(loss.xs.begin(), loss.xs.end());
  double left_row = 0, right_row = 0, left_n = 0, right_n = 0;
  for (size_t i = 0; i < loss.count(); ++i) {
    if (loss.xs[i] < *x_min + (*x_max - *x_min) / 4) left_row += loss.ys[i], ++left_n;
    if (loss.xs[i] > *x_max - (*x_max - *x_min) / 4) right_row += loss.ys[i], ++right_n;
  }
  EXPECT_LT(left_row / left_n + 60, right_row / right_n);  // rows grow downwards: falling

  // Panel (b): SFT's evaluations (every 40 of its 200 steps, the last at step 0) and GRPO's (every
  // 10 of its 100 steps) on one axis from -199 to 99: the first SFT evaluation, at step -159, sits
  // (-159 + 199) / 298 of the way along, GRPO's first, at step 0, about two thirds of the way.
  const Hits eval = find_in_panel(image, series_colour("eval_accuracy_greedy"), kEvalPanel, true);
  ASSERT_GT(eval.count(), 0u);
  const auto [eval_left, eval_right] = std::minmax_element(eval.xs.begin(), eval.xs.end());
  const double left_fraction = double(*eval_left - panel_rect(kEvalPanel).x0) / double(kPlotWidth / kPlotColumns);
  EXPECT_GT(left_fraction, 0.12 + 0.1);  // 40/298 of the plot area, which starts 96 px in
  EXPECT_LT(left_fraction, 0.12 + 0.2);
  EXPECT_GT(*eval_right - *eval_left, 400u);
  const auto [eval_columns, width] = columns_in_middle(image, "eval_accuracy_greedy");
  EXPECT_EQ(eval_columns, width);  // one line from SFT into GRPO
}

TEST_F(Plot, SftOnlyRunIsPlotted) {
  const Image image = plot("", sft_metrics());
  EXPECT_GT(find_in_panel(image, series_colour("sft_loss"), kSftPanel, true).count(), 300u);
  EXPECT_GT(find_in_panel(image, series_colour("eval_accuracy_greedy"), kEvalPanel, true).count(), 100u);
  EXPECT_EQ(find(image, series_colour("reward_mean"), 0, 0, kPlotWidth, kPlotHeight).count(), 0u);
}

// Binary rewards make train reward and train accuracy the same numbers: the accuracy is dashed, so
// both colours show along the whole line.
TEST_F(Plot, EqualSeriesStayDistinguishable) {
  std::string metrics;
  for (int s = 0; s < 100; ++s) {
    const std::string v = std::to_string(0.2 + 0.006 * s + (s % 3 == 0 ? 0.05 : 0));
    metrics += R"({"step": )" + std::to_string(s) + R"(, "reward_mean": )" + v + R"(, "accuracy": )" + v + "}\n";
  }
  const Image image = plot(metrics);
  const Hits reward = find_in_panel(image, series_colour("reward_mean"), 0, true);
  const Hits accuracy = find_in_panel(image, series_colour("accuracy"), 0, true);
  EXPECT_GT(reward.count(), 300u);
  EXPECT_GT(accuracy.count(), 300u);
  // Both along the whole line: in each fifth of the reward's x extent.
  const auto [x_min, x_max] = std::minmax_element(reward.xs.begin(), reward.xs.end());
  for (int fifth = 0; fifth < 5; ++fifth) {
    const uint32_t from = *x_min + (*x_max - *x_min) * fifth / 5, to = *x_min + (*x_max - *x_min) * (fifth + 1) / 5;
    auto in = [&](const Hits& h) { return std::count_if(h.xs.begin(), h.xs.end(), [&](uint32_t x) { return x >= from && x < to; }); };
    EXPECT_GT(in(reward), 20) << fifth;
    EXPECT_GT(in(accuracy), 20) << fifth;
  }
}

// plot_compare: each run in its colour, in every panel its metrics reach, and its swatch in the
// header; the picture is of the documented size.
TEST(PlotCompare, OverlaysRunsOneColourEach) {
  TempDir root;
  std::vector<PlottedRun> dirs;
  for (int r = 0; r < 3; ++r) {
    const std::filesystem::path d = root.path() / ("run" + std::to_string(r));
    std::filesystem::create_directories(d);
    write_bytes((d / "metrics.jsonl").string(), full_metrics(100 + 50 * r));
    write_bytes((d / "sft_metrics.jsonl").string(), sft_metrics(200, 1 + r));
    dirs.push_back({d, "", 256});
  }
  const std::string out = root.file("compare.png");
  plot_compare(dirs, out);
  const Image image = read_png(out);
  ASSERT_EQ(image.width, uint32_t(kPlotWidth));
  ASSERT_EQ(image.height, uint32_t(kPlotHeight));
  for (int r = 0; r < 3; ++r) {
    const Rgb colour = run_colour(size_t(r));
    EXPECT_GT(find(image, colour, 0, 0, kPlotWidth, kPlotHeaderHeight).count(), 50u) << r;  // swatch
    for (int panel = 0; panel < kPlotPanels; ++panel)
      EXPECT_GT(find_in_panel(image, colour, panel, true).count(), 100u) << "run " << r << " panel " << panel;
  }
  EXPECT_EQ(find(image, run_colour(3), 0, 0, kPlotWidth, kPlotHeight).count(), 0u);  // no fourth run

  expect_error([&] { plot_compare(std::vector<PlottedRun>(11, dirs[0]), out); }, {"1 to 10", "11"});
  expect_error([&] { plot_compare(std::vector<PlottedRun>{{root.path() / "none", "", 256}}, out); },
               {"none", "no metrics.jsonl"});
}


// --- the mismatch by response position -----------------------------------------------------------

// Hand-written steps; the expected profile is worked out by hand in the comments.
//   step 1: means [0.1, 0.2],            tokens [10, 30]
//   step 2: means [0.3, null, 0.5],      tokens [30, 0, 5]     (bin 1 empty: its null is no value)
//   step 3: means [0.2, 0.4, null, 0.9], tokens [20, 10, 0, 1] (a first line, replaced below)
//   step 3: means [0.2, 0.4, 0.6],       tokens [20, 10, 0]    (the later line of step 3 wins)
//   step 4: means [1.0],                 tokens [4]
//   step 5: means [0.8, null],           tokens [5, 7]          (tokens but no mean: not counted)
// plus lines without the arrays (an eval line, a step without them).
const char* const kPositionMetrics =
    R"({"step": 1, "mismatch_abs_by_position": [0.1, 0.2], "mismatch_tokens_by_position": [10, 30]})" "\n"
    R"({"step": 2, "mismatch_abs_by_position": [0.3, null, 0.5], "mismatch_tokens_by_position": [30, 0, 5]})" "\n"
    R"({"step": 3, "mismatch_abs_by_position": [0.2, 0.4, null, 0.9],)"
    R"( "mismatch_tokens_by_position": [20, 10, 0, 1]})" "\n"
    R"({"step": 2, "eval_accuracy_greedy": 0.5})" "\n"
    R"({"step": 3, "mismatch_abs_by_position": [0.2, 0.4, 0.6], "mismatch_tokens_by_position": [20, 10, 0]})" "\n"
    R"({"step": 4, "mismatch_abs_by_position": [1.0], "mismatch_tokens_by_position": [4]})" "\n"
    R"({"step": 5, "mismatch_abs_by_position": [0.8, null], "mismatch_tokens_by_position": [5, 7]})" "\n"
    R"({"step": 6, "reward_mean": 0.5})" "\n";

void expect_profile(const MismatchProfile& got, const std::vector<double>& mean_abs, const std::vector<double>& tokens,
                    int64_t steps, double first, double last) {
  ASSERT_EQ(got.mean_abs.size(), mean_abs.size());
  ASSERT_EQ(got.tokens.size(), tokens.size());
  for (size_t b = 0; b < mean_abs.size(); ++b) {
    if (std::isnan(mean_abs[b])) {
      EXPECT_TRUE(std::isnan(got.mean_abs[b])) << "bin " << b << ": " << got.mean_abs[b];
    } else {
      EXPECT_NEAR(got.mean_abs[b], mean_abs[b], 1e-12) << "bin " << b;  // a few double roundings
    }
    EXPECT_EQ(got.tokens[b], tokens[b]) << "bin " << b;  // sums of small integers: exact
  }
  EXPECT_EQ(got.steps, steps);
  if (steps > 0) {
    EXPECT_EQ(got.first_step, first);
    EXPECT_EQ(got.last_step, last);
  }
}

TEST(MismatchProfile, TokenWeightedOverStepsByHand) {
  TempDir dir;
  write_bytes(dir.file("metrics.jsonl"), kPositionMetrics);
  // Every step: bin 0 = (0.1·10 + 0.3·30 + 0.2·20 + 1.0·4 + 0.8·5) / (10+30+20+4+5) = 22/69;
  // bin 1 = (0.2·30 + 0.4·10) / 40 = 0.25 (step 5's 7 tokens have no mean); bin 2 = 0.5·5 / 5 = 0.5.
  expect_profile(mismatch_profile(dir.path()), {22.0 / 69, 0.25, 0.5}, {69, 40, 5}, 5, 1, 5);
  // Steps 2 to 3: bin 0 = (0.3·30 + 0.2·20) / 50 = 0.26; bin 1 = 0.4·10 / 10 = 0.4; bin 2 = 0.5.
  expect_profile(mismatch_profile(dir.path(), {2, 3}), {0.26, 0.4, 0.5}, {50, 10, 5}, 2, 2, 3);
  // Step 3 alone: its last line's arrays; bin 2 has no tokens.
  expect_profile(mismatch_profile(dir.path(), {3, 3}), {0.2, 0.4, NAN}, {20, 10, 0}, 1, 3, 3);
  // From step 4 on: bin 0 = (1.0·4 + 0.8·5) / 9 = 8/9; bin 1 has tokens but no mean.
  expect_profile(mismatch_profile(dir.path(), {4, INFINITY}), {8.0 / 9, NAN}, {9, 0}, 2, 4, 5);
  // A window with no step in it.
  expect_profile(mismatch_profile(dir.path(), {7, 9}), {}, {}, 0, 0, 0);
}

// A metrics file stands for a run folder holding it as metrics.jsonl (docs/results keeps such files).
TEST(MismatchProfile, MetricsFileStandsForItsFolder) {
  TempDir dir;
  write_bytes(dir.file("fp8-rollout_4096.jsonl"), kPositionMetrics);
  expect_profile(mismatch_profile(dir.file("fp8-rollout_4096.jsonl"), {2, 3}), {0.26, 0.4, 0.5}, {50, 10, 5}, 2, 2, 3);
  plot_compare(std::vector<PlottedRun>{{dir.file("fp8-rollout_4096.jsonl"), "", 256}}, dir.file("compare.png"));
  const Image image = read_png(dir.file("compare.png"));
  EXPECT_GT(find_in_panel(image, run_colour(0), kMismatchPositionPanel, true).count(), 100u);
  expect_error([&] { mismatch_profile(dir.file("absent.jsonl")); }, {"absent.jsonl", "no metrics.jsonl"});
}

TEST(MismatchProfile, BadArraysNameFileAndLine) {
  TempDir dir;
  const std::string good = R"({"step": 1, "mismatch_abs_by_position": [0.1], "mismatch_tokens_by_position": [3]})" "\n";
  const struct {
    std::string line;
    std::vector<std::string_view> parts;
  } cases[] = {
      {R"({"step": 2, "mismatch_abs_by_position": [0.1]})",
       {":2:", "\"mismatch_abs_by_position\" without \"mismatch_tokens_by_position\""}},
      {R"({"step": 2, "mismatch_tokens_by_position": [1]})", {":2:", "\"mismatch_tokens_by_position\" without"}},
      {R"({"step": 2, "mismatch_abs_by_position": [0.1, 0.2], "mismatch_tokens_by_position": [1]})",
       {":2:", "has 2 bins", "has 1"}},
      {R"({"step": 2, "mismatch_abs_by_position": 0.1, "mismatch_tokens_by_position": [1]})",
       {":2:", "\"mismatch_abs_by_position\" must be an array", "number"}},
      {R"({"step": 2, "mismatch_abs_by_position": ["x"], "mismatch_tokens_by_position": [1]})",
       {":2:", "element 0 must be a number or null", "string"}},
      {R"({"step": 2, "mismatch_abs_by_position": [0.1, 0.2], "mismatch_tokens_by_position": [1, null]})",
       {":2:", "\"mismatch_tokens_by_position\": element 1 must be a number, not null"}},
      {R"({"step": 2, "mismatch_abs_by_position": [0.1, 0.2], "mismatch_tokens_by_position": [1, -2]})",
       {":2:", "element 1 is -2", "token count >= 0"}},
  };
  for (const auto& c : cases) {
    write_bytes(dir.file("metrics.jsonl"), good + c.line + "\n");
    std::vector<std::string_view> parts = c.parts;
    parts.push_back("metrics.jsonl");
    for (const bool plotting : {false, true}) {
      try {
        if (plotting) plot_run(dir.path(), dir.file("run.png"));
        else mismatch_profile(dir.path());
        ADD_FAILURE() << "no error for: " << c.line;
      } catch (const Error& e) {
        for (std::string_view part : parts)
          EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
      }
    }
  }
  expect_error([&] { plot_run(PlottedRun{dir.path(), "", 0}, dir.file("run.png")); }, {"bins of 0 tokens", ">= 1"});
  EXPECT_EQ(dir.list(), std::vector<std::string>{"metrics.jsonl"});  // no picture
}

// Metrics of `steps` GRPO steps: the train reward, eval every 10 steps from step 30, and a mismatch
// profile of `bins` bins rising with position (0.05 + 0.01·b); `shift` is added to every value, so
// that runs compared stay apart.
std::string study_metrics(int steps, int bins, double shift = 0) {
  std::string text;
  for (int s = 1; s <= steps; ++s) {
    std::string abs, tokens;
    for (int b = 0; b < bins; ++b) {
      if (b > 0) abs += ", ", tokens += ", ";
      abs += std::to_string(shift + 0.05 + 0.01 * b);
      tokens += std::to_string(100 - b);
    }
    text += R"({"step": )" + std::to_string(s) + R"(, "reward_mean": )" + std::to_string(shift + 0.2 + 0.002 * s) +
            R"(, "mismatch_abs": )" + std::to_string(shift + 0.1) + R"(, "time_rollout": )" +
            std::to_string(3 + 10 * shift) + R"(, "mismatch_abs_by_position": [)" + abs +
            R"(], "mismatch_tokens_by_position": [)" + tokens + "]}\n";
    if (s % 10 == 0 && s >= 30)
      text += R"({"step": )" + std::to_string(s) + R"(, "eval_accuracy_greedy": )" + std::to_string(shift + 0.3) +
              "}\n";
  }
  return text;
}

// Panel (d) of a run's own plot: the profile rising along the response.
TEST_F(Plot, MismatchByPositionIsDrawnRising) {
  const Image image = plot(study_metrics(20, 16));
  const Hits hits = find_in_panel(image, series_colour("mismatch_abs_by_position"), kMismatchPositionPanel, true);
  ASSERT_GT(hits.count(), 300u);
  const auto [x_min, x_max] = std::minmax_element(hits.xs.begin(), hits.xs.end());
  double left_row = 0, right_row = 0, left_n = 0, right_n = 0;
  for (size_t i = 0; i < hits.count(); ++i) {
    if (hits.xs[i] < *x_min + (*x_max - *x_min) / 4) left_row += hits.ys[i], ++left_n;
    if (hits.xs[i] > *x_max - (*x_max - *x_min) / 4) right_row += hits.ys[i], ++right_n;
  }
  // 0.05 → 0.2 on an axis from 0 to 0.2 over ~300 px: the right quarter sits ≥ 100 px higher.
  EXPECT_GT(left_row / left_n, right_row / right_n + 100);
  for (int panel = 0; panel < kPlotPanels; ++panel)
    if (panel != kMismatchPositionPanel) {
      EXPECT_EQ(find_in_panel(image, series_colour("mismatch_abs_by_position"), panel, false).count(), 0u) << panel;
    }
}

// Held-out accuracy always has markers (6 px squares), however dense; the train reward, as dense,
// is a 2-px line. A flat series shows it as the height of its band.
TEST_F(Plot, HeldOutAccuracyHasMarkers) {
  std::string metrics;
  for (int s = 0; s < 300; ++s)
    metrics += R"({"step": )" + std::to_string(s) + R"(, "reward_mean": 0.5, "eval_accuracy_greedy": 0.5})" "\n";
  const Image image = plot(metrics);
  auto rows = [&](const char* field) {
    const Hits hits = find_in_panel(image, series_colour(field), panel_of(field), true);
    const auto [lo, hi] = std::minmax_element(hits.ys.begin(), hits.ys.end());
    return hits.count() == 0 ? 0u : *hi - *lo + 1;
  };
  EXPECT_EQ(rows("eval_accuracy_greedy"), 6u);
  EXPECT_EQ(rows("reward_mean"), 2u);
}

// The precision study's figure: runs of different lengths (87 and 200 steps) and response lengths
// (16 bins of 256 tokens, 2 bins of 256): each line ends where its run does.
TEST(PlotCompare, RunsOfDifferentLengthsEndWhereTheyEnd) {
  TempDir root;
  std::vector<PlottedRun> runs;
  const int steps[] = {87, 200}, bins[] = {2, 16};
  for (int r = 0; r < 2; ++r) {
    const std::filesystem::path d = root.path() / ("run" + std::to_string(r));
    std::filesystem::create_directories(d);
    write_bytes((d / "metrics.jsonl").string(), study_metrics(steps[r], bins[r], r == 0 ? 0.1 : 0));
    runs.push_back({d, "", 256});
  }
  const std::string out = root.file("compare.png");
  plot_compare(runs, out);
  const Image image = read_png(out);
  // The x extent of a run's line in a panel.
  auto extent = [&](int r, int panel) {
    const Hits hits = find_in_panel(image, run_colour(size_t(r)), panel, true);
    EXPECT_GT(hits.count(), 20u) << r << " " << panel;
    const auto [lo, hi] = std::minmax_element(hits.xs.begin(), hits.xs.end());
    return std::pair<double, double>{*lo, *hi};
  };
  for (const int panel : {kRewardPanel, kEvalPanel, 2, kTimePanel}) {
    // Steps 1..87 of 1..200 (evaluations: 30..80 of 30..200): the short run ends at ~43% (~29%).
    const auto [short_lo, short_hi] = extent(0, panel);
    const auto [long_lo, long_hi] = extent(1, panel);
    const double end = (short_hi - long_lo) / (long_hi - long_lo);
    EXPECT_NEAR(short_lo, long_lo, 1) << panel;
    if (panel == kEvalPanel) {
      EXPECT_NEAR(end, 50.0 / 170, 0.03) << panel;
    } else {
      EXPECT_NEAR(end, 86.0 / 199, 0.03) << panel;
    }
  }
  // Panel (b)'s axis spans the runs' steps, as panel (a)'s (both 0 to 200): the first evaluation,
  // at step 30, sits 29/200 of the ~667 px axis (less a 3-px marker half) right of the first reward,
  // at step 1. (Over the evaluations alone, 20 to 200, it would be 10/180 of it.)
  const double eval_left = extent(1, kEvalPanel).first - panel_rect(kEvalPanel).x0;
  const double reward_left = extent(1, kRewardPanel).first - panel_rect(kRewardPanel).x0;
  EXPECT_NEAR(eval_left - reward_left, 29.0 / 200 * 667 - 3, 4);
  // Bin middles 128..384 of 128..3968: the 512-token run's profile ends at 1/15 of the other's.
  const auto [short_lo, short_hi] = extent(0, kMismatchPositionPanel);
  const auto [long_lo, long_hi] = extent(1, kMismatchPositionPanel);
  EXPECT_NEAR(short_lo, long_lo, 1);
  EXPECT_NEAR((short_hi - long_lo) / (long_hi - long_lo), 256.0 / 3840, 0.03);
}

// Ten runs with long labels: every run's swatch is in the header, over two lines.
TEST(PlotCompare, TenLongLabelsShareTwoHeaderLines) {
  TempDir root;
  const std::filesystem::path d = root.path() / "run";
  std::filesystem::create_directories(d);
  write_bytes((d / "metrics.jsonl").string(), study_metrics(30, 4));
  std::vector<PlottedRun> runs;
  for (int r = 0; r < kMaxComparedRuns; ++r)
    runs.push_back({d, "word_problems_200steps_fp8-rollout_tis_seed" + std::to_string(r), 256});
  plot_compare(runs, root.file("compare.png"));
  const Image image = read_png(root.file("compare.png"));
  std::vector<uint32_t> tops;
  for (int r = 0; r < kMaxComparedRuns; ++r) {
    const Hits swatch = find(image, run_colour(size_t(r)), 0, 0, kPlotWidth, kPlotHeaderHeight);
    EXPECT_GE(swatch.count(), 14u * 12u) << r;  // the whole 14 × 12 swatch
    tops.push_back(swatch.count() ? *std::min_element(swatch.ys.begin(), swatch.ys.end()) : 0);
  }
  EXPECT_EQ(tops[0], tops[4]);
  EXPECT_EQ(tops[5], tops[9]);
  EXPECT_GE(tops[5], tops[0] + 20);  // the second line

  // Two runs, one label longer than the header: a line each (the long label cut), both swatches there.
  const std::vector<PlottedRun> two = {{d, std::string(200, 'x'), 256}, {d, "short", 256}};
  plot_compare(two, root.file("two.png"));
  const Image image2 = read_png(root.file("two.png"));
  for (int r = 0; r < 2; ++r) {
    const Hits swatch = find(image2, run_colour(size_t(r)), 0, 0, kPlotWidth, kPlotHeaderHeight);
    EXPECT_GE(swatch.count(), 14u * 12u) << r;
    if (swatch.count()) {
      EXPECT_EQ(*std::min_element(swatch.ys.begin(), swatch.ys.end()), r == 0 ? tops[0] : tops[5]) << r;
    }
  }
}

}  // namespace
}  // namespace lockstep
