#!/usr/bin/env python3
"""Runs a GPT-2 checkpoint in PyTorch (fp32) and writes its logits in llm.c's debug-state layout,
the reference that `./gpt2 validate` compares against.

    dump_logits.py -m model.bin --out ref.dump -B 4 -T 64 --seed 1       random tokens
    dump_logits.py -m model.bin --out ref.dump --tokens "15496 995"      given tokens (B = 1)
    dump_logits.py -m model.bin --out ref.dump --hf                      through transformers' GPT2LMHeadModel

bf16 checkpoints are widened to fp32: the dump is the exact fp32 function of the stored weights.
Targets y are the next tokens (the last one drawn at random, or -1 with --tokens).
"""
import argparse
import sys

import torch
import torch.nn.functional as F

from gpt2_io import forward, read_checkpoint, to_hf, write_dump


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="llm.c checkpoint (.bin)")
    ap.add_argument("--out", required=True, help="dump to write")
    ap.add_argument("-B", type=int, default=2, help="sequences (random tokens)")
    ap.add_argument("-T", type=int, default=32, help="tokens per sequence (random tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", help="space-separated token ids to run instead of random ones")
    ap.add_argument("--hf", action="store_true", help="run transformers.GPT2LMHeadModel instead of the built-in module")
    a = ap.parse_args()

    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg, params, _ = read_checkpoint(a.model)
    V = cfg["V"]
    if a.tokens:
        x = torch.tensor([[int(t) for t in a.tokens.split()]], dtype=torch.long)
        y = torch.cat([x[:, 1:], torch.full((1, 1), -1)], dim=1)
    else:
        g = torch.Generator().manual_seed(a.seed)
        seq = torch.randint(0, V, (a.B, a.T + 1), generator=g)
        x, y = seq[:, :-1], seq[:, 1:]
    if x.shape[1] > cfg["maxT"] or int(x.max()) >= V or int(x.min()) < 0:
        sys.exit(f"dump_logits.py: tokens must be < {V} and at most {cfg['maxT']} per sequence")

    with torch.no_grad():
        if a.hf:
            logits = to_hf(cfg, params)(x).logits.float()
        else:
            logits = forward(cfg, params, x)
    loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-1)
    write_dump(a.out, x, y, logits, loss)
    print(f"wrote {a.out}: B={x.shape[0]} T={x.shape[1]} V={V} loss={loss.item():.6f}"
          f" ({'transformers' if a.hf else 'built-in module'})", file=sys.stderr)


if __name__ == "__main__":
    main()
