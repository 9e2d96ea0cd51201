#!/usr/bin/env python3
"""Greedy generation by Hugging Face transformers on an llm.c checkpoint: the reference that
tests/e2e_gpu.sh holds `./gpt2 --temp 0 --ids` to. With --builtin, by gpt2_io's own PyTorch module
instead (a full forward per new token, no transformers: tests/e2e_generate.sh, on the CPU path).

    check_hf_generate.py -m model.bin --tokens "464 2068 7586" -n 64 [--builtin]

Prints the prompt's ids and the n new ones on one line, space-separated (the format of ./gpt2 --ids).
The weights go into transformers.GPT2LMHeadModel in fp32 (bf16 checkpoints widened) through
gpt2_io.to_hf; generation is `generate(do_sample=False)` with the end-of-text token not stopping it,
as ./gpt2 --ignore-eos, so both run exactly n steps.
"""
import argparse
import sys

import torch

from gpt2_io import forward, read_checkpoint, to_hf


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="llm.c checkpoint (.bin)")
    ap.add_argument("--tokens", required=True, help="space-separated prompt token ids")
    ap.add_argument("-n", type=int, default=64, help="new tokens (default 64)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu: fp32, no TF32)")
    ap.add_argument("--builtin", action="store_true", help="gpt2_io's module instead of transformers (CPU)")
    a = ap.parse_args()

    cfg, params, _ = read_checkpoint(a.model)
    prompt = [int(t) for t in a.tokens.split()]
    if not prompt or len(prompt) + a.n > cfg["maxT"] or max(prompt) >= cfg["V"] or min(prompt) < 0:
        sys.exit(f"check_hf_generate.py: need 1..{cfg['maxT'] - a.n} prompt tokens, each < {cfg['V']}")
    if a.builtin:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(a.n):
                logits = forward(cfg, params, torch.tensor([ids], dtype=torch.long))
                ids.append(int(logits[0, -1].argmax()))
        print(" ".join(str(i) for i in ids))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    model = to_hf(cfg, params).to(a.device)
    model.generation_config.eos_token_id = None  # run all n steps, as ./gpt2 --ignore-eos
    model.generation_config.pad_token_id = 0
    x = torch.tensor([prompt], dtype=torch.long, device=a.device)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.n, min_new_tokens=0,
                             do_sample=False, num_beams=1)
    ids = out[0].tolist()
    if len(ids) != len(prompt) + a.n:
        sys.exit(f"check_hf_generate.py: generate returned {len(ids) - len(prompt)} new tokens, wanted {a.n}")
    print(" ".join(str(i) for i in ids))


if __name__ == "__main__":
    main()
