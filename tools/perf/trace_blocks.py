#!/usr/bin/env python3
"""Why a region's blocks end apart: the per-block timeline that `LING_TRACE=a.csv LING_TRACE_BLOCKS=b.csv ling bench ...`
writes (one CSV row per block: layer, region, block, sm, entry, wait, mid, end in µs; -1 where not written).

For each layer kind (KDA / MLA) and region it prints, as medians over the layers of that kind:
- the spread of the blocks' ends after the region's last wait exit (first, median, last) and of their entries;
- rank correlations over a layer's blocks of the end with the entry (late blocks end late: the row split does not
  account for when blocks arrive), with the block index (the static row split) and with the wait exit;
- the ends of the blocks that entered in the last quarter against the first quarter;
- for the blocks that entered after the region's first wait exit (their dependence had resolved before they came):
  how many per layer on average, and the median over all layers' such blocks of their wait exit minus their entry,
  which is then the code before their wait (requests, barriers' setup, instruction fetch), not the wait;
- per SM: how late its blocks end against the layer's median, averaged over the layers, and how well that lateness
  agrees between the even and the odd layers (a correlation near 1: some SMs are slow in every layer, e.g. their DRAM
  or L2 service; near 0: no SM is persistently slow), with the slowest SMs.
Usage: tools/perf/trace_blocks.py blocks.csv [region names, default all]
"""
import csv
import statistics
import sys

NAMES = ["proj", "kstep", "oproj", "router", "moeA", "moeB", "mlaS"]


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r


def pearson(a, b):
    if len(a) < 3:
        return float("nan")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    sa = sum((x - ma) ** 2 for x in a) ** 0.5
    sb = sum((y - mb) ** 2 for y in b) ** 0.5
    if sa == 0 or sb == 0:
        return float("nan")
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (sa * sb)


def spearman(a, b):
    return pearson(ranks(a), ranks(b))


def med(v):
    v = [x for x in v if x == x]
    return statistics.median(v) if v else float("nan")


def main(path, wanted):
    layers = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            d = {k: float(r[k]) for k in ("entry", "wait", "mid", "end")}
            d["block"], d["sm"] = int(r["block"]), int(r["sm"])
            layers.setdefault(int(r["layer"]), {}).setdefault(int(r["region"]), []).append(d)
    acc = {}
    for l, regs in sorted(layers.items()):
        kind = "kda" if 1 in regs else "mla"
        for reg, blocks in regs.items():
            name = NAMES[reg] if reg < len(NAMES) else str(reg)
            if wanted and name not in wanted:
                continue
            bl = [b for b in blocks if b["end"] >= 0 and b["wait"] >= 0]
            if len(bl) < 4:
                continue
            w = max(b["wait"] for b in bl)
            ends = [b["end"] - w for b in bl]
            ent = [b["entry"] - w for b in bl]
            me = statistics.median(ends)
            q = sorted(range(len(bl)), key=lambda i: bl[i]["entry"])
            n4 = max(1, len(q) // 4)
            row = {
                "blocks": len(bl),
                "entF": min(ent), "entL": max(ent),
                "endF": min(ends), "endMd": me, "endL": max(ends),
                "r_entry": spearman(ent, ends),
                "r_index": spearman([b["block"] for b in bl], ends),
                "r_wait": spearman([b["wait"] for b in bl], ends),
                "late_q": statistics.median(ends[i] for i in q[-n4:]),
                "early_q": statistics.median(ends[i] for i in q[:n4]),
            }
            w0 = min(b["wait"] for b in bl)
            late = [b["wait"] - b["entry"] for b in bl if b["entry"] > w0]
            a = acc.setdefault((kind, name), {"rows": [], "sm": {}, "late": []})
            a["rows"].append(row)
            a["late"].extend(late)
            for b, e in zip(bl, ends):  # per SM: lateness against this layer's median, by layer parity
                if b["sm"] >= 0:
                    a["sm"].setdefault(b["sm"], ([], []))[l % 2].append(e - me)
    if not acc:
        sys.exit("no blocks with an end and a wait exit in " + path)
    print("%-11s %5s %6s %6s | ends after the last wait: %6s %6s %6s | rank corr. of the end with: %6s %6s %6s |"
          " entered last / first quarter: %6s %6s | entered after the first wait exit: %4s %7s |"
          " SM lateness: %6s %5s  slowest SMs (µs)" %
          ("region", "blk", "entF", "entL", "endF", "endMd", "endL", "entry", "index", "wait", "late", "early",
           "n", "pre-wait", "even~odd", "SMs"))
    for key in sorted(acc):
        rows, sm = acc[key]["rows"], acc[key]["sm"]
        m = {k: med([r[k] for r in rows]) for k in rows[0]}
        # the late entrants pooled over the layers (a median of per-layer medians would mix layers that had none)
        m["n_after"] = len(acc[key]["late"]) / len(rows)
        m["pre_after"] = med(acc[key]["late"])
        both = [s for s, (ev, od) in sm.items() if ev and od]
        agree = pearson([statistics.fmean(sm[s][0]) for s in both], [statistics.fmean(sm[s][1]) for s in both])
        late = sorted(((statistics.fmean(ev + od), s) for s, (ev, od) in sm.items()), reverse=True)[:5]
        print("%-11s %5d %6.2f %6.2f | %33.2f %6.2f %6.2f | %33.2f %6.2f %6.2f | %37.2f %6.2f | %39.1f %7.2f |"
              " %18.2f %5d  %s  n=%d" %
              (key[0] + ":" + key[1], m["blocks"], m["entF"], m["entL"], m["endF"], m["endMd"], m["endL"],
               m["r_entry"], m["r_index"], m["r_wait"], m["late_q"], m["early_q"], m["n_after"], m["pre_after"],
               agree, len(sm), " ".join("%d:+%.2f" % (s, v) for v, s in late), len(rows)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], set(sys.argv[2:]))
