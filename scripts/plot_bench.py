#!/usr/bin/env python3
"""Charts of `./gpt2 bench --json` and `scripts/bench_torch.py --json` files.

    python3 scripts/plot_bench.py [--out DIR] FILE.json...

For each model size found (by L and C), two PNGs in --out (default docs/):
  bench_decode_<size>.png    decode tokens/s against batch (log-log), one line per engine, path, dtype
  bench_prefill_<size>.png   prefill ms (time to first token) against prompt length (log-log), likewise
Each title names the GPU, the model, and the commit and date of the first file.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZE_BY_SHAPE = {(12, 768): "124M", (24, 1024): "355M", (36, 1280): "774M", (48, 1600): "1558M"}
STYLE = {  # engine/path -> colour; fp32 dashed, bf16 solid
    ("gpt2.c", "fused"): "tab:red", ("gpt2.c", "reference"): "tab:orange", ("gpt2.c", "cpu"): "tab:brown",
    ("pytorch", "hf-eager"): "tab:blue", ("pytorch", "torch-compile"): "tab:green",
}


def size_name(model):
    return SIZE_BY_SHAPE.get((model["L"], model["C"]), f"L{model['L']}_C{model['C']}")


def label(engine, path, dtype):
    return f"{engine} {path} {dtype}"


def plot(series, xkey, ykey, xlabel, ylabel, title, out):
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    for (engine, path, dtype), pts in sorted(series.items()):
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4,
                color=STYLE.get((engine, path), None), linestyle="-" if dtype == "bf16" else "--",
                label=label(engine, path, dtype))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    xs = sorted({p[0] for pts in series.values() for p in pts})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    print(f"plot_bench: wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default="docs")
    a = ap.parse_args()
    by_size = {}
    for f in a.files:
        if not os.path.exists(f):
            print(f"plot_bench: {f}: no such file, skipped", file=sys.stderr)
            continue
        with open(f) as fh:
            d = json.load(fh)
        if "results" not in d:
            print(f"plot_bench: {f}: no results (a --kernels file?), skipped", file=sys.stderr)
            continue
        by_size.setdefault(size_name(d["model"]), []).append(d)
    os.makedirs(a.out, exist_ok=True)
    for size, docs in by_size.items():
        first = docs[0]
        name = first["model"].get("name", "")
        what = "random weights" if name.startswith("random") else os.path.basename(name.rstrip("/")) or "?"
        head = f"GPT-2 {size} ({what}), {first['device']}, commit {first['commit']}, {first.get('date', '')[:10]}"
        decode, prefill = {}, {}
        for d in docs:
            eng = d.get("engine", "gpt2.c")
            for r in d["results"]:
                key = (eng, r["path"], r["dtype"])
                if r["phase"] == "decode" and r["tok_s"]:
                    decode.setdefault(key, []).append((r["batch"], r["tok_s"]))
                elif r["phase"] == "prefill" and r["ms"]:
                    prefill.setdefault(key, []).append((r["prompt_len"], r["ms"]))
        news = {}  # engine -> new tokens per decode run
        for d in docs:
            for r in d["results"]:
                if r["phase"] == "decode":
                    news.setdefault(d.get("engine", "gpt2.c"), set()).add(r["new_tokens"])
        new = ", ".join(f"{e} {'/'.join(map(str, sorted(n)))}" for e, n in sorted(news.items()))
        if decode:
            plot(decode, "batch", "tok_s", "batch (sequences decoded together)", "generated tokens/s",
                 f"decode after a 16-token prompt (new tokens: {new})\n{head}", os.path.join(a.out, f"bench_decode_{size}.png"))
        if prefill:
            plot(prefill, "prompt_len", "ms", "prompt length (tokens)", "time to first token (ms)",
                 f"prefill, batch 1\n{head}", os.path.join(a.out, f"bench_prefill_{size}.png"))


if __name__ == "__main__":
    main()
