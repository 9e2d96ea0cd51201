#!/usr/bin/env python3
"""Summarises an ncu CSV (gpu__time_duration.sum per kernel, in launch order) by forward call.

Each forward begins with the embedding kernel, so the launches are cut there. For every forward
that took more than --min-us in all, prints its kernel count and total, then per kernel name (in
order of first appearance) the launches, summed us and mean us, with the first launch's grid.
Used by scripts/gpu_check.sh's ncu_forward step; docs/PERF.md reads its output.

    python3 scripts/ncu_summary.py FILE.csv [--min-us 200]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--min-us", type=float, default=200.0)
    a = ap.parse_args()
    rows = [r for r in csv.reader(open(a.csv)) if len(r) > 5]
    head = rows[0]
    name_i, value_i = head.index("Kernel Name"), head.index("Metric Value")
    grid_i = head.index("Grid Size") if "Grid Size" in head else None
    launches = []
    for r in rows[1:]:
        name = r[name_i].split("(")[0].replace("void ", "")[:70]
        grid = r[grid_i] if grid_i is not None else ""
        launches.append((name, grid, float(r[value_i].replace(",", "")) / 1e3))
    forwards, current = [], []
    for launch in launches:
        if "embedding" in launch[0] and current:
            forwards.append(current)
            current = []
        current.append(launch)
    if current:
        forwards.append(current)
    for i, fw in enumerate(forwards):
        total = sum(us for _, _, us in fw)
        if total < a.min_us:
            continue
        print(f"forward {i}: {len(fw)} kernels, {total:.1f} us")
        by_name = {}
        for name, grid, us in fw:
            n, s, g = by_name.get(name, (0, 0.0, grid))
            by_name[name] = (n + 1, s + us, g)
        for name, (n, s, g) in by_name.items():
            print(f"  {s:9.1f} us  {n:4d} x {s / n:8.2f}  grid {g:<14s} {name}")


if __name__ == "__main__":
    main()
