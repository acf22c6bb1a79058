#!/usr/bin/env python3
# Where a kernel's warps wait: reads `ncu --import REP --page source --print-source sass --csv`
# on stdin and prints the SASS instructions with the most warp-stall samples (all samples: issued
# or not), and the samples summed per opcode. Used by scripts/dev/device_run.sh's kernel_profile.
import collections
import csv
import sys

lines = [l for l in sys.stdin if l.strip()]
rows = list(csv.reader(lines))
header_at = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
if header_at is None:
    sys.exit("no 'Source' column in the input; first lines:\n" + "".join(lines[:5]))
head = [c.strip() for c in rows[header_at]]
src = head.index("Source")
samples = next((i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All")), None)
if samples is None:
    sys.exit("no 'Warp Stall Sampling (All Samples)' column; columns: " + ", ".join(head))
address = next((i for i, c in enumerate(head) if "Address" in c), None)


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


body = [r for r in rows[header_at + 1:] if len(r) > max(src, samples)]
total = sum(number(r[samples]) for r in body) or 1.0
print(f"{len(body)} instructions, {total:.0f} warp-stall samples")
print("\nTop instructions:")
for r in sorted(body, key=lambda r: -number(r[samples]))[:40]:
    where = r[address] if address is not None else ""
    print(f"{100 * number(r[samples]) / total:6.2f}%  {where:>8}  {r[src].strip()}")
by_opcode = collections.Counter()
for r in body:
    text = r[src].strip().split()
    opcode = next((t for t in text if not t.startswith("@")), "?").split(".")[0]
    by_opcode[opcode] += number(r[samples])
print("\nBy opcode:")
for opcode, n in by_opcode.most_common(20):
    print(f"{100 * n / total:6.2f}%  {opcode}")
