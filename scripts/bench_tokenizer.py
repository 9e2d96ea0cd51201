#!/usr/bin/env python3
"""tiktoken's encoding speed on a file, one thread, to set beside `./gpt2 tokenize --bench FILE`.

The Encoding is built from this repository's tokenizer/ files (as in make_tokenizer_fixtures.py),
so both sides do the same work: the whole file, <|endoftext|> allowed, best of several runs.
Hugging Face `tokenizers` is timed too when installed, held to one thread (RAYON_NUM_THREADS=1).

  python3 scripts/bench_tokenizer.py FILE [--ids IDS]

With --ids, IDS holds `./gpt2 tokenize -f FILE`'s output, and the script also says whether those
ids are tiktoken's, token for token (an exactness check on a large real text).
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import hf_tokenizer, tiktoken_encoding  # noqa: E402


def best_time(fn, min_total=2.0, min_runs=3):
    best, total, runs = float("inf"), 0.0, 0
    while total < min_total or runs < min_runs:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best, total, runs = min(best, dt), total + dt, runs + 1
    return best, runs, out


def main():
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--ids"):
        sys.exit(__doc__)
    path = args[0]
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    mb = len(raw) / 1e6

    t0 = time.perf_counter()
    enc = tiktoken_encoding()
    load_ms = 1e3 * (time.perf_counter() - t0)
    dt, runs, ids = best_time(lambda: enc.encode(text, allowed_special="all"))
    print(f"tiktoken: load {load_ms:.1f} ms; {path}, {len(raw)} bytes -> {len(ids)} tokens, "
          f"best of {runs} runs {1e3 * dt:.1f} ms: {mb / dt:.2f} MB/s")
    if len(args) == 3:
        with open(args[2]) as f:
            c_ids = [int(x) for x in f.read().split()]
        first = next((i for i, (a, b) in enumerate(zip(c_ids, ids)) if a != b), min(len(c_ids), len(ids)))
        same = c_ids == ids
        print(f"gpt2 ids == tiktoken ids: {same}" + ("" if same else f" (first difference at token {first})"))

    try:
        hf = hf_tokenizer()
    except ImportError:
        return
    dt, runs, out = best_time(lambda: hf.encode(text, add_special_tokens=False))
    print(f"HF tokenizers (RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}): {len(out.ids)} tokens, "
          f"best of {runs} runs {1e3 * dt:.1f} ms: {mb / dt:.2f} MB/s; same ids as tiktoken: {out.ids == ids}")


if __name__ == "__main__":
    main()
