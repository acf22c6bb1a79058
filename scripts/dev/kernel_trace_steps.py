#!/usr/bin/env python3
# The decode steps of a kernel trace (bench/kernel_trace.cpp's CSV): a step is one replay of a CUDA
# graph, its kernels until a graph node repeats (each replay runs the same nodes). Over the last
# --steps steps of the most common kernel count (one batch bucket), prints the step's span on the
# GPU, the sum of its kernel durations and of the idle gaps between consecutive kernels, then each
# kernel of a step in order with its mean duration, the mean gap before it, and its share of the
# span: from the previous kernel's end to its own end. With early starts (core/early_start.h) a
# kernel starts before the one before it ends — negative gaps, durations that include its wait —
# and only that last column adds up to the span.
# --period P --first F: also the mean of that column at each position of a repeating run of P
# kernels from kernel F on (a layer: e.g. --period 10 --first 1 for the fp8 decode step);
# --period auto finds the shortest run of kernel names that repeats at least 4 times in a row.
# Usage: kernel_trace_steps.py trace.csv [--steps 32] [--period P|auto [--first F]]
import argparse, collections, csv, statistics

parser = argparse.ArgumentParser()
parser.add_argument("trace")
parser.add_argument("--steps", type=int, default=32)
parser.add_argument("--period", default="0")
parser.add_argument("--first", type=int, default=0)
args = parser.parse_args()

with open(args.trace) as f:
    rows = [r for r in csv.DictReader(f) if r["graph_node"] != "0"]
if not rows:
    raise SystemExit(f"{args.trace}: no kernel launched from a CUDA graph")
rows.sort(key=lambda r: int(r["start_ns"]))
steps, current, nodes = [], [], set()
for r in rows:
    if r["graph_node"] in nodes:
        steps.append(current)
        current, nodes = [], set()
    current.append(r)
    nodes.add(r["graph_node"])
steps.append(current)
count = collections.Counter(len(s) for s in steps).most_common(1)[0][0]
steps = [s for s in steps if len(s) == count][-args.steps:]


def ns(r, key):
    return int(r[key + "_ns"])


spans, busy, idle = [], [], []
durations = [[] for _ in range(count)]
gaps = [[] for _ in range(count)]
shares = [[] for _ in range(count)]
for s in steps:
    spans.append(ns(s[-1], "end") - ns(s[0], "start"))
    busy.append(sum(ns(r, "end") - ns(r, "start") for r in s))
    idle.append(spans[-1] - busy[-1])
    for i, r in enumerate(s):
        durations[i].append(ns(r, "end") - ns(r, "start"))
        shares[i].append(ns(r, "end") - (ns(s[i - 1], "end") if i else ns(r, "start")))
        if i:
            gaps[i].append(ns(r, "start") - ns(s[i - 1], "end"))
mean = lambda v: statistics.mean(v) / 1e3 if v else 0.0
print(f"{len(steps)} steps of {count} kernels: span {mean(spans):.1f} us, kernels {mean(busy):.1f} us, "
      f"gaps {mean(idle):.1f} us ({100 * sum(idle) / sum(spans):.1f}% of the span)")
print(f"{'#':>4} {'us':>8} {'gap us':>7} {'span us':>8}  kernel grid")
for i, r in enumerate(steps[-1]):
    grid = f"({r['grid_x']}, {r['grid_y']}, {r['grid_z']})"
    print(f"{i:4d} {mean(durations[i]):8.2f} {mean(gaps[i]):7.2f} {mean(shares[i]):8.2f}  {r['kernel'][:90]} {grid}")
by_kernel = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
for i, r in enumerate(steps[-1]):
    name = r["kernel"].split("<")[0].replace("lockstep::cuda::", "")[:60]
    by_kernel[name][0] += mean(durations[i])
    by_kernel[name][1] += mean(gaps[i])
    by_kernel[name][2] += mean(shares[i])
print("\nper kernel name, a step: us (gap us before) [share of the span, us]")
for name, (d, g, sh) in sorted(by_kernel.items(), key=lambda x: -x[1][0]):
    print(f"  {d:9.1f} ({g:6.1f}) [{sh:9.1f}]  {name}")


def find_period(names, min_repeats=4):
    """The shortest (period, first) whose names repeat min_repeats times in a row; None if none."""
    for period in range(2, len(names) // min_repeats + 1):
        for first in range(period):
            if first + period * min_repeats > len(names):
                break
            if all(names[first + i] == names[first + i + period] for i in range(period * (min_repeats - 1))):
                return period, first
    return None


if args.period == "auto":
    found = find_period([r["kernel"] for r in steps[-1]])
    if not found:
        raise SystemExit("--period auto: no run of kernels repeats 4 times in a step")
    args.period, args.first = found
else:
    args.period = int(args.period)
if args.period > 0:
    repeats = (count - args.first) // args.period
    if repeats < 1:
        raise SystemExit(f"--period {args.period} --first {args.first}: not one period in a step of {count} kernels")
    print(f"\nper position of {repeats} periods of {args.period} kernels from kernel {args.first}: share of the span, us")
    total = 0.0
    for p in range(args.period):
        at = [args.first + p + args.period * k for k in range(repeats)]
        share = statistics.mean(mean(shares[i]) for i in at)
        total += share
        name = steps[-1][at[0]]["kernel"].replace("lockstep::cuda::", "")[:70]
        print(f"  {p:3d} {share:8.2f}  {name}")
    print(f"  all {total:8.2f}")
