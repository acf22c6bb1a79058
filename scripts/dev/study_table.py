#!/usr/bin/env python3
"""The precision study's tables (docs/experiments.md) from GRPO metrics files.

    python3 scripts/dev/study_table.py LABEL:SEED=metrics.jsonl ... [--early 1:25] [--late 176:200]

Per run: held-out greedy accuracy at every evaluated step, and over the early and late step ranges
the mean train reward, mean |Δlogp|, mean response length; medians over all steps of the
multiplicative probability error and k3; the mean TIS clip fraction where TIS ran. Then per label:
the final held-out accuracy as mean ± half the spread of its seeds.
"""
import json
import statistics
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            rows[j["step"]] = j
    return rows


def steps_range(text):
    a, b = text.split(":")
    return int(a), int(b)


def mean_over(rows, key, lo, hi):
    v = [rows[s][key] for s in range(lo, hi + 1) if s in rows and rows[s].get(key) is not None]
    return sum(v) / len(v) if v else float("nan")


def main(argv):
    early, late, runs = (1, 25), (176, 200), []
    it = iter(argv)
    for a in it:
        if a == "--early":
            early = steps_range(next(it))
        elif a == "--late":
            late = steps_range(next(it))
        else:
            label, path = a.split("=", 1)
            name, seed = label.rsplit(":", 1)
            runs.append((name, seed, load(path)))
    if not runs:
        sys.exit(__doc__)
    e, l = f"{early[0]}–{early[1]}", f"{late[0]}–{late[1]}"
    print(f"| mode | seed | steps | held-out greedy at evaluated steps | train reward {e} / {l} | "
          f"mean \\|Δlogp\\| {e} / {l} | mult. prob. error (median) | k3 (median) | TIS clip frac | "
          f"response tokens {e} / {l} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    finals = {}
    for name, seed, rows in runs:
        trained = [s for s in rows if s > 0 and "time_step" in rows[s]]
        evals = [(s, rows[s]["eval_accuracy_greedy"]) for s in sorted(rows) if "eval_accuracy_greedy" in rows[s]]
        held = " / ".join(f"{v:.3f}" for _, v in evals)
        if evals and evals[-1][0] == max(trained):
            finals.setdefault(name, []).append(evals[-1][1])
        mpe = statistics.median(rows[s]["mismatch_mult_prob_error"] for s in trained)
        k3 = statistics.median(rows[s]["mismatch_k3"] for s in trained)
        tis = [rows[s]["tis_clip_frac"] for s in trained if rows[s].get("tis_clip_frac")]
        tis_text = f"{sum(tis) / len(tis):.3f}" if tis else ""
        print(f"| {name} | {seed} | {max(trained)} | {held} | "
              f"{mean_over(rows, 'reward_mean', *early):.2f} / {mean_over(rows, 'reward_mean', *late):.2f} | "
              f"{mean_over(rows, 'mismatch_abs', *early):.3f} / {mean_over(rows, 'mismatch_abs', *late):.3f} | "
              f"{mpe:.3f} | {k3:.4f} | {tis_text} | "
              f"{mean_over(rows, 'response_length', *early):.0f} / {mean_over(rows, 'response_length', *late):.0f} |")
    print()
    print("| mode | final held-out greedy (mean ± half the seeds' spread) | seeds |")
    print("|---|---|---|")
    for name, v in finals.items():
        spread = (max(v) - min(v)) / 2
        print(f"| {name} | {sum(v) / len(v):.3f}" + (f" ± {spread:.3f}" if len(v) > 1 else "") + f" | {len(v)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
