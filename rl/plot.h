// rl/plot.h — `lockstep plot`: a run's curves as one PNG picture, drawn by a small rasterizer and a
// 5×8 bitmap font of our own (no plotting library); `lockstep plot --compare`: several runs overlaid.
//
// Input: a run folder's metrics.jsonl (GRPO) and sft_metrics.jsonl (SFT), either of them or both:
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
// The picture, kPlotWidth × kPlotHeight: a header strip (the run folder, its SFT and GRPO step
// ranges), then six panels in a kPlotColumns × kPlotRows grid, row by row:
//   (a) reward and accuracy: reward_mean, accuracy (dashed: it equals the reward when rewards are
//       0 or 1, and the reward shows between its dashes), eval_accuracy_greedy,
//       eval_accuracy_sampled (dashed) — evaluations of SFT and GRPO, with a line at step 0
//       between "SFT" and "GRPO";
//   (b) SFT loss (sft_loss), over SFT's own step numbers;
//   (c) train/rollout mismatch: mismatch_abs, mismatch_mult_prob_error − 1 (it is ≥ 1, 1 when train
//       and rollout agree), mismatch_k3, tis_clip_frac;
//   (d) time split per step in seconds, stacked areas, bottom to top: time_rollout, time_scoring,
//       time_recompute, time_update, time_handover. A component absent from a line counts 0; a
//       null one breaks the stack;
//   (e) throughput: tokens_per_s;
//   (f) response_length.
// Panels (b) and (c) have a logarithmic y axis when the positive values span two decades or more;
// its floor is then at most six decades below its top, positive values under it are drawn on it,
// and values <= 0 leave gaps (the panel then says so). Each panel's x axis covers its own data.
// Each panel has its title and legend (swatch, label and last value of each series; two short
// dashes for a dashed series) in a strip along its top, at most its top fifth, and below it the
// plot area with a frame, grid and tick labels (round values, compact: 0.5, 1e-3, 12k). Lines are
// 2 px wide, clipped to the plot area; series with points at least 10 px apart also get square
// markers; a series denser than a point per 2 px is drawn raw in a light tint of its colour, under
// a moving average (over ~8 px) in its colour. Every series has its own colour, distinct across the
// picture (series_colour). A field absent from both files has no series and no legend entry; a
// panel without any series says "no data". The y axes of (b) to (f) include 0 when linear.
// The loop's other metrics (entropy, kl_ref, clip_frac, grad_norm, lr, GRPO's loss) are ignored.
//
// plot_compare: the same panels for several runs (at most kMaxComparedRuns), one colour per run
// (run_colour, named with the run's folder in the header strip). A panel shows fewer fields, told
// apart by their style (named in grey in its legend): (a) eval greedy (solid) and train reward
// (dashed), (b) SFT loss, (c) mean |dlogp| (solid) and k3 KL (dashed), (d) each run's total time
// per step as a line, (e) tokens/s, (f) response length. A series denser than a point per 4 px is
// drawn as its moving average (over ~16 px) alone: several runs' raw bands would hide each other.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace lockstep {

inline constexpr int kPlotWidth = 1600;
inline constexpr int kPlotHeight = 1400;
inline constexpr int kPlotHeaderHeight = 36;
inline constexpr int kPlotColumns = 2, kPlotRows = 3, kPlotPanels = kPlotColumns * kPlotRows;
inline constexpr int kMaxComparedRuns = 10;

struct Rgb {
  uint8_t r, g, b;
  bool operator==(const Rgb&) const = default;
};

// The colour of a plotted field's series and legend swatch; throws lockstep::Error for any other name.
Rgb series_colour(std::string_view field);

// The colour of the index-th run of plot_compare; throws lockstep::Error from kMaxComparedRuns on.
Rgb run_colour(size_t index);

// Reads the metrics in `run_dir`, draws the picture and writes it atomically to `png_out` as PNG.
void plot_run(const std::filesystem::path& run_dir, const std::filesystem::path& png_out);

// The runs in `run_dirs` overlaid, written atomically to `png_out`.
void plot_compare(std::span<const std::filesystem::path> run_dirs, const std::filesystem::path& png_out);

}  // namespace lockstep
