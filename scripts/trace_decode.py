#!/usr/bin/env python3
"""Per-kernel times inside decode steps, from a `make TRACE=1` build's timeline.

    make TRACE=1 && GPT2_TRACE=trace.bin build/gpu-trace/gpt2 -m MODEL -n 32 --ignore-eos --temp 0 -p Hello
    python3 scripts/trace_decode.py trace.bin [--layers L] [--ops qkv,attention,fc,fcproj]

The file (kernels/kernel_trace.cuh): a uint32 count, then records of (grid id, time ns, event, SM,
blocks, threads), one per block and event: 0 the block started, 1 its pdl_wait() returned (the
previous kernel had completed), 2 it exited. A step runs until its first kernel's grid id comes
back (the next replay of the graph); its
kernels are, in launch order, the embedding, five per layer (qkv, attention, proj, fc, fcproj; --ops
names another sequence, e.g. four where the attention applies the projection), the logits and the
sampler (--tail names others: batched decode runs the final LayerNorm, then the logits on cuBLASLt,
whose kernels carry no stamps, e.g. `--ops ln1,qkv,attention,proj,fc,fcproj --tail lnf,sampling`). Per kernel, the median over the decode steps (a prefill has other kernels
and is left out):
  release   first block's pdl_wait() returning: the previous kernel has completed
  busy      release -> last block's exit
  boundary  last block's exit -> the next kernel's release (drain, flush, release)
  early     how long before its release the kernel's first block was resident (PDL's head start)
"""
import argparse
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
    a = ap.parse_args()
    ops, tail = a.ops.split(","), a.tail.split(",")
    recs = sorted(read(a.trace), key=lambda r: r[1])
    if not recs:
        sys.exit("trace_decode.py: no records (was the binary built with make TRACE=1?)")
    # Steps: a graph's replays reuse its kernels' grid ids, so a step ends where a grid id of the
    # current step comes back after more than 100 us (a kernel's own records span a few tens of
    # us; a step, hundreds). Time gaps alone do not separate steps: the logits kernel's blocks are
    # quiet for ~14 us inside a step, about as long as the host's turnaround between steps.
    steps, cur, last = [], [], {}
    for r in recs:
        gid, t = r[0], r[1]
        if gid in last and t - last[gid] > 100_000:
            steps.append(cur)
            cur, last = [], {}
        cur.append(r)
        last[gid] = t
    steps.append(cur)
    expected = 1 + len(ops) * a.layers + len(tail)
    rows = collections.defaultdict(list)
    names = {}
    used = 0
    seen = []  # kernels with all three stamps, per step
    for step in steps:
        grids = collections.OrderedDict()
        for gid, t, ev, _sm, _blocks, _threads in step:
            grids.setdefault(gid, {0: [], 1: [], 2: []})[ev].append(t)
        ks = sorted((min(v[0]), gid, v) for gid, v in grids.items() if v[0] and v[1] and v[2])
        seen.append(len(ks))
        if len(ks) != expected:
            continue  # not a decode step (a prefill) or an incomplete one
        used += 1
        for i, (start, _gid, v) in enumerate(ks):
            if i == 0:
                name = "embedding"
            elif i <= len(ops) * a.layers:
                name = ops[(i - 1) % len(ops)]
            else:
                name = tail[i - 1 - len(ops) * a.layers]
            release, last_exit = min(v[1]), max(v[2])
            nxt = min(ks[i + 1][2][1]) if i + 1 < len(ks) else None
            rows[name].append((last_exit - release, (nxt - last_exit) if nxt else None, release - start))
            names[name] = i
    if not used:
        counts = collections.Counter(seen)
        sys.exit(f"trace_decode.py: no decode step of {expected} kernels found (--layers?); steps by kernels "
                 f"with all three stamps: {dict(sorted(counts.items()))}")
    print(f"{used} decode steps; median us per kernel (times {a.layers} for a layer's ops)")
    print(f"{'kernel':10s} {'busy':>7s} {'boundary':>9s} {'early':>7s}")
    total = 0.0
    for name in sorted(rows, key=lambda k: names[k]):
        busy = statistics.median(r[0] for r in rows[name]) / 1e3
        bnd = [r[1] for r in rows[name] if r[1] is not None]
        bnd = statistics.median(bnd) / 1e3 if bnd else float("nan")
        early = statistics.median(r[2] for r in rows[name]) / 1e3
        count = a.layers if name in ops else 1
        total += count * (busy + (bnd if bnd == bnd else 0))
        print(f"{name:10s} {busy:7.2f} {bnd:9.2f} {early:7.2f}")
    print(f"a step: ~{total:.1f} us of busy + boundary time")


if __name__ == "__main__":
    main()
