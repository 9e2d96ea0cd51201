#!/usr/bin/env python3
"""Per-kernel times inside decode steps, from a `make TRACE=1` build's timeline.

    make TRACE=1 && GPT2_TRACE=trace.bin build/gpu-trace/gpt2 -m MODEL -n 32 --ignore-eos --temp 0 -p Hello
    python3 scripts/trace_decode.py trace.bin [--layers L] [--ops qkv,attention,fc,fcproj]

Batched decode (bench, one batch size; on Hopper at 17-64 rows only layer 0 runs an ln1 kernel):
    GPT2_TRACE=trace.bin build/gpu-trace/gpt2 bench -m MODEL --path fused --dtype bf16 --quick --batches 64 \
        --prompts 16 --no-forward --no-profile
    python3 scripts/trace_decode.py trace.bin --layer0 ln1,qkv,attention,proj,fc,fcproj --tail lnf,sampling

The file (kernels/kernel_trace.cuh): a uint32 count, then records of (grid id, time ns, event, SM,
blocks, threads), one per block and event: 0 the block started, 1 its pdl_wait() returned (the
previous kernel had completed), 2 it exited. A step is one replay of the decode graph, from its
first kernel; its kernels are, in release order, the embedding, five per layer (qkv, attention,
proj, fc, fcproj; --ops names another sequence, e.g. four where the attention applies the
projection; --layer0 layer 0's where they differ), the logits and the sampler (--tail names others:
batched decode runs the final LayerNorm, then the logits on cuBLASLt, whose kernels carry no
stamps). Per kernel, the median over the decode steps (a prefill has other kernels and is left out):
  release   first block's pdl_wait() returning: the previous kernel has completed
  busy      release -> last block's exit
  boundary  last block's exit -> the next kernel's release (drain, flush, release)
  early     how long before its release the kernel's first block was resident (PDL's head start)
  late      how long after its release its last block became resident (0 when all were before:
            a block that starts after the release loads its weights on the step's path)
  ready     how long before its release its last block became resident (negative: after); a block
            resident less long than its weights take to load (an SM's share of the copy rate,
            ~32 bytes a ns on an H200) still loads them on the step's path
"""
import argparse
import bisect
import collections
import statistics
import struct
import sys

OPS = ["qkv", "attention", "proj", "fc", "fcproj"]


def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<I", data, 0)
    return [struct.unpack_from("<QQIIII", data, 4 + 32 * i) for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--ops", default=",".join(OPS), help="a layer's kernels, in launch order")
    ap.add_argument("--tail", default="logits,sampling", help="the stamped kernels after the last layer")
    ap.add_argument("--layer0", help="layer 0's kernels where they differ (batched decode: ln1 first)")
    a = ap.parse_args()
    ops, tail = a.ops.split(","), a.tail.split(",")
    layer0 = a.layer0.split(",") if a.layer0 else ops
    names_in_step = ["embedding"] + layer0 + ops * (a.layers - 1) + tail
    recs = sorted(read(a.trace), key=lambda r: r[1])
    if not recs:
        sys.exit("trace_decode.py: no records (was the binary built with make TRACE=1?)")
    # Launches: a graph's replays reuse its kernels' grid ids, and a launch leaves three records a
    # block, so a grid id's records in time order are its launches, 3 x blocks records each (the
    # last one cut short where the buffer filled is dropped). Time alone does not separate them:
    # with PDL a kernel's first blocks can start long before its release.
    by_gid = collections.defaultdict(list)
    for r in recs:
        by_gid[r[0]].append(r)
    launches = []  # (first start, gid, {event: [times]})
    for gid, rs in by_gid.items():
        per = 3 * rs[0][4]
        for i in range(0, len(rs) - per + 1, per):
            ev = {0: [], 1: [], 2: []}
            for r in rs[i:i + per]:
                ev[r[2]].append(r[1])
            if ev[0] and ev[1] and ev[2]:
                launches.append((min(ev[0]), gid, ev))
    launches.sort(key=lambda x: x[0])
    # Steps: a decode graph's replays; each starts with its first kernel (the embedding), the
    # earliest-starting grid id of those launched more than once. A prefill's kernels and
    # incomplete steps fall out by their count.
    repeated = collections.Counter(gid for _s, gid, _e in launches)
    first_gid = next(gid for _s, gid, _e in launches if repeated[gid] > 1)
    starts = [s0 for s0, gid, _e in launches if gid == first_gid]
    steps = [[] for _ in starts]
    for s0, gid, ev in launches:
        k = bisect.bisect_right(starts, s0) - 1
        if k >= 0:
            steps[k].append((s0, gid, ev))
    expected = len(names_in_step)
    rows = collections.defaultdict(list)
    names = {}
    used = 0
    seen = []  # kernels per step
    for step in steps:
        ks = sorted(step, key=lambda x: min(x[2][1]))  # in release order
        seen.append(len(ks))
        if len(ks) != expected:
            continue  # not a decode step (a prefill) or an incomplete one
        used += 1
        for i, (start, _gid, v) in enumerate(ks):
            name = names_in_step[i]
            release, last_exit = min(v[1]), max(v[2])
            nxt = min(ks[i + 1][2][1]) if i + 1 < len(ks) else None
            late = max(0, max(v[0]) - release)
            rows[name].append((last_exit - release, (nxt - last_exit) if nxt else None, release - start, late,
                               release - max(v[0])))
            names.setdefault(name, i)
    if not used:
        counts = collections.Counter(seen)
        sys.exit(f"trace_decode.py: no decode step of {expected} kernels found (--layers, --ops?); steps by "
                 f"kernels: {dict(sorted(counts.items()))}")
    print(f"{used} decode steps; median us per kernel (times {a.layers} for a layer's ops)")
    print(f"{'kernel':10s} {'busy':>7s} {'boundary':>9s} {'early':>7s} {'late':>7s} {'ready':>7s}")
    total = 0.0
    for name in sorted(rows, key=lambda k: names[k]):
        busy = statistics.median(r[0] for r in rows[name]) / 1e3
        bnd = [r[1] for r in rows[name] if r[1] is not None]
        bnd = statistics.median(bnd) / 1e3 if bnd else float("nan")
        early = statistics.median(r[2] for r in rows[name]) / 1e3
        late = statistics.median(r[3] for r in rows[name]) / 1e3
        ready = statistics.median(r[4] for r in rows[name]) / 1e3
        count = names_in_step.count(name)
        total += count * (busy + (bnd if bnd == bnd else 0))
        print(f"{name:10s} {busy:7.2f} {bnd:9.2f} {early:7.2f} {late:7.2f} {ready:7.2f}")
    print(f"a step: ~{total:.1f} us of busy + boundary time")


if __name__ == "__main__":
    main()
