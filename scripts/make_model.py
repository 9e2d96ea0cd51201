#!/usr/bin/env python3
"""Writes a GPT-2 checkpoint in llm.c's flat format (fp32 v3 or bf16 v5).

Random weights of any shape, seeded:
    make_model.py --out model/tiny.bin --layers 2 --channels 96 --heads 3 --vocab 301 --max-seq 64
A Hugging Face GPT-2 (hub name or local directory; needs transformers):
    make_model.py --out model/gpt2_124M.bin --from-hf gpt2

Random weights follow GPT-2's initialisation (normal, std 0.02, projections scaled by 1/sqrt(2L)).
--std raises the spread so the top logits are not near-ties; --ln-std gives LayerNorm weights
1 + N(0, s) and all biases N(0, s), so a wrong LayerNorm or bias cannot hide. Padded vocabulary
rows (V..Vp) are zero.
"""
import argparse
import math
import sys

import torch

from gpt2_io import param_shapes, write_checkpoint


def random_params(cfg, seed, std, ln_std):
    g = torch.Generator().manual_seed(seed)

    def normal(shape, s):
        return torch.randn(shape, generator=g) * s

    L = cfg["L"]
    p = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("w") and name.startswith("ln"):
            p[name] = 1.0 + normal(shape, ln_std)
        elif name.endswith("b"):
            p[name] = normal(shape, ln_std)
        elif name in ("attprojw", "fcprojw"):
            p[name] = normal(shape, std / math.sqrt(2 * L))
        else:
            p[name] = normal(shape, std)
    p["wte"][cfg["V"]:] = 0.0
    return p


def hf_params(name):
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(name)
    hc = model.config
    C, V = hc.n_embd, hc.vocab_size
    cfg = dict(maxT=hc.n_positions, V=V, L=hc.n_layer, NH=hc.n_head, C=C, Vp=(V + 127) // 128 * 128)
    sd = {k.removeprefix("transformer."): v.float() for k, v in model.state_dict().items()}
    hs = [f"h.{l}." for l in range(cfg["L"])]
    stack = lambda key, transpose=False: torch.stack([sd[h + key].T if transpose else sd[h + key] for h in hs])
    wte = torch.zeros(cfg["Vp"], C)
    wte[:V] = sd["wte.weight"]
    p = {"wte": wte, "wpe": sd["wpe.weight"],
         "ln1w": stack("ln_1.weight"), "ln1b": stack("ln_1.bias"),
         "qkvw": stack("attn.c_attn.weight", True), "qkvb": stack("attn.c_attn.bias"),
         "attprojw": stack("attn.c_proj.weight", True), "attprojb": stack("attn.c_proj.bias"),
         "ln2w": stack("ln_2.weight"), "ln2b": stack("ln_2.bias"),
         "fcw": stack("mlp.c_fc.weight", True), "fcb": stack("mlp.c_fc.bias"),
         "fcprojw": stack("mlp.c_proj.weight", True), "fcprojb": stack("mlp.c_proj.bias"),
         "lnfw": sd["ln_f.weight"], "lnfb": sd["ln_f.bias"]}
    return cfg, p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoint to write")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--from-hf", metavar="NAME_OR_DIR", help="export this Hugging Face GPT-2 instead")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--padded-vocab", type=int, help="default: vocab rounded up to a multiple of 128")
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02, help="weight standard deviation (default 0.02)")
    ap.add_argument("--ln-std", type=float, default=0.0,
                    help="spread of LayerNorm weights around 1 and of all biases (default 0: GPT-2's init)")
    a = ap.parse_args()
    if a.from_hf:
        cfg, p = hf_params(a.from_hf)
    else:
        if a.channels % a.heads:
            sys.exit(f"make_model.py: --channels {a.channels} is not divisible by --heads {a.heads}")
        Vp = a.padded_vocab or (a.vocab + 127) // 128 * 128
        cfg = dict(maxT=a.max_seq, V=a.vocab, L=a.layers, NH=a.heads, C=a.channels, Vp=Vp)
        p = random_params(cfg, a.seed, a.std, a.ln_std)
    write_checkpoint(a.out, cfg, p, a.dtype)
    n = sum(t.numel() for t in p.values())
    print(f"wrote {a.out}: {n} parameters ({a.dtype}), L={cfg['L']} C={cfg['C']} NH={cfg['NH']} "
          f"V={cfg['V']} Vp={cfg['Vp']} maxT={cfg['maxT']}", file=sys.stderr)


if __name__ == "__main__":
    main()
