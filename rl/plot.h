// rl/plot.h — `lockstep plot`: a run's curves as one PNG picture, drawn by a small rasterizer and a
// 5×8 bitmap font of our own (no plotting library); `lockstep plot --compare`: several runs overlaid.
//
// Input: a run folder's metrics.jsonl (GRPO) and sft_metrics.jsonl (SFT), either of them or both
// (or, given a file instead of a folder, that file as the GRPO metrics):
// one JSON object per line with a numeric "step" and numeric fields. Blank lines are skipped,
// "\r\n" line ends accepted, unknown fields ignored.
//   - A field absent from a line was not measured at that step (eval metrics come every N steps):
//     the series' line runs on across that step.
//   - A field that is null (how JSON writers spell NaN and inf) is a missing value: the line breaks
//     there, leaving a gap. Non-finite numbers count as null.
//   - Lines with the same step are merged, later values winning (a resumed run rewrites its last
//     steps; eval results may come on a line of their own). Steps need not be in order.
//   - SFT's steps are plotted counted back from SFT's last step, which lands on 0, where GRPO starts
//     from the same model (GRPO's step-0 values win there): SFT at negative steps, GRPO at its own.
//     From the SFT file only its loss ("loss", plotted as "sft_loss") and the eval fields are read.
// A line that is not a JSON object, has no finite numeric "step", or has a plotted field that is
// neither a number nor null throws lockstep::Error "<file>:<line>: <what is wrong>"; so does a
// file without a single metrics line ("<file>: ..."), and a folder with neither file. Nothing is
// written then.
//
// The by-position metrics: "mismatch_abs_by_position" and "mismatch_tokens_by_position", arrays of
// one length on one line (bin b holds response positions [b·bin_tokens, (b+1)·bin_tokens); the
// mean |Δlogp| of a bin without tokens is null), as rl/grpo_update writes them. One of the two
// without the other, arrays of different lengths, an element that is not a number (or null, in
// the means), or a negative or non-finite token count throws "<file>:<line>: ...". A later line of
// the same step replaces that step's arrays.
//
// The picture, kPlotWidth × kPlotHeight: a header strip (the run folder, its SFT and GRPO step
// ranges), then eight panels in a kPlotColumns × kPlotRows grid, row by row:
//   (a) train reward and accuracy: reward_mean, accuracy (dashed: it equals the reward when
//       rewards are 0 or 1, and the reward shows between its dashes);
//   (b) held-out accuracy, always with markers: eval_accuracy_greedy, eval_accuracy_sampled
//       (dashed) — evaluations of SFT and GRPO, with a line at step 0 between "SFT" and "GRPO";
//       its x axis spans the run's steps, not only the evaluated ones;
//   (c) train/rollout mismatch over steps: mismatch_abs, mismatch_mult_prob_error − 1 (it is ≥ 1,
//       1 when train and rollout agree), mismatch_k3, tis_clip_frac;
//   (d) mismatch by response position: mismatch_profile's mean |Δlogp| per bin against the bin's
//       middle position in tokens (b + 1/2)·bin_tokens, over the steps of PlotOptions::steps; the
//       x axis runs from position 0 to the end of the last bin;
//   (e) time split per step in seconds, stacked areas, bottom to top: time_rollout, time_scoring,
//       time_recompute, time_update, time_handover. A component absent from a line counts 0; a
//       null one breaks the stack;
//   (f) throughput: tokens_per_s;
//   (g) response_length;
//   (h) SFT loss (sft_loss), over SFT's own step numbers.
// Panels (c) and (h) have a logarithmic y axis when the positive values span two decades or more;
// its floor is then at most six decades below its top, positive values under it are drawn on it,
// and values <= 0 leave gaps (the panel then says so). Each panel's x axis covers its own data
// ((b) and (d) as said above).
// Each panel has its title and legend (swatch, label and last value of each series; two short
// dashes for a dashed series) in a strip along its top, at most its top fifth, and below it the
// plot area with a frame, grid and tick labels (round values, compact: 0.5, 1e-3, 12k). Lines are
// 2 px wide, clipped to the plot area; series with points at least 10 px apart also get square
// markers; a series denser than a point per 2 px is drawn raw in a light tint of its colour, under
// a moving average (over ~8 px) in its colour. Every series has its own colour, distinct across the
// picture (series_colour). A field absent from both files has no series and no legend entry; a
// panel without any series says "no data". The y axes of (c) to (h) include 0 when linear.
// The loop's other metrics (entropy, kl_ref, clip_frac, grad_norm, lr, GRPO's loss) are ignored.
//
// plot_compare: the same panels for several runs (at most kMaxComparedRuns), one colour per run
// (run_colour, named with the run's label in the header strip, on up to two lines). A panel shows
// fewer fields, told apart by their style (named in grey in its legend): (a) train reward,
// (b) eval greedy, (c) mean |dlogp| (solid) and k3 KL (dashed), (d) each run's mismatch profile,
// (e) each run's total time per step as a line, (f) tokens/s, (g) response length, (h) SFT loss.
// Runs of different lengths share the x axis, each line ending at its run's last step; panel (b)'s
// axis spans every run's steps. A series denser than a point per 4 px is drawn as its moving
// average (over ~16 px) alone: several runs' raw bands would hide each other.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

inline constexpr int kPlotWidth = 1600;
inline constexpr int kPlotHeight = 1860;
inline constexpr int kPlotHeaderHeight = 60;  // two lines of run labels in plot_compare
inline constexpr int kPlotColumns = 2, kPlotRows = 4, kPlotPanels = kPlotColumns * kPlotRows;
inline constexpr int kMismatchPositionPanel = 3;  // (d)
inline constexpr int kMaxComparedRuns = 10;

struct Rgb {
  uint8_t r, g, b;
  bool operator==(const Rgb&) const = default;
};

// The colour of a plotted field's series and legend swatch ("mismatch_abs_by_position" for panel
// (d)); throws lockstep::Error for any other name.
Rgb series_colour(std::string_view field);

// The colour of the index-th run of plot_compare; throws lockstep::Error from kMaxComparedRuns on.
Rgb run_colour(size_t index);

// A run folder to plot, the name its curves go by, and the width of its mismatch position bins
// (its run.mismatch_bin_tokens: the metrics file does not say it).
struct PlottedRun {
  std::filesystem::path dir;  // or a GRPO metrics file
  std::string label;          // empty: the folder's own name (a file's name without its extension)
  int64_t bin_tokens = 256;   // ≥ 1
};

// GRPO steps first..last (inclusive) of a run.
struct StepWindow {
  double first = -std::numeric_limits<double>::infinity();
  double last = std::numeric_limits<double>::infinity();
  bool whole() const { return first == -std::numeric_limits<double>::infinity() && last == -first; }
};

struct PlotOptions {
  StepWindow steps;  // the steps panel (d) aggregates; the other panels show every step
};

// Panel (d)'s curve: per position bin b, the mean |Δlogp| weighted by the bin's tokens over the
// steps in `window` that have the by-position arrays,
//   mean_abs[b] = Σ_s abs[s][b]·tokens[s][b] / Σ_s tokens[s][b],   tokens[b] = Σ_s tokens[s][b],
// where a step's bin counts only when its token count is > 0 and its mean is not null. A bin that
// no counted step fills has mean_abs NaN. The arrays run to the longest step's last bin.
struct MismatchProfile {
  std::vector<double> mean_abs;
  std::vector<double> tokens;
  int64_t steps = 0;                 // steps in the window with the arrays
  double first_step = 0, last_step = 0;  // the first and last of them (when steps > 0)
};
// Reads run_dir's metrics.jsonl as plot_run does (its errors, too).
MismatchProfile mismatch_profile(const std::filesystem::path& run_dir, const StepWindow& window = {});

// Reads the metrics in `run.dir`, draws the picture and writes it atomically to `png_out` as PNG.
void plot_run(const PlottedRun& run, const std::filesystem::path& png_out, const PlotOptions& options = {});
inline void plot_run(const std::filesystem::path& run_dir, const std::filesystem::path& png_out) {
  plot_run(PlottedRun{run_dir, {}, 256}, png_out);
}

// The runs overlaid, written atomically to `png_out`.
void plot_compare(std::span<const PlottedRun> runs, const std::filesystem::path& png_out,
                  const PlotOptions& options = {});

}  // namespace lockstep
