#!/usr/bin/env python3
"""Per-kernel times inside decode steps, from a `make TRACE=1` build's timeline.

    make TRACE=1 && GPT2_TRACE=trace.bin build/gpu-trace/gpt2 -m MODEL -n 32 --ignore-eos --temp 0 -p Hello
    python3 scripts/trace_decode.py trace.bin [--layers L] [--ops qkv,attention,fc,fcproj]

Batched decode (bench, one batch size; on Hopper at 17-64 rows only layer 0 runs an ln1 kernel):
    GPT2_TRACE=trace.bin build/gpu-trace/gpt2 bench -m MODEL --path fused --dtype bf16 --quick --batches 64 \
        --prompts 16 --no-forward --no-profile
    python3 scripts/trace_decode.py trace.bin --layer0 ln1,qkv,attention,proj,fc,fcproj --tail lnf,sampling

The file (kernels/kernel_trace.cuh): a uint32 count, then records of (grid id, time ns, event, SM,
blocks, block), one per block and event: 0 the block started, 1 its pdl_wait() returned (the
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
Kernels that stamp their own phases (events 3.., kernel_trace.cuh; gemm_rows: W landed, x landed,
MMAs done, epilogue started; attn_decode1: keys done, streams merged, block 0 has every partial) get
a second table: for each phase, when the last block reached it
after the kernel's release (the dependent path), and the median block's time.

--blocks NAME:LAYER (e.g. fcproj:5) lists that kernel's blocks in the middle decode step, in the order
they became resident: start, its own phases (p0..) and exit after its release, the SM, and the blocks
of the three kernels before it that ran on the same SM (start, exit). Blocks that wait for others on their SM to leave
show here ("Session 28" in docs/PERF.md: the L1/shared split kept the MLP projection's blocks off the
fc GEMV's SMs).
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
    ap.add_argument("--blocks", help="NAME:LAYER: that kernel's blocks and their SMs in the middle step")
    a = ap.parse_args()
    ops, tail = a.ops.split(","), a.tail.split(",")
    layer0 = a.layer0.split(",") if a.layer0 else ops
    names_in_step = ["embedding"] + layer0 + ops * (a.layers - 1) + tail
    recs = sorted(read(a.trace), key=lambda r: r[1])
    if not recs:
        sys.exit("trace_decode.py: no records (was the binary built with make TRACE=1?)")
    # Launches: a graph's replays reuse their kernels' grid ids, so a block's records (grid id, block)
    # in time order are its visits, one a launch, each ending at its exit; the k-th visits of a grid
    # id's blocks are its k-th launch (one cut short where the buffer filled is dropped). Time alone
    # does not separate launches: with PDL a kernel's first blocks can start long before its release.
    by_block = collections.defaultdict(list)
    for r in recs:
        by_block[(r[0], r[5])].append(r)
    visits = collections.defaultdict(lambda: collections.defaultdict(list))  # gid -> k -> records
    for (gid, _b), rs in by_block.items():
        k = 0
        for r in sorted(rs, key=lambda r: (r[1], r[2] == 2)):  # an exit after a phase of its time
            visits[gid][k].append(r)
            k += r[2] == 2
    launches = []  # (first start, gid, {event: [times]})
    block_sm = {}  # id({event: [times]}) -> [(block, SM, start, exit)]
    for gid, by_k in visits.items():
        for rs in by_k.values():
            if len({r[5] for r in rs}) < rs[0][4]:
                continue
            ev = collections.defaultdict(list)
            for r in rs:
                ev[r[2]].append(r[1])
            if ev[0] and ev[1] and ev[2]:
                ev = dict(ev)
                launches.append((min(ev[0]), gid, ev))
                starts = {r[5]: (r[1], r[3]) for r in rs if r[2] == 0}
                exits = {r[5]: r[1] for r in rs if r[2] == 2}
                marks = collections.defaultdict(dict)  # block -> {phase: time}
                for r in rs:
                    if r[2] >= 3:
                        marks[r[5]][r[2] - 3] = r[1]
                block_sm[id(ev)] = [(b, sm, t, exits.get(b), marks[b]) for b, (t, sm) in starts.items()]
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
    # Queued decode steps alternate between two graphs, one a staging slot (gpu_engine.cu), whose
    # kernels have grid ids of their own: the launches between two of first_gid's then hold m steps,
    # split here in release order.
    split = []
    for step in steps:
        ks = sorted(step, key=lambda x: min(x[2][1]))
        if len(ks) > expected and len(ks) % expected == 0:
            split += [ks[i:i + expected] for i in range(0, len(ks), expected)]
        else:
            split.append(step)
    steps = split
    # A step's shape: each kernel's grid id, in release order. Only steps of the commonest shape with
    # the expected count are used, so a step cut short and padded by a stray launch cannot shift names.
    def shape(step):
        return tuple(gid for _s, gid, _v in sorted(step, key=lambda x: min(x[2][1])))
    shapes = collections.Counter(shape(st) for st in steps if len(st) == expected)
    common = shapes.most_common(1)[0][0] if shapes else None
    rows = collections.defaultdict(list)
    phases = collections.defaultdict(lambda: collections.defaultdict(list))  # name -> event -> [(last, median)]
    names = {}
    used = 0
    used_steps = []
    seen = []  # kernels per step
    for step in steps:
        ks = sorted(step, key=lambda x: min(x[2][1]))  # in release order
        seen.append(len(ks))
        if len(ks) != expected or shape(step) != common:
            continue  # not a decode step (a prefill), an incomplete one or a stray
        used += 1
        used_steps.append(ks)
        for i, (start, _gid, v) in enumerate(ks):
            name = names_in_step[i]
            release, last_exit = min(v[1]), max(v[2])
            nxt = min(ks[i + 1][2][1]) if i + 1 < len(ks) else None
            late = max(0, max(v[0]) - release)
            rows[name].append((last_exit - release, (nxt - last_exit) if nxt else None, release - start, late,
                               release - max(v[0])))
            for e in sorted(v):
                if e >= 3 or (e in (1, 2) and len(v) > 3):
                    phases[name][e].append((max(v[e]) - release, statistics.median(v[e]) - release))
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
    if phases:
        print("\nphases, us after the kernel's release: last block / median block (p0.. the kernel's own stamps)")
        for name in sorted(phases, key=lambda k: names[k]):
            cols = []
            for e in sorted(phases[name]):
                last = statistics.median(x[0] for x in phases[name][e]) / 1e3
                med = statistics.median(x[1] for x in phases[name][e]) / 1e3
                cols.append(f"{ {1: 'released', 2: 'exit'}.get(e, 'p%d' % (e - 3))} {last:6.2f} /{med:6.2f}")
            print(f"{name:10s} " + "  ".join(cols))
    if a.blocks:
        print_blocks(a.blocks, names_in_step, used_steps[len(used_steps) // 2], block_sm, len(layer0), len(ops))


def print_blocks(spec, names_in_step, ks, block_sm, n_layer0, n_ops):
    """--blocks: one kernel's blocks in one step, with what ran before them on their SMs."""
    name, layer = spec.split(":")
    layer = int(layer)
    first = 1 if layer == 0 else 1 + n_layer0 + (layer - 1) * n_ops  # the layer's first kernel
    idx = names_in_step.index(name, first)
    release = min(ks[idx][2][1])
    on_sm = collections.defaultdict(list)
    for j in range(max(0, idx - 3), idx):
        for _b, sm, t, e, _m in block_sm[id(ks[j][2])]:
            on_sm[sm].append(f"{names_in_step[j]}[{(t - release) / 1e3:+.2f},{(e - release) / 1e3:+.2f}]")
    print(f"\n{name} of layer {layer}, middle step: its blocks, us after its release (p0..: its own stamps)")
    for b, sm, t, e, marks in sorted(block_sm[id(ks[idx][2])], key=lambda x: x[2]):
        own = "".join(f" p{k} {(marks[k] - release) / 1e3:+6.2f}" for k in sorted(marks))
        print(f"  block {b:4d} SM {sm:3d} start {(t - release) / 1e3:+7.2f}{own} exit {(e - release) / 1e3:+6.2f} | "
              + " ".join(on_sm[sm]))


if __name__ == "__main__":
    main()
