#!/usr/bin/env python3
"""Reads scripts/ktrace.c's CSV: the graph launches in it and where the median one's time goes.

    python3 scripts/ktrace.py kt.csv [--min-nodes N] [--timeline K]

A graph launch's nodes share one correlation id. Of the launches with at least N nodes (default 20;
choose N so that only one kind of graph qualifies) it prints the spans (first start to last end:
least, median, most), then for the median-span launch every kernel name's count, busy time and the
gaps before it (its start minus the latest end before it: negative where programmatic dependent
launch started it early), and with --timeline the first K nodes one by one. Times in microseconds."""
import argparse
import csv
import statistics
from collections import defaultdict


def short(name):
    return name.split("(")[0][:60]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--min-nodes", type=int, default=20)
    ap.add_argument("--timeline", type=int, default=0)
    a = ap.parse_args()
    launches = defaultdict(list)
    for r in csv.reader(open(a.csv)):
        launches[int(r[2])].append((int(r[0]), int(r[1]), int(r[5]), int(r[6]), r[7]))
    big = [sorted(v) for _, v in sorted(launches.items()) if len(v) >= a.min_nodes]
    if not big:
        raise SystemExit(f"no launch with {a.min_nodes} or more nodes in {a.csv}")
    spans = [(v[-1][1] - v[0][0]) / 1e3 for v in big]
    print(f"{len(big)} launches of {a.min_nodes}+ nodes (node counts {sorted(set(map(len, big)))}); "
          f"spans {min(spans):.1f} / {statistics.median(spans):.1f} / {max(spans):.1f} us (min / median / max)")
    nodes = big[sorted(range(len(big)), key=spans.__getitem__)[len(big) // 2]]
    t0 = nodes[0][0]
    busy = sum(e - s for s, e, *_ in nodes) / 1e3
    print(f"median launch: {len(nodes)} nodes, span {(nodes[-1][1] - t0) / 1e3:.1f} us, busy {busy:.1f} us")
    per = defaultdict(lambda: [0, 0.0, 0.0])
    latest = t0
    for s, e, _, _, name in nodes:
        p = per[short(name)]
        p[0] += 1
        p[1] += (e - s) / 1e3
        p[2] += (s - latest) / 1e3
        latest = max(latest, e)
    print(f"{'node':60s} {'n':>4s} {'busy':>9s} {'gaps':>8s}")
    for name, (n, b, g) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:60s} {n:4d} {b:9.1f} {g:8.1f}")
    latest = t0
    for s, e, grid, block, name in nodes[:a.timeline]:
        print(f"{(s - t0) / 1e3:9.2f} {(e - s) / 1e3:8.2f}  gap {(s - latest) / 1e3:6.2f}  "
              f"{grid:>6d} x {block:<4d} {short(name)}")
        latest = max(latest, e)


if __name__ == "__main__":
    main()
