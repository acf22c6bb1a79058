// rl/plot.h — `lockstep plot`: a run's curves as one PNG picture, drawn by a small rasterizer and a
// 5×8 bitmap font of our own (no plotting library).
//
// Input: the metrics JSONL the RL loop writes, one JSON object per line with a numeric "step" and
// numeric fields. Blank lines are skipped, "\r\n" line ends accepted, unknown fields ignored.
//   - A field absent from a line was not measured at that step (eval metrics come every N steps):
//     the series' line runs on across that step.
//   - A field that is null (how JSON writers spell NaN and inf) is a missing value: the line breaks
//     there, leaving a gap. Non-finite numbers count as null.
//   - Lines with the same step are merged, later values winning (a resumed run rewrites its last
//     steps; eval results may come on a line of their own). Steps need not be in order.
// A line that is not a JSON object, has no finite numeric "step", or has a plotted field that is
// neither a number nor null throws lockstep::Error "<file>:<line>: <what is wrong>"; so does a
// file without a single metrics line ("<file>: ..."). Nothing is written then.
//
// The picture, kPlotWidth × kPlotHeight: a header strip (file, step range), then four panels in a
// 2×2 grid over the same step axis:
//   (a) top-left      reward and accuracy: reward_mean, accuracy, eval_accuracy_greedy,
//                     eval_accuracy_sampled
//   (b) top-right     train/rollout mismatch: mismatch_abs, mismatch_mult_prob_error − 1 (it is ≥ 1,
//                     1 when train and rollout agree), mismatch_k3, tis_clip_frac. The y axis is
//                     logarithmic when the positive values span two decades or more; its floor is
//                     then at most six decades below its top, positive values under it are drawn on
//                     it, and values <= 0 leave gaps (the panel then says so).
//   (c) bottom-left   time split per step in seconds, stacked areas, bottom to top: time_rollout,
//                     time_scoring, time_recompute, time_update, time_handover. A component absent
//                     from a line counts 0; a null one breaks the stack.
//   (d) bottom-right  throughput: tokens_per_s
// Each panel has its title and legend (label and last value of each series) in a strip along its
// top, at most its top fifth, and below it the plot area with a frame, grid and tick labels (round
// values, compact: 0.5, 1e-3, 12k). Lines are 2 px wide, clipped to the plot area; series with
// points at least 10 px apart also get square markers; a series denser than a point per 2 px is
// drawn raw in a light tint of its colour, under a moving average (over ~8 px) in its colour.
// Every series has its own colour, distinct across the picture (series_colour). A field absent
// from the whole file has no series and no legend entry; a panel without any series says "no data".
// The y axes of (b), (c) and (d) include 0 when linear.
// The loop's other metrics (response_length, entropy, kl_ref, clip_frac, grad_norm, lr) are ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace lockstep {

inline constexpr int kPlotWidth = 1600;
inline constexpr int kPlotHeight = 1000;

struct Rgb {
  uint8_t r, g, b;
  bool operator==(const Rgb&) const = default;
};

// The colour of a plotted field's series and legend swatch; throws lockstep::Error for any other name.
Rgb series_colour(std::string_view field);

// Reads `metrics_jsonl`, draws the picture and writes it atomically to `png_out` as PNG.
void plot_run(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& png_out);

}  // namespace lockstep
