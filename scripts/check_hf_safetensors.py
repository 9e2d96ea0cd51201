#!/usr/bin/env python3
"""Issue 7's "done when": safetensors written by Hugging Face transformers itself load in C.

A random transformers.GPT2LMHeadModel (LayerNorms and biases perturbed so none is trivial) is saved
with save_pretrained, its logits on random tokens written as a dump, and `./gpt2 validate -m DIR`
must pass against that dump (fp32 compute), on the default path and on --cpu. Cases: fp32; bf16 and fp16 copies
of it (the dump then from the rounded weights, so the loader's conversion must be exact); and the
bare GPT2Model, whose tensor names lack the "transformer." prefix as on the hub.

    python3 scripts/check_hf_safetensors.py [--bin ./gpt2] [--out DIR]

Prints PASS/FAIL lines (tests/test.h's format) and exits 1 on any failure. Needs torch,
transformers (with its safetensors dependency) and a built ./gpt2; no GPU or network needed.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_io import write_dump  # noqa: E402


def random_model(seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # LayerNorm weights 1 and biases 0 at init would hide a mix-up
            p.add_(torch.randn_like(p) * 0.05)
    return model


def save(module, out):
    try:
        module.save_pretrained(out, safe_serialization=True)
    except TypeError:  # transformers versions that always write safetensors dropped the argument
        module.save_pretrained(out)
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    names = sorted(k for k in header if k != "__metadata__")
    dtypes = sorted({header[k]["dtype"] for k in names})
    return f"{len(names)} tensors ({', '.join(dtypes)}), e.g. {names[len(names) // 2]}"


def dump_logits(model, path, seed, V, B=2, T=48):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    x, y = seq[:, :-1], seq[:, 1:]
    with torch.no_grad():
        logits = model.float()(x).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    write_dump(path, x, y, logits, loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./gpt2", help="the gpt2 binary (default ./gpt2)")
    ap.add_argument("--out", default="build/check_hf_safetensors", help="working directory")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False

    base = random_model(seed=1)
    V = base.config.vocab_size
    cases = []  # (name, module to save, model whose fp32 logits are the reference)
    cases.append(("fp32", base, base))
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        rounded = random_model(seed=1).to(dtype)  # a copy: .to() and .float() work in place
        cases.append((dtype_name, rounded, rounded))
    cases.append(("no_prefix", base.transformer, base))

    failures = 0
    for name, module, reference in cases:
        d = os.path.join(a.out, name)
        summary = save(module, d)
        dump = os.path.join(a.out, f"{name}.dump")
        dump_logits(reference, dump, seed=2, V=V)
        print(f"# {name}: save_pretrained wrote {summary}", flush=True)
        for backend in ([], ["--cpu"]):
            label = f"hf_safetensors_{name}" + ("_cpu" if backend else "")
            # fp32 compute: what is checked is the loading, exact for every stored type; bf16 compute's
            # own accuracy is tests/e2e_gpu.sh's business.
            r = subprocess.run([a.bin, "validate", "-m", d, dump, "--dtype", "fp32", *backend], capture_output=True,
                               text=True)
            figures = " ".join(l for l in r.stdout.split("\n") if l.startswith(("path=", "rel_l2", "argmax")))
            if r.returncode == 0:
                print(f"# {label}: {figures}\nPASS {label}", flush=True)
            else:
                failures += 1
                print(f"FAIL {label}: exit {r.returncode}: {r.stderr.strip()} {r.stdout.strip()}".replace("\n", " "),
                      flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
