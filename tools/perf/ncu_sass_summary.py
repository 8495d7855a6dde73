#!/usr/bin/env python3
"""Summarize a SASS source page that scripts/ncu-model.sh saves (`ncu --page source --csv --print-source sass`).

Prints the kernel's executed warp instructions and stall samples by opcode, then the hottest basic blocks: runs of
consecutive instructions with the same executed count (a loop body executes each of its instructions equally often),
with their size, count and share, so that "instructions per row / per tile" can be read off directly.
Usage: tools/perf/ncu_sass_summary.py kernel.sass.csv [blocks-to-show]
"""
import collections
import csv
import sys


def main(path, nblocks=8):
    with open(path) as f:
        next(f)  # the kernel-name line
        rows = list(csv.DictReader(f))
    ex = [int(r["Instructions Executed"] or 0) for r in rows]
    samples = [int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows]
    total, stotal = sum(ex), max(sum(samples), 1)
    print("executed warp instructions %d, stall samples %d, SASS instructions %d" % (total, stotal, len(rows)))
    by_op, by_op_s = collections.Counter(), collections.Counter()
    for r, c, s in zip(rows, ex, samples):
        words = r["Source"].split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        op = op.split(".")[0]
        by_op[op] += c
        by_op_s[op] += s
    for op, c in by_op.most_common(20):
        print("  %-10s %11d %5.1f%%   samples %5.1f%%" % (op, c, 100.0 * c / max(total, 1), 100.0 * by_op_s[op] / stotal))
    blocks, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or ex[i] != ex[start]:
            if ex[start]:
                blocks.append((ex[start] * (i - start), i - start, ex[start], start))
            start = i
    print("hottest runs of equally executed instructions (size x count):")
    for work, size, count, first in sorted(blocks, reverse=True)[:nblocks]:
        print("  rows %5d-%5d: %4d x %8d = %10d (%4.1f%%)" % (first, first + size - 1, size, count, work,
                                                           100.0 * work / max(total, 1)))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 8)
