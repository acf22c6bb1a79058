// rl/plot.cpp — metrics JSONL → records by step → eight panels on an RGB canvas → PNG.
#include "rl/plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/file_io.h"
#include "io/png.h"

namespace lockstep {
namespace {

// --- the series --------------------------------------------------------------------------------

enum class Style { none, solid, dashed };

struct FieldSpec {
  std::string_view name;      // in metrics.jsonl (GRPO); "sft_loss" is read from sft_metrics.jsonl
  std::string_view sft_name;  // in sft_metrics.jsonl, or empty when the SFT phase has no such field
  std::string_view label;     // in the legend
  Rgb colour;
  double offset;   // added before plotting (mult. prob. error is plotted as its distance from 1)
  Style style;     // of a run's own plot: a dashed line lets the series under it show through
  Style compare;   // of plot_compare (one colour per run): `none` leaves the field out there
};

// Grouped by panel, in kPanels' order. Colours: Tableau 10 for lines, its newer variant for the
// stacked areas and panel (d), so no two series share one. Train reward and accuracy are equal whenever rewards
// are 0 or 1: the accuracy is dashed so that the reward shows between its dashes.
constexpr FieldSpec kFields[] = {
    {"reward_mean", "", "train reward", {31, 119, 180}, 0, Style::solid, Style::solid},
    {"accuracy", "", "train accuracy", {255, 127, 14}, 0, Style::dashed, Style::none},
    {"eval_accuracy_greedy", "eval_accuracy_greedy", "eval greedy", {44, 160, 44}, 0, Style::solid, Style::solid},
    {"eval_accuracy_sampled", "eval_accuracy_sampled", "eval sampled", {214, 39, 40}, 0, Style::dashed, Style::none},
    {"mismatch_abs", "", "mean |dlogp|", {148, 103, 189}, 0, Style::solid, Style::solid},
    {"mismatch_mult_prob_error", "", "mult. prob. err - 1", {140, 86, 75}, -1, Style::solid, Style::none},
    {"mismatch_k3", "", "k3 KL", {227, 119, 194}, 0, Style::solid, Style::dashed},
    {"tis_clip_frac", "", "TIS clip frac", {23, 190, 207}, 0, Style::solid, Style::none},
    {"time_rollout", "", "rollout", {78, 121, 167}, 0, Style::solid, Style::none},
    {"time_scoring", "", "scoring", {242, 142, 43}, 0, Style::solid, Style::none},
    {"time_recompute", "", "recompute", {89, 161, 79}, 0, Style::solid, Style::none},
    {"time_update", "", "update", {225, 87, 89}, 0, Style::solid, Style::none},
    {"time_handover", "", "hand-over", {176, 122, 161}, 0, Style::solid, Style::none},
    {"tokens_per_s", "", "tokens/s", {0, 137, 123}, 0, Style::solid, Style::solid},
    {"response_length", "", "response length", {255, 157, 167}, 0, Style::solid, Style::solid},
    {"sft_loss", "loss", "SFT loss", {188, 189, 34}, 0, Style::solid, Style::solid},
};
constexpr size_t kFieldCount = std::size(kFields);

// Panel (d)'s curve in a run's own plot (it is no field of a step's record).
constexpr std::string_view kByPositionName = "mismatch_abs_by_position";
constexpr Rgb kByPositionColour{156, 117, 95};

// `by_position`: the mismatch profile (panel (d)), drawn from the by-position arrays, not kFields.
enum class PanelKind { lines, lines_log_when_wide, stacked, by_position };

struct PanelSpec {
  std::string_view title;
  size_t first_field, field_count;  // a range of kFields
  PanelKind kind;
  bool from_zero;     // a linear y axis includes 0 (errors, durations, rates)
  bool markers;       // every point gets a marker, however dense (evaluations are few and matter)
  bool sft_steps;     // the x axis counts SFT's own steps (the panel holds SFT alone)
};

constexpr PanelSpec kPanels[kPlotPanels] = {
    {"(a) train reward and accuracy", 0, 2, PanelKind::lines, false, false, false},
    {"(b) held-out accuracy", 2, 2, PanelKind::lines, false, true, false},
    {"(c) train/rollout mismatch", 4, 4, PanelKind::lines_log_when_wide, true, false, false},
    {"(d) mismatch by response position", 0, 0, PanelKind::by_position, true, false, false},
    {"(e) time per step (s)", 8, 5, PanelKind::stacked, true, false, false},
    {"(f) throughput (tokens/s)", 13, 1, PanelKind::lines, true, false, false},
    {"(g) response length (tokens)", 14, 1, PanelKind::lines, true, false, false},
    {"(h) SFT loss (per token)", 15, 1, PanelKind::lines_log_when_wide, true, false, true},
};
static_assert(kPanels[kMismatchPositionPanel].kind == PanelKind::by_position);

// --- reading the metrics -----------------------------------------------------------------------

// Per field: nullopt = not measured at this step; NaN = a missing value (null), which breaks lines.
using Record = std::array<std::optional<double>, kFieldCount>;

// A run's records by plotted step: GRPO steps as logged, SFT steps counted back from SFT's last step
// (which is plotted at 0, where GRPO starts from the same model).
// A GRPO step's mismatch by response position bin (the arrays of one line).
struct PositionBins {
  std::vector<double> mean_abs;  // NaN: a bin without tokens
  std::vector<double> tokens;
};

struct Run {
  std::string name;           // the run folder, as given
  std::vector<double> steps;  // ascending, distinct
  std::vector<Record> records;
  std::map<double, PositionBins> by_position;  // GRPO steps with the arrays
  std::string label;          // its name in plot_compare
  int64_t bin_tokens = 256;   // response positions per by-position bin
  int64_t sft_steps = 0;      // SFT's last step (0: no SFT file)
  bool has_grpo = false;
};

using json = nlohmann::json;

enum class Phase { sft, grpo };

// A by-position array's elements: numbers, or null where `null_ok` (read as NaN).
std::vector<double> read_array(const json& object, std::string_view name, bool null_ok) {
  const json& array = object[std::string(name)];
  LOCKSTEP_CHECK(array.is_array(), "field \"", name, "\" must be an array, not ", array.type_name());
  std::vector<double> values;
  for (const json& v : array) {
    LOCKSTEP_CHECK(v.is_number() || (null_ok && v.is_null()), "field \"", name, "\": element ", values.size(),
                   null_ok ? " must be a number or null, not " : " must be a number, not ", v.type_name());
    values.push_back(v.is_null() ? NAN : v.get<double>());
  }
  return values;
}

// The line's by-position arrays into `by_position` (replacing the step's), when it has them.
void merge_by_position(const json& object, double step, std::map<double, PositionBins>& by_position) {
  constexpr std::string_view kAbs = "mismatch_abs_by_position", kTokens = "mismatch_tokens_by_position";
  const bool has_abs = object.contains(kAbs), has_tokens = object.contains(kTokens);
  if (!has_abs && !has_tokens) return;
  LOCKSTEP_CHECK(has_abs && has_tokens, "field \"", has_abs ? kAbs : kTokens, "\" without \"",
                 has_abs ? kTokens : kAbs, "\" on the same line");
  PositionBins bins{read_array(object, kAbs, true), read_array(object, kTokens, false)};
  LOCKSTEP_CHECK(bins.mean_abs.size() == bins.tokens.size(), "\"", kAbs, "\" has ", bins.mean_abs.size(),
                 " bins but \"", kTokens, "\" has ", bins.tokens.size());
  for (size_t b = 0; b < bins.tokens.size(); ++b)
    LOCKSTEP_CHECK(std::isfinite(bins.tokens[b]) && bins.tokens[b] >= 0, "field \"", kTokens, "\": element ", b,
                   " is ", bins.tokens[b], ", not a token count >= 0");
  by_position[step] = std::move(bins);
}

// Merges one line's fields into `by_step` (at its step plus `offset`); throws lockstep::Error
// saying what is wrong with it.
void merge_line(const json& object, Phase phase, double offset, std::map<double, Record>& by_step,
                std::map<double, PositionBins>& by_position) {
  const double step = object["step"].get<double>() + offset;
  Record& record = by_step[step];
  for (size_t f = 0; f < kFieldCount; ++f) {
    const std::string_view name = phase == Phase::sft ? kFields[f].sft_name : kFields[f].name;
    if (name.empty()) continue;
    const auto it = object.find(name);
    if (it == object.end()) continue;
    LOCKSTEP_CHECK(it->is_number() || it->is_null(), "field \"", name, "\" must be a number or null, not ",
                   it->type_name());
    const double value = it->is_null() ? NAN : it->get<double>();
    record[f] = std::isfinite(value) ? value : NAN;
  }
  if (phase == Phase::grpo) merge_by_position(object, step, by_position);
}

// The lines of a metrics file as JSON objects with a finite numeric "step", in file order, with their
// line numbers.
using Lines = std::vector<std::pair<size_t, json>>;
Lines read_lines(const std::filesystem::path& path) {
  const std::string text = read_file(path.string(), "metrics");
  Lines lines;
  for_each_nonblank_line(text, [&](std::string_view line, size_t number) {
    try {
      json object;
      try {
        object = json::parse(line);
      } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
        fail(std::string("invalid JSON: ") + e.what());
      }
      LOCKSTEP_CHECK(object.is_object(), "expected a JSON object, not ", object.type_name());
      const auto step = object.find("step");
      LOCKSTEP_CHECK(step != object.end(), "field \"step\" is missing");
      LOCKSTEP_CHECK(step->is_number() && std::isfinite(step->get<double>()),
                     "field \"step\" must be a finite number, not ",
                     step->is_number() ? step->dump() : std::string(step->type_name()));
      lines.emplace_back(number, std::move(object));
    } catch (const Error& e) {
      fail(path.string() + ":" + std::to_string(number) + ": " + e.what());
    }
  });
  LOCKSTEP_CHECK(!lines.empty(), path.string(), ": no metrics: the file is empty (blank lines aside)");
  return lines;
}

void merge_file(const std::filesystem::path& path, Phase phase, double offset, const Lines& lines,
                std::map<double, Record>& by_step, std::map<double, PositionBins>& by_position) {
  for (const auto& [number, object] : lines) {
    try {
      merge_line(object, phase, offset, by_step, by_position);
    } catch (const Error& e) {
      fail(path.string() + ":" + std::to_string(number) + ": " + e.what());
    }
  }
}

// A run folder, or a GRPO metrics file on its own (as docs/results keeps them).
Run read_run(const std::filesystem::path& dir) {
  const bool file = std::filesystem::is_regular_file(dir);
  const std::filesystem::path grpo = file ? dir : dir / "metrics.jsonl", sft = dir / "sft_metrics.jsonl";
  const bool has_grpo = std::filesystem::exists(grpo), has_sft = !file && std::filesystem::exists(sft);
  LOCKSTEP_CHECK(has_grpo || has_sft, dir.string(), ": no metrics.jsonl or sft_metrics.jsonl (is it a run folder?)");
  std::map<double, Record> by_step;
  Run run;
  run.name = dir.string();
  run.has_grpo = has_grpo;
  if (has_sft) {
    const Lines lines = read_lines(sft);
    double last = 0;
    for (const auto& [number, l] : lines) last = std::max(last, l["step"].get<double>());
    run.sft_steps = int64_t(last);
    merge_file(sft, Phase::sft, -last, lines, by_step, run.by_position);
  }
  // GRPO's lines come after SFT's: at step 0 both evaluate the same model, GRPO's values win.
  if (has_grpo) merge_file(grpo, Phase::grpo, 0, read_lines(grpo), by_step, run.by_position);
  for (auto& [step, record] : by_step) {
    run.steps.push_back(step);
    run.records.push_back(record);
  }
  return run;
}

MismatchProfile profile_of(const Run& run, const StepWindow& window) {
  MismatchProfile profile;
  std::vector<double> weighted;  // Σ abs·tokens per bin
  for (const auto& [step, bins] : run.by_position) {
    if (step < window.first || step > window.last) continue;
    if (profile.steps++ == 0) profile.first_step = step;
    profile.last_step = step;
    if (bins.tokens.size() > weighted.size()) {
      weighted.resize(bins.tokens.size());
      profile.tokens.resize(bins.tokens.size());
    }
    for (size_t b = 0; b < bins.tokens.size(); ++b) {
      if (!(bins.tokens[b] > 0) || !std::isfinite(bins.mean_abs[b])) continue;
      weighted[b] += bins.mean_abs[b] * bins.tokens[b];
      profile.tokens[b] += bins.tokens[b];
    }
  }
  for (size_t b = 0; b < weighted.size(); ++b)
    profile.mean_abs.push_back(profile.tokens[b] > 0 ? weighted[b] / profile.tokens[b] : NAN);
  return profile;
}

// The last component of `dir` ("runs/bf16/" → "bf16", "." → the current folder's name); of a
// metrics file, its name without the extension.
std::string folder_name(const std::filesystem::path& dir) {
  if (std::filesystem::is_regular_file(dir)) return dir.stem().string();
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() ? dir.string() : name;
}

Run read_plotted(const PlottedRun& plotted) {
  LOCKSTEP_CHECK(plotted.bin_tokens >= 1, plotted.dir.string(), ": mismatch position bins of ", plotted.bin_tokens,
                 " tokens (expected >= 1)");
  Run run = read_run(plotted.dir);
  run.label = plotted.label.empty() ? folder_name(plotted.dir) : plotted.label;
  run.bin_tokens = plotted.bin_tokens;
  return run;
}

// --- the canvas --------------------------------------------------------------------------------

// The font: ASCII 32–126, 5 columns × 8 rows each (bit 4 = left column; rows 0–6 hold capitals and
// digits, row 7 descenders). Drawn for lockstep.
constexpr uint8_t kFont[95][8] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // space
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04, 0x00},  // !
    {0x0A, 0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00},  // "
    {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A, 0x00},  // #
    {0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04, 0x00},  // $
    {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03, 0x00},  // %
    {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D, 0x00},  // &
    {0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00},  // '
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02, 0x00},  // (
    {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08, 0x00},  // )
    {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00, 0x00},  // *
    {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00, 0x00},  // +
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08},  // ,
    {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00, 0x00},  // -
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C, 0x00},  // .
    {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00, 0x00},  // /
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E, 0x00},  // 0
    {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E, 0x00},  // 1
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F, 0x00},  // 2
    {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E, 0x00},  // 3
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02, 0x00},  // 4
    {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E, 0x00},  // 5
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E, 0x00},  // 6
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08, 0x00},  // 7
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E, 0x00},  // 8
    {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C, 0x00},  // 9
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00, 0x00},  // :
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08, 0x00},  // ;
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02, 0x00},  // <
    {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00, 0x00},  // =
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08, 0x00},  // >
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04, 0x00},  // ?
    {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E, 0x00},  // @
    {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x00},  // A
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E, 0x00},  // B
    {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E, 0x00},  // C
    {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C, 0x00},  // D
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F, 0x00},  // E
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10, 0x00},  // F
    {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F, 0x00},  // G
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11, 0x00},  // H
    {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E, 0x00},  // I
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C, 0x00},  // J
    {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11, 0x00},  // K
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F, 0x00},  // L
    {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11, 0x00},  // M
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11, 0x00},  // N
    {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E, 0x00},  // O
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10, 0x00},  // P
    {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D, 0x00},  // Q
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11, 0x00},  // R
    {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E, 0x00},  // S
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x00},  // T
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E, 0x00},  // U
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04, 0x00},  // V
    {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A, 0x00},  // W
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11, 0x00},  // X
    {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04, 0x00},  // Y
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F, 0x00},  // Z
    {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E, 0x00},  // [
    {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00, 0x00},  // backslash
    {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E, 0x00},  // ]
    {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00},  // ^
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F},  // _
    {0x08, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00},  // `
    {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F, 0x00},  // a
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E, 0x00},  // b
    {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E, 0x00},  // c
    {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F, 0x00},  // d
    {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E, 0x00},  // e
    {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08, 0x00},  // f
    {0x00, 0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // g
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11, 0x00},  // h
    {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E, 0x00},  // i
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x02, 0x12, 0x0C},  // j
    {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12, 0x00},  // k
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E, 0x00},  // l
    {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11, 0x00},  // m
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11, 0x00},  // n
    {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E, 0x00},  // o
    {0x00, 0x00, 0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10},  // p
    {0x00, 0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x01},  // q
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10, 0x00},  // r
    {0x00, 0x00, 0x0F, 0x10, 0x0E, 0x01, 0x1E, 0x00},  // s
    {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06, 0x00},  // t
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D, 0x00},  // u
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04, 0x00},  // v
    {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A, 0x00},  // w
    {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x00},  // x
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // y
    {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F, 0x00},  // z
    {0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02, 0x00},  // {
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},  // |
    {0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08, 0x00},  // }
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00, 0x00},  // ~
};
constexpr int kGlyphWidth = 6;  // 5 columns and a space

// [x0, x1) × [y0, y1) in pixels.
struct Rect {
  int x0, y0, x1, y1;
  Rect grown(int by) const { return {x0 - by, y0 - by, x1 + by, y1 + by}; }
};

// A dash pattern along a polyline: drawn for kOn px of its length, then left out for kOff px.
struct Dash {
  static constexpr double kOn = 9, kOff = 7;
  double travelled = 0;
  bool on() const { return std::fmod(travelled, kOn + kOff) < kOn; }
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background)
      : width_(width), height_(height), pixels_(size_t(width) * size_t(height) * 3) {
    fill({0, 0, width, height}, background, {0, 0, width, height});
  }

  void fill(Rect r, Rgb c, const Rect& clip) {
    const int x0 = std::max({r.x0, clip.x0, 0}), x1 = std::min({r.x1, clip.x1, width_});
    const int y0 = std::max({r.y0, clip.y0, 0}), y1 = std::min({r.y1, clip.y1, height_});
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) {
        uint8_t* p = &pixels_[(size_t(y) * size_t(width_) + size_t(x)) * 3];
        p[0] = c.r, p[1] = c.g, p[2] = c.b;
      }
  }
  void fill(Rect r, Rgb c) { fill(r, c, {0, 0, width_, height_}); }

  // A 2-px line between pixel coordinates (pixel (i, j) spans [i, i+1) × [j, j+1)), inside `clip`;
  // dashed when `dash` is given (its pattern goes on from the previous segment's end).
  void line(double x0, double y0, double x1, double y1, Rgb c, const Rect& clip, Dash* dash = nullptr) {
    // Liang–Barsky: cut the segment to the clip box first, so a far-off point costs nothing.
    const double dx = x1 - x0, dy = y1 - y0;
    double t0 = 0, t1 = 1;
    const double p[4] = {-dx, dx, -dy, dy};
    const double q[4] = {x0 - clip.x0, clip.x1 - x0, y0 - clip.y0, clip.y1 - y0};
    for (int i = 0; i < 4; ++i) {
      if (p[i] == 0) {
        if (q[i] < 0) return;
        continue;
      }
      const double t = q[i] / p[i];
      if (p[i] < 0) t0 = std::max(t0, t);
      else t1 = std::min(t1, t);
    }
    if (t0 > t1) return;
    const double ax = x0 + t0 * dx, ay = y0 + t0 * dy, bx = x0 + t1 * dx, by = y0 + t1 * dy;
    const int n = std::max(1, int(std::ceil(std::max(std::abs(bx - ax), std::abs(by - ay)))));
    const double step_length = std::hypot(bx - ax, by - ay) / n;
    for (int i = 0; i <= n; ++i) {
      const double x = ax + (bx - ax) * i / n, y = ay + (by - ay) * i / n;
      if (!dash || dash->on()) square(x, y, 2, c, clip);
      if (dash && i < n) dash->travelled += step_length;
    }
  }

  // A size × size square centred on (x, y).
  void square(double x, double y, int size, Rgb c, const Rect& clip) {
    const int left = int(std::floor(x - 0.5 * size + 0.5)), top = int(std::floor(y - 0.5 * size + 0.5));
    fill({left, top, left + size, top + size}, c, clip);
  }

  // Text with its top-left corner at (x, y), each font pixel drawn as scale × scale.
  void text(int x, int y, std::string_view s, Rgb c, int scale) {
    for (const char ch : s) {
      const int glyph = ch >= 32 && ch <= 126 ? ch - 32 : '?' - 32;
      for (int row = 0; row < 8; ++row)
        for (int col = 0; col < 5; ++col)
          if (kFont[glyph][row] & (0x10 >> col))
            fill({x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale}, c);
      x += kGlyphWidth * scale;
    }
  }

  std::span<const uint8_t> pixels() const { return pixels_; }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

int text_width(std::string_view s, int scale) { return int(s.size()) * kGlyphWidth * scale - scale; }

// --- axes and ticks ----------------------------------------------------------------------------

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> ticks;
  double tick_step = 1;  // linear axes: the distance between ticks

  // 0 at lo, 1 at hi; on a log axis values under lo (0 included) sit on lo.
  double fraction(double v) const {
    if (log) return (std::log10(std::max(v, lo)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
};

// 1, 2 or 5 × 10^k, the round step nearest to `raw`.
double nice_step(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double n = raw / magnitude;
  return (n < 1.5 ? 1 : n < 3.5 ? 2 : n < 7.5 ? 5 : 10) * magnitude;
}

// Round ticks about `intervals` apart covering [lo, hi]; the axis is widened to the outer ticks.
Axis linear_axis(double lo, double hi, int intervals) {
  LOCKSTEP_CHECK(std::isfinite(hi - lo), "cannot plot values from ", lo, " to ", hi, ": the range overflows a double");
  if (hi - lo <= std::abs(hi) * 1e-9) {  // one value: 0 at the bottom (an error that is always 0), else in the middle
    const double pad = std::abs(hi) * 0.1;
    lo -= pad, hi = hi == 0 ? 1 : hi + pad;
  }
  Axis axis;
  axis.tick_step = nice_step((hi - lo) / intervals);
  const double first = std::floor(lo / axis.tick_step + 1e-9), last = std::ceil(hi / axis.tick_step - 1e-9);
  for (double k = first; k <= last; ++k) axis.ticks.push_back(k * axis.tick_step);
  axis.lo = axis.ticks.front(), axis.hi = axis.ticks.back();
  return axis;
}

// Whole decades covering [lo, hi], 0 < lo < hi.
Axis log_axis(double lo, double hi) {
  Axis axis;
  axis.log = true;
  const int first = int(std::floor(std::log10(lo) + 1e-9)), last = int(std::ceil(std::log10(hi) - 1e-9));
  for (int k = first; k <= std::max(last, first + 1); ++k) axis.ticks.push_back(std::pow(10.0, k));
  axis.lo = axis.ticks.front(), axis.hi = axis.ticks.back();
  return axis;
}

// `value` with `decimals` digits after the point, trailing zeros dropped ("0.50" → "0.5").
std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", std::clamp(decimals, 0, 9), value);
  std::string s = buffer;
  if (s.find('.') != std::string::npos) {
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

int decimals_for(double step) { return int(std::ceil(-std::log10(step) - 1e-9)); }

// A compact label for `value` on an axis with ticks `step` apart and values up to `magnitude`:
// 12k and 1.5M for large values, 2.5e-4 for small ones, 0.05 and 250 in between.
std::string compact(double value, double step, double magnitude) {
  if (std::abs(value) < step * 1e-6) return "0";
  constexpr std::pair<double, char> kUnits[] = {{1e12, 'T'}, {1e9, 'G'}, {1e6, 'M'}, {1e3, 'k'}};
  for (const auto& [unit, suffix] : kUnits)
    if (magnitude >= unit) return fixed(value / unit, decimals_for(step / unit)) + suffix;
  if (magnitude >= 1e-2) return fixed(value, decimals_for(step));
  int exponent = int(std::floor(std::log10(std::abs(value)) + 1e-9));
  const int decimals = std::clamp(decimals_for(step / std::pow(10.0, exponent)), 0, 3);
  double mantissa = value / std::pow(10.0, exponent);
  const double rounding = std::pow(10.0, decimals);
  if (std::abs(std::round(mantissa * rounding) / rounding) >= 10) mantissa /= 10, ++exponent;  // 9.996e-4 → 1e-3
  return fixed(mantissa, decimals) + "e" + std::to_string(exponent);
}

std::string tick_label(const Axis& axis, double value) {
  if (axis.log) return compact(value, value, value);
  return compact(value, axis.tick_step, std::max(std::abs(axis.lo), std::abs(axis.hi)));
}

// Three significant digits.
std::string legend_value(double value) {
  if (value == 0) return "0";
  const double step = std::pow(10.0, std::floor(std::log10(std::abs(value))) - 2);
  return compact(value, step, std::abs(value));
}

// --- the panels --------------------------------------------------------------------------------

constexpr Rgb kWhite{255, 255, 255}, kText{34, 34, 34}, kTickText{85, 85, 85}, kGrid{226, 226, 226},
    kFrame{110, 110, 110};
constexpr int kScale = 2;                                    // font pixels → picture pixels
constexpr int kHeaderHeight = kPlotHeaderHeight;
constexpr int kPanelWidth = kPlotWidth / kPlotColumns, kPanelHeight = (kPlotHeight - kHeaderHeight) / kPlotRows;
constexpr int kLegendTop = 38, kLegendLineHeight = 22, kLegendLines = 2;
constexpr int kMarkerSpacing = 10;  // series with points at least this far apart get markers
static_assert(kLegendTop + kLegendLines * kLegendLineHeight <= kPanelHeight / 5, "the legend strip is the top fifth");

// One point of a series; `breaks` = a null came before it (no line from the previous point).
struct Point {
  double x, y;
  bool breaks;
};

std::vector<Point> line_series(const Run& run, size_t field) {
  std::vector<Point> points;
  bool pending_break = false;
  for (size_t i = 0; i < run.records.size(); ++i) {
    const std::optional<double>& v = run.records[i][field];
    if (!v) continue;
    if (std::isnan(*v)) {
      pending_break = true;
      continue;
    }
    points.push_back({run.steps[i], *v + kFields[field].offset, pending_break});
    pending_break = false;
  }
  return points;
}

// The cumulative tops of a stack of fields: tops[k] = Σ_{j ≤ k} field j.
struct StackPoint {
  double x;
  std::vector<double> tops;
  bool breaks;
};

std::vector<StackPoint> stack_series(const Run& run, size_t first, size_t count) {
  std::vector<StackPoint> points;
  bool pending_break = false;
  for (size_t i = 0; i < run.records.size(); ++i) {
    const Record& r = run.records[i];
    const auto begin = r.begin() + ptrdiff_t(first), end = begin + ptrdiff_t(count);
    if (std::none_of(begin, end, [](const auto& v) { return v.has_value(); })) continue;
    if (std::any_of(begin, end, [](const auto& v) { return v && std::isnan(*v); })) {
      pending_break = true;
      continue;
    }
    StackPoint p{run.steps[i], {}, pending_break};
    double sum = 0;
    for (auto it = begin; it != end; ++it) p.tops.push_back(sum += it->value_or(0.0));
    points.push_back(std::move(p));
    pending_break = false;
  }
  return points;
}

// The plot area of a panel and the mapping of data onto it. The axis ends lie kInset px inside the
// area, so a line or marker on the outermost tick is drawn whole, clear of the frame.
constexpr int kInset = 4;
struct Frame {
  Rect area;
  Axis x, y;
  double px(double v) const { return area.x0 + kInset + 0.5 + x.fraction(v) * (area.x1 - area.x0 - 1 - 2 * kInset); }
  double py(double v) const { return area.y1 - kInset - 0.5 - y.fraction(v) * (area.y1 - area.y0 - 1 - 2 * kInset); }
  // The step at the centre of pixel column c (the inverse of px on the linear x axis).
  double step_at(int c) const {
    return x.lo + (c - area.x0 - kInset) * (x.hi - x.lo) / (area.x1 - area.x0 - 1 - 2 * kInset);
  }
};

// y range of line series: linear, or decades for a wide positive range when allowed.
Axis y_axis_for_lines(const std::vector<std::vector<Point>>& series, bool may_log, bool from_zero, int intervals) {
  double lo = INFINITY, hi = -INFINITY, lo_positive = INFINITY;
  for (const auto& points : series)
    for (const Point& p : points) {
      lo = std::min(lo, p.y), hi = std::max(hi, p.y);
      if (p.y > 0) lo_positive = std::min(lo_positive, p.y);
    }
  if (may_log && hi > 0 && hi >= 100 * lo_positive) return log_axis(std::max(lo_positive, hi * 1e-6), hi);
  if (from_zero) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  return linear_axis(lo, hi, intervals);
}

void draw_axes(Canvas& canvas, const Frame& frame, bool x_labels) {
  const Rect& a = frame.area;
  for (const double t : frame.y.ticks) {
    const int y = int(std::floor(frame.py(t)));
    canvas.fill({a.x0, y, a.x1, y + 1}, kGrid);
    canvas.fill({a.x0 - 6, y, a.x0 - 1, y + 1}, kFrame);
    const std::string label = tick_label(frame.y, t);
    canvas.text(a.x0 - 10 - text_width(label, kScale), y - 7 * kScale / 2, label, kTickText, kScale);
  }
  for (const double t : frame.x.ticks) {
    const int x = int(std::floor(frame.px(t)));
    canvas.fill({x, a.y0, x + 1, a.y1}, kGrid);
    canvas.fill({x, a.y1 + 1, x + 1, a.y1 + 6}, kFrame);
    if (!x_labels) continue;
    const std::string label = tick_label(frame.x, t);
    canvas.text(x - text_width(label, kScale) / 2, a.y1 + 10, label, kTickText, kScale);
  }
  const Rect outline = a.grown(1);
  canvas.fill({outline.x0, outline.y0, outline.x1, a.y0}, kFrame);
  canvas.fill({outline.x0, a.y1, outline.x1, outline.y1}, kFrame);
  canvas.fill({outline.x0, a.y0, a.x0, a.y1}, kFrame);
  canvas.fill({a.x1, a.y0, outline.x1, a.y1}, kFrame);
}

// Markers on every point when `all_markers`, else when the points are sparse enough to tell apart.
void draw_lines(Canvas& canvas, const Frame& frame, const std::vector<Point>& points, Rgb colour, Style style,
                bool all_markers = false) {
  const Rect clip = frame.area.grown(1);
  Dash dash;
  const bool markers = all_markers || points.size() == 1 ||
                       (frame.area.x1 - frame.area.x0) >= kMarkerSpacing * int(points.size() - 1);
  double previous_x = 0, previous_y = 0;
  bool joined = false;  // a point was drawn and no gap came since
  for (const Point& p : points) {
    if (frame.y.log && p.y <= 0) {  // not on a log axis: a gap, like a null
      joined = false;
      continue;
    }
    const double x = frame.px(p.x), y = frame.py(p.y);
    if (joined && !p.breaks)
      canvas.line(previous_x, previous_y, x, y, colour, clip, style == Style::dashed ? &dash : nullptr);
    if (markers) canvas.square(x, y, 6, colour, clip);
    previous_x = x, previous_y = y, joined = true;
  }
}

// Each point replaced by the mean of the points up to `half` before and after it, within its stretch
// between nulls.
std::vector<Point> moving_average(const std::vector<Point>& points, size_t half) {
  std::vector<double> prefix(points.size() + 1, 0.0);  // prefix[i] = Σ y over points [0, i)
  for (size_t i = 0; i < points.size(); ++i) prefix[i + 1] = prefix[i] + points[i].y;
  std::vector<Point> smooth = points;
  for (size_t begin = 0, end; begin < points.size(); begin = end) {
    for (end = begin + 1; end < points.size() && !points[end].breaks;) ++end;
    for (size_t i = begin; i < end; ++i) {
      const size_t from = std::max(begin + half, i) - half, to = std::min(end, i + half + 1);
      smooth[i].y = (prefix[to] - prefix[from]) / double(to - from);
    }
  }
  return smooth;
}

Rgb tint(Rgb c) {  // 35% of the colour on white
  auto mix = [](uint8_t v) { return uint8_t(std::lround(255 - 0.35 * (255 - v))); };
  return {mix(c.r), mix(c.g), mix(c.b)};
}

// Column by column: the stack interpolated at the column's step, or a point within 1.5 px of it
// (so a lone step still shows as a bar).
void draw_stack(Canvas& canvas, const Frame& frame, const std::vector<StackPoint>& points, size_t first_field) {
  for (int c = frame.area.x0; c < frame.area.x1; ++c) {
    const double step = frame.step_at(c);
    const auto after = std::upper_bound(points.begin(), points.end(), step,
                                        [](double s, const StackPoint& p) { return s < p.x; });
    std::vector<double> tops;
    if (after != points.begin() && after != points.end() && !after->breaks) {
      const StackPoint& a = *(after - 1);
      const double t = (step - a.x) / (after->x - a.x);
      for (size_t k = 0; k < a.tops.size(); ++k) tops.push_back(a.tops[k] + t * (after->tops[k] - a.tops[k]));
    } else {
      for (const auto it : {after - (after != points.begin()), after})
        if (it != points.end() && std::abs(frame.px(it->x) - (c + 0.5)) <= 1.5) tops = it->tops;
    }
    double bottom = frame.area.y1;  // the stack's floor, 0, is the area's bottom edge: no inset gap
    for (size_t k = 0; k < tops.size(); ++k) {
      const double top = frame.py(tops[k]);
      canvas.fill({c, int(std::lround(top)), c + 1, int(std::lround(bottom))}, kFields[first_field + k].colour,
                  frame.area);
      bottom = top;
    }
  }
}

// A legend's mark of a series: a block for a solid line, two short dashes for a dashed one.
void draw_swatch(Canvas& canvas, int x, int y, Rgb colour, Style style) {
  if (style == Style::dashed) {
    canvas.fill({x, y + 5, x + 6, y + 9}, colour);
    canvas.fill({x + 9, y + 5, x + 15, y + 9}, colour);
  } else {
    canvas.fill({x, y + 1, x + 14, y + 13}, colour);
  }
}

struct LegendEntry {
  std::string text;
  Rgb colour;
  Style style;
};

// Legend entries (swatch, text) flowing left to right under the title.
void draw_legend(Canvas& canvas, int left, int right, int top, const std::vector<LegendEntry>& entries) {
  int x = left, line = 0;
  for (const LegendEntry& e : entries) {
    const int width = 20 + text_width(e.text, kScale) + 22;
    if (x + width > right && x > left && line + 1 < kLegendLines) x = left, ++line;
    const int y = top + line * kLegendLineHeight;
    draw_swatch(canvas, x, y, e.colour, e.style);
    canvas.text(x + 20, y, e.text, kText, kScale);
    x += width;
  }
}

// A series to draw as a line: its points, colour and style; `markers`: on every point.
struct LineSeries {
  std::vector<Point> points;
  Rgb colour;
  Style style;
  bool markers = false;
};

// The x range of a panel's data: [lo, hi], or nothing when it has none.
std::optional<std::pair<double, double>> x_range(const std::vector<LineSeries>& lines,
                                                 const std::vector<StackPoint>& stack) {
  double lo = INFINITY, hi = -INFINITY;
  for (const LineSeries& l : lines)
    for (const Point& p : l.points) lo = std::min(lo, p.x), hi = std::max(hi, p.x);
  for (const StackPoint& p : stack) lo = std::min(lo, p.x), hi = std::max(hi, p.x);
  if (lo > hi) return std::nullopt;
  return std::pair{lo, hi};
}

// The plot area of a panel whose top-left corner is (left, top).
Rect plot_area(int left, int top) {
  return {left + 96, top + kLegendTop + kLegendLines * kLegendLineHeight + 14, left + kPanelWidth - 28,
          top + kPanelHeight - 52};
}

void draw_title(Canvas& canvas, std::string_view title, int left, int top) {
  canvas.text(left + 16, top + 10, title, kText, kScale);
  canvas.text(left + 17, top + 10, title, kText, kScale);  // bold
}

void draw_no_data(Canvas& canvas, const Rect& a) {
  draw_axes(canvas, {a, {}, {}}, false);
  canvas.text((a.x0 + a.x1 - text_width("no data", kScale)) / 2, (a.y0 + a.y1) / 2 - 8, "no data", kTickText, kScale);
}

// How a panel draws dense series: a series with more than a point per `dense_px` pixels is drawn as
// its moving average over about 4 × dense_px pixels, over the raw series in a light tint when
// `raw_tint`.
struct Smoothing {
  size_t dense_px;
  bool raw_tint;
};
// A run's own plot: a noisy band (over a point per 2 px) in a tint under its ~8 px average.
constexpr Smoothing kRunSmoothing{2, true};
// plot_compare: several runs' noisy bands would hide each other; averages over ~16 px alone.
constexpr Smoothing kCompareSmoothing{4, false};

// Axes, the x axis' name, the SFT/GRPO boundary (step 0) when the data spans both phases, then the
// stack and the lines (dense ones smoothed as `smoothing` says, every tint under every line).
void draw_data(Canvas& canvas, const Frame& frame, const std::vector<LineSeries>& lines,
               const std::vector<StackPoint>& stack, size_t stack_first_field, std::string_view x_name,
               Smoothing smoothing) {
  draw_axes(canvas, frame, true);
  canvas.text((frame.area.x0 + frame.area.x1 - text_width(x_name, kScale)) / 2, frame.area.y1 + 30, x_name,
              kTickText, kScale);
  if (frame.x.lo < 0 && frame.x.hi > 0) {
    const int x = int(std::floor(frame.px(0)));
    canvas.fill({x, frame.area.y0, x + 1, frame.area.y1}, kFrame);
    canvas.text(x - 8 - text_width("SFT", kScale), frame.area.y0 + 8, "SFT", kTickText, kScale);
    canvas.text(x + 8, frame.area.y0 + 8, "GRPO", kTickText, kScale);
  }
  if (frame.y.log) {
    const bool left_out = std::ranges::any_of(lines, [](const LineSeries& l) {
      return std::ranges::any_of(l.points, [](const Point& p) { return p.y <= 0; });
    });
    canvas.text(frame.area.x0 + 8, frame.area.y1 - 24, left_out ? "log scale, values <= 0 left out" : "log scale",
                kTickText, kScale);
  }
  if (!stack.empty()) draw_stack(canvas, frame, stack, stack_first_field);
  const size_t width = size_t(frame.area.x1 - frame.area.x0);
  const auto dense = [&](const LineSeries& l) { return l.points.size() * smoothing.dense_px > width; };
  if (smoothing.raw_tint)
    for (const LineSeries& l : lines)
      if (dense(l)) draw_lines(canvas, frame, l.points, tint(l.colour), l.style);
  for (const LineSeries& l : lines) {
    const size_t half_window = l.points.size() * 2 * smoothing.dense_px / width;
    draw_lines(canvas, frame, dense(l) ? moving_average(l.points, half_window) : l.points, l.colour, l.style,
               l.markers);
  }
}

bool sft_axis(const PanelSpec& spec) { return spec.sft_steps; }

// The x range of a panel with data: the data's, except that panel (d) spans its bins from position
// 0 to the end of the last (a single bin is a bin, not a point), and the held-out accuracy spans the
// runs' steps (evaluations come every N steps: their axis lines up with the train reward's).
std::optional<std::pair<double, double>> panel_x_range(const PanelSpec& spec, std::span<const Run> runs,
                                                       std::optional<std::pair<double, double>> data) {
  if (!data) return data;
  if (spec.kind == PanelKind::by_position) {
    double end = 0;
    for (const Run& run : runs)
      if (!run.by_position.empty()) {
        size_t bins = 0;
        for (const auto& [step, b] : run.by_position) bins = std::max(bins, b.tokens.size());
        end = std::max(end, double(bins) * double(run.bin_tokens));
      }
    return std::pair{0.0, std::max(end, data->second)};
  }
  if (spec.markers)
    for (const Run& run : runs)
      if (!run.steps.empty())
        data = std::pair{std::min(data->first, run.steps.front()), std::max(data->second, run.steps.back())};
  return data;
}

std::vector<Point> shifted(std::vector<Point> points, double by) {
  for (Point& p : points) p.x += by;
  return points;
}

std::string_view x_axis_name(const PanelSpec& spec, const Frame& frame) {
  if (sft_axis(spec)) return "SFT step";
  if (spec.kind == PanelKind::by_position) return "response position (tokens; each bin at its middle)";
  return frame.x.lo < 0 ? "step (SFT steps < 0, counted back from its end)" : "step";
}

// Panel (d)'s points: each bin's mean at its middle position; a bin without tokens breaks the line.
std::vector<Point> profile_points(const MismatchProfile& profile, int64_t bin_tokens) {
  std::vector<Point> points;
  bool pending_break = false;
  for (size_t b = 0; b < profile.mean_abs.size(); ++b) {
    if (std::isnan(profile.mean_abs[b])) {
      pending_break = true;
      continue;
    }
    points.push_back({(double(b) + 0.5) * double(bin_tokens), profile.mean_abs[b], pending_break});
    pending_break = false;
  }
  return points;
}

// "steps 3 to 87"
std::string steps_text(double first, double last) {
  return first == last ? "step " + fixed(first, 3) : "steps " + fixed(first, 3) + " to " + fixed(last, 3);
}

void draw_panel(Canvas& canvas, const Run& run, const PanelSpec& spec, const PlotOptions& options, int left,
                int top) {
  draw_title(canvas, spec.title, left, top);
  Frame frame;
  frame.area = plot_area(left, top);
  const int y_intervals = std::max(2, (frame.area.y1 - frame.area.y0) / 70);
  const int x_intervals = std::max(2, (frame.area.x1 - frame.area.x0) / 110);

  // Legend entries and the data, for the fields present in the files.
  std::vector<LegendEntry> legend;
  std::vector<LineSeries> lines;
  std::vector<StackPoint> stack;
  if (spec.kind == PanelKind::stacked) stack = stack_series(run, spec.first_field, spec.field_count);
  if (spec.kind == PanelKind::by_position) {
    const MismatchProfile profile = profile_of(run, options.steps);
    std::vector<Point> points = profile_points(profile, run.bin_tokens);
    if (!points.empty()) {
      legend.push_back({"mean |dlogp|, token-weighted over " + steps_text(profile.first_step, profile.last_step) +
                            ", bins of " + std::to_string(run.bin_tokens),
                        kByPositionColour, Style::solid});
      lines.push_back({std::move(points), kByPositionColour, Style::solid});
    }
  }
  for (size_t f = spec.first_field; f < spec.first_field + spec.field_count; ++f) {
    std::vector<Point> points = line_series(run, f);
    if (points.empty()) continue;
    const Style style = spec.kind == PanelKind::stacked ? Style::solid : kFields[f].style;
    legend.push_back({std::string(kFields[f].label) + " " + legend_value(points.back().y), kFields[f].colour, style});
    if (spec.kind != PanelKind::stacked)
      lines.push_back({shifted(std::move(points), sft_axis(spec) ? double(run.sft_steps) : 0), kFields[f].colour, style,
                       spec.markers});
  }
  if (sft_axis(spec))
    for (StackPoint& p : stack) p.x += double(run.sft_steps);
  const auto range = panel_x_range(spec, std::span(&run, 1), x_range(lines, stack));
  if (!range) return draw_no_data(canvas, frame.area);
  frame.x = linear_axis(range->first, range->second, x_intervals);
  if (spec.kind == PanelKind::stacked) {
    double hi = 0;
    for (const StackPoint& p : stack) hi = std::max(hi, p.tops.back());
    frame.y = linear_axis(0, hi, y_intervals);
  } else {
    std::vector<std::vector<Point>> points;
    for (const LineSeries& l : lines) points.push_back(l.points);
    frame.y = y_axis_for_lines(points, spec.kind == PanelKind::lines_log_when_wide, spec.from_zero, y_intervals);
  }
  draw_data(canvas, frame, lines, stack, spec.first_field, x_axis_name(spec, frame), kRunSmoothing);
  draw_legend(canvas, left + 16, left + kPanelWidth - 16, top + kLegendTop, legend);
}

// One panel of plot_compare: the fields with a compare style, a line per run in the run's colour;
// the time split as each run's total time per step. The legend names the fields by style (in grey):
// the runs' colours are named in the header.
void draw_compare_panel(Canvas& canvas, const std::vector<Run>& runs, const PanelSpec& spec,
                        const PlotOptions& options, int left, int top) {
  draw_title(canvas, spec.title, left, top);
  Frame frame;
  frame.area = plot_area(left, top);
  const int y_intervals = std::max(2, (frame.area.y1 - frame.area.y0) / 70);
  const int x_intervals = std::max(2, (frame.area.x1 - frame.area.x0) / 110);
  std::vector<LegendEntry> legend;
  std::vector<LineSeries> lines;
  for (size_t r = 0; r < runs.size(); ++r) {
    const double shift = sft_axis(spec) ? double(runs[r].sft_steps) : 0;
    if (spec.kind == PanelKind::stacked) {
      std::vector<Point> total;
      for (const StackPoint& p : stack_series(runs[r], spec.first_field, spec.field_count))
        total.push_back({p.x + shift, p.tops.back(), p.breaks});
      if (!total.empty()) lines.push_back({std::move(total), run_colour(r), Style::solid});
      continue;
    }
    if (spec.kind == PanelKind::by_position) {
      std::vector<Point> points = profile_points(profile_of(runs[r], options.steps), runs[r].bin_tokens);
      if (!points.empty()) lines.push_back({std::move(points), run_colour(r), Style::solid});
      continue;
    }
    for (size_t f = spec.first_field; f < spec.first_field + spec.field_count; ++f) {
      if (kFields[f].compare == Style::none) continue;
      std::vector<Point> points = line_series(runs[r], f);
      if (!points.empty())
        lines.push_back({shifted(std::move(points), shift), run_colour(r), kFields[f].compare, spec.markers});
    }
  }
  if (spec.kind == PanelKind::stacked) {
    legend.push_back({"total time per step", kTickText, Style::solid});
  } else if (spec.kind == PanelKind::by_position) {
    legend.push_back({"mean |dlogp|, token-weighted over " +
                          (options.steps.whole() ? std::string("each run's steps")
                                                 : steps_text(options.steps.first, options.steps.last)),
                      kTickText, Style::solid});
  } else {
    for (size_t f = spec.first_field; f < spec.first_field + spec.field_count; ++f)
      if (kFields[f].compare != Style::none) legend.push_back({std::string(kFields[f].label), kTickText, kFields[f].compare});
  }
  const auto range = panel_x_range(spec, runs, x_range(lines, {}));
  if (!range) return draw_no_data(canvas, frame.area);
  frame.x = linear_axis(range->first, range->second, x_intervals);
  std::vector<std::vector<Point>> points;
  for (const LineSeries& l : lines) points.push_back(l.points);
  frame.y = y_axis_for_lines(points, spec.kind == PanelKind::lines_log_when_wide, spec.from_zero, y_intervals);
  draw_data(canvas, frame, lines, {}, spec.first_field, x_axis_name(spec, frame), kCompareSmoothing);
  draw_legend(canvas, left + 16, left + kPanelWidth - 16, top + kLegendTop, legend);
}

// The tail of `s` that fits in `width` pixels, "..." in front when cut.
std::string fit_left(const std::string& s, int width) {
  const size_t fits = size_t(std::max(0, (width + kScale) / (kGlyphWidth * kScale)));
  if (s.size() <= fits) return s;
  return fits <= 3 ? s.substr(s.size() - fits) : "..." + s.substr(s.size() - (fits - 3));
}

// "SFT steps 1 to 900, GRPO steps 0 to 300"
std::string step_summary(const Run& run) {
  std::string out;
  if (run.sft_steps > 0) out = "SFT steps 1 to " + std::to_string(run.sft_steps);
  if (run.has_grpo) {
    const auto first_grpo = std::lower_bound(run.steps.begin(), run.steps.end(), run.sft_steps > 0 ? 0.0 : -INFINITY);
    if (first_grpo != run.steps.end())
      out += (out.empty() ? "" : ", ") + std::string("GRPO steps ") + fixed(std::max(0.0, *first_grpo), 3) + " to " +
             fixed(run.steps.back(), 3);
  }
  return out;
}

constexpr Rgb kRunColours[kMaxComparedRuns] = {
    {31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},   {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207},
};

}  // namespace

Rgb series_colour(std::string_view field) {
  if (field == kByPositionName) return kByPositionColour;
  for (const FieldSpec& spec : kFields)
    if (spec.name == field) return spec.colour;
  fail("series_colour: \"" + std::string(field) + "\" is not a plotted metrics field");
}

Rgb run_colour(size_t index) {
  LOCKSTEP_CHECK(index < size_t(kMaxComparedRuns), "run_colour: ", index, " is not below ", kMaxComparedRuns);
  return kRunColours[index];
}

MismatchProfile mismatch_profile(const std::filesystem::path& run_dir, const StepWindow& window) {
  return profile_of(read_run(run_dir), window);
}

void plot_run(const PlottedRun& plotted, const std::filesystem::path& png_out, const PlotOptions& options) {
  const Run run = read_plotted(plotted);
  Canvas canvas(kPlotWidth, kPlotHeight, kWhite);
  const std::string range = step_summary(run);
  canvas.text(kPlotWidth - 16 - text_width(range, kScale), 10, range, kTickText, kScale);
  const std::string title = fit_left("lockstep run " + (plotted.label.empty() ? run.name : run.label),
                                     kPlotWidth - 64 - text_width(range, kScale));
  canvas.text(16, 10, title, kText, kScale);
  canvas.fill({0, kHeaderHeight - 1, kPlotWidth, kHeaderHeight}, kGrid);
  for (int i = 0; i < kPlotPanels; ++i)
    draw_panel(canvas, run, kPanels[i], options, (i % kPlotColumns) * kPanelWidth,
               kHeaderHeight + (i / kPlotColumns) * kPanelHeight);
  write_png(png_out, kPlotWidth, kPlotHeight, canvas.pixels());
}

void plot_compare(std::span<const PlottedRun> plotted, const std::filesystem::path& png_out,
                  const PlotOptions& options) {
  LOCKSTEP_CHECK(!plotted.empty() && plotted.size() <= size_t(kMaxComparedRuns), "plot --compare: give 1 to ",
                 kMaxComparedRuns, " run folders, not ", plotted.size());
  std::vector<Run> runs;
  for (const PlottedRun& p : plotted) runs.push_back(read_plotted(p));
  Canvas canvas(kPlotWidth, kPlotHeight, kWhite);
  // The header: each run's colour and label, flowing over two lines; when the full labels do not
  // fit, the runs share the two lines equally and long labels lose their beginnings.
  const std::string head = "lockstep runs:";
  canvas.text(16, 10, head, kText, kScale);
  const int first = 16 + text_width(head, kScale) + 16, right = kPlotWidth - 16;
  std::vector<int> widths;
  for (const Run& run : runs) widths.push_back(20 + text_width(run.label, kScale) + 24);
  std::vector<std::pair<int, int>> at;  // each entry's x and line
  for (int x = first, line = 0; const int w : widths) {
    if (x + w > right && x > first) x = first, ++line;
    at.push_back({x, line});
    x += w;
  }
  bool flows = true;
  for (size_t r = 0; r < runs.size(); ++r) flows = flows && at[r].second < 2 && at[r].first + widths[r] - 24 <= right;
  const int per_line = int(runs.size() + 1) / 2, share = (right - first) / per_line;
  for (size_t r = 0; r < runs.size(); ++r) {
    const int x = flows ? at[r].first : first + int(r % size_t(per_line)) * share;
    const int y = 6 + kLegendLineHeight * (flows ? at[r].second : int(r) / per_line);
    const int room = flows ? widths[r] : share - 24;
    draw_swatch(canvas, x, y, run_colour(r), Style::solid);
    canvas.text(x + 20, y, fit_left(runs[r].label, room - 20), kText, kScale);
  }
  canvas.fill({0, kHeaderHeight - 1, kPlotWidth, kHeaderHeight}, kGrid);
  for (int i = 0; i < kPlotPanels; ++i)
    draw_compare_panel(canvas, runs, kPanels[i], options, (i % kPlotColumns) * kPanelWidth,
                       kHeaderHeight + (i / kPlotColumns) * kPanelHeight);
  write_png(png_out, kPlotWidth, kPlotHeight, canvas.pixels());
}

}  // namespace lockstep
