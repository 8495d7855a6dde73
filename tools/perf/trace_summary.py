#!/usr/bin/env python3
"""Summarize the step timeline that `LING_TRACE=path ling bench ...` writes (one CSV row per layer and region).

For each layer kind (KDA / MLA) and region (attention projections, KDA step, o_proj / MLA dense, router, MoE A, MoE B,
and mlaS: the MLA attention when it is the one launch, between the projections and the dense)
it prints the median over layers of: blocks; first/last entry and first/last PDL-wait exit, in µs after the previous
region's last block ended; the midpoint (median and last block) and the end (first, median, last block) in µs after
the region's last wait exit; and the region's duration (its last end minus the previous region's last end). The last
line is the median layer period. Usage: tools/perf/trace_summary.py trace.csv
"""
import csv
import statistics
import sys

NAMES = ["proj", "kstep", "oproj", "router", "moeA", "moeB", "mlaS"]
ORDER = [0, 6, 1, 2, 3, 4, 5]  # the regions in step order (slot 6, the one-launch MLA attention, follows the projections)


def last(regs):
    return max(regs, key=ORDER.index)


def main(path):
    by_layer = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            by_layer.setdefault(int(r["layer"]), {})[int(r["region"])] = {
                k: float(v) for k, v in r.items() if k not in ("layer", "region")}
    acc = {}
    layers = sorted(by_layer)
    for l in layers:
        regs = by_layer[l]
        prev = by_layer.get(l - 1)
        prev_end = prev[last(prev)]["end_last"] if prev else None
        kind = "kda" if 1 in regs else "mla"  # MLA layers have no KDA-step region
        for k in sorted(regs, key=ORDER.index):
            d = regs[k]
            base = prev_end if prev_end is not None else d["entry_first"]
            w = d["wait_last"]
            row = [d["blocks"], d["entry_first"] - base, d["entry_last"] - base, d["wait_first"] - base, w - base,
                   d["mid_median"] - w if d["mid_median"] > 0 else float("nan"),
                   d["mid_last"] - w if d["mid_last"] > 0 else float("nan"),
                   d["end_first"] - w, d["end_median"] - w, d["end_last"] - w, d["end_last"] - base]
            acc.setdefault((kind, NAMES[k]), []).append(row)
            prev_end = d["end_last"]
    print("%-12s %5s %7s %7s %7s %7s | after the last wait: %6s %6s %6s %6s %6s | %6s" %
          ("region", "blk", "entF", "entL", "waitF", "waitL", "midMd", "midL", "endF", "endMd", "endL", "dur"))
    for key in sorted(acc):
        v = acc[key]
        m = [statistics.median(x[i] for x in v) for i in range(11)]
        print("%-12s %5d %7.2f %7.2f %7.2f %7.2f | %27.2f %6.2f %6.2f %6.2f %6.2f | %6.2f  n=%d" %
              (key[0] + ":" + key[1], *m, len(v)))
    ends = [by_layer[l][last(by_layer[l])]["end_last"] for l in layers]
    print("layer period, median: %.2f us" % statistics.median(b - a for a, b in zip(ends, ends[1:])))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
