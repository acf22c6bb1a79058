#!/usr/bin/env python3
# Sums ncu's gpu__time_duration.sum (its --csv output on stdin) per (kernel, grid) and prints the
# 40 largest: the time split of a run. Used by scripts/dev/device_run.sh's decode_profile stage.
import csv, sys, collections
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith('"'))]
head, rows = rows[0], rows[1:]
k, g, v = head.index("Kernel Name"), head.index("Grid Size"), head.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    key = (r[k][:100], r[g]); tot[key] += float(r[v].replace(",", "")); cnt[key] += 1
total = sum(tot.values())
print(f"total ns {total} kernels {sum(cnt.values())}")
for key, t in sorted(tot.items(), key=lambda x: -x[1])[:40]:
    print(f"{t/1e6:9.3f} ms {100*t/total:5.1f}% n={cnt[key]:6d} avg {t/cnt[key]/1e3:8.2f} us {key[0]} grid{key[1]}")
