#!/usr/bin/env python3
"""Exports an llm.c GPT-2 checkpoint (.bin) as a Hugging Face model: model.safetensors with GPT-2's
tensor names plus config.json, the layout `make download` fetches and `./gpt2 -m DIR` reads.

    export_safetensors.py model/tiny.bin model/tiny_hf/                    directory: model.safetensors + config.json
    export_safetensors.py model/tiny.bin out/tiny.safetensors              a file, config.json beside it
    export_safetensors.py model/tiny.bin out/ --dtype f16 --prefix transformer.

The inverse of llm.c's export: Conv1D weights go back to (in, out), wte loses its padded rows.
Needs numpy only; the tensors are written with the `safetensors` package (through torch) when both
are installed, else by hand (the format is a length, a JSON header and the raw bytes).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

CKPT_MAGIC = 20240326
LAYER_TENSORS = [  # llm.c parameter -> Hugging Face name inside h.{i}, transposed?
    ("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
    ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
    ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
    ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
    ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
    ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False),
]


def param_shapes(cfg):
    L, C, Vp, T = cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]
    return [("wte", (Vp, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
            ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)),
            ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
            ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


def read_checkpoint(path):
    """(cfg, {name: array}, "F32" | "BF16"); bf16 arrays are the raw uint16 bits."""
    with open(path, "rb") as f:
        data = bytearray(f.read())  # writable, so torch.from_numpy can share the arrays without a warning
    if len(data) < 1024:
        sys.exit(f"{path}: shorter than llm.c's 1024-byte header")
    h = struct.unpack("<256i", data[:1024])
    if h[0] != CKPT_MAGIC or h[1] not in (3, 5):
        sys.exit(f"{path}: not an llm.c GPT-2 checkpoint (magic {h[0]}, version {h[1]})")
    cfg = dict(maxT=h[2], V=h[3], L=h[4], NH=h[5], C=h[6], Vp=h[7])
    dtype = np.uint16 if h[1] == 5 else np.float32
    params, offset = {}, 1024
    for name, shape in param_shapes(cfg):
        n = int(np.prod(shape))
        params[name] = np.frombuffer(data, dtype=dtype, count=n, offset=offset).reshape(shape)
        offset += n * np.dtype(dtype).itemsize
    if offset != len(data):
        sys.exit(f"{path}: {len(data)} bytes, but its header implies {offset}")
    return cfg, params, "BF16" if h[1] == 5 else "F32"


def convert(a, src, dst):
    """Array of dtype src ("F32" or "BF16" bits) as dst: float32, float16, or bf16 bits (round to nearest even)."""
    if src == dst:
        return a
    f = (a.astype(np.uint32) << 16).view(np.float32) if src == "BF16" else a
    if dst == "F32":
        return f.astype(np.float32)
    if dst == "F16":
        return f.astype(np.float16)
    bits = f.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def hf_tensors(cfg, params, src, dst, prefix):
    """[(name, dtype, array)] under Hugging Face's names and (in, out) Conv1D layout."""
    out = [(prefix + "wte.weight", params["wte"][:cfg["V"]]), (prefix + "wpe.weight", params["wpe"])]
    for l in range(cfg["L"]):
        for ours, theirs, transpose in LAYER_TENSORS:
            t = params[ours][l]
            out.append((f"{prefix}h.{l}.{theirs}", t.T if transpose else t))
    out += [(prefix + "ln_f.weight", params["lnfw"]), (prefix + "ln_f.bias", params["lnfb"])]
    return [(name, dst, np.ascontiguousarray(convert(a, src, dst))) for name, a in out]


def write_by_hand(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, a in tensors:
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # as the reference writer: the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, a in tensors:
            f.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def write_with_package(path, tensors):
    import torch
    from safetensors.torch import save_file
    as_torch = {}
    for name, dtype, a in tensors:
        t = torch.from_numpy(a.view(np.int16) if dtype == "BF16" else a)
        as_torch[name] = t.view(torch.bfloat16) if dtype == "BF16" else t
    save_file(as_torch, path, metadata={"format": "pt"})


def have_package():
    try:
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def hf_config(cfg, dtype):
    """The config.json transformers writes for GPT2LMHeadModel, with this model's sizes."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
            "n_layer": cfg["L"], "n_head": cfg["NH"], "n_embd": cfg["C"], "n_positions": cfg["maxT"],
            "n_ctx": cfg["maxT"], "vocab_size": cfg["V"], "layer_norm_epsilon": 1e-05,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": cfg["V"] - 1,
            "eos_token_id": cfg["V"] - 1, "tie_word_embeddings": True,
            "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="llm.c checkpoint (.bin, fp32 or bf16)")
    ap.add_argument("out", help="directory (model.safetensors + config.json) or a .safetensors file")
    ap.add_argument("--dtype", choices=["same", "f32", "bf16", "f16"], default="same",
                    help="tensor type to store (default: the checkpoint's own)")
    ap.add_argument("--prefix", default="", help='name prefix, e.g. "transformer." as GPT2LMHeadModel saves')
    ap.add_argument("--writer", choices=["auto", "hand", "safetensors"], default="auto",
                    help="auto: the safetensors package when installed with torch, else by hand")
    ap.add_argument("--no-config", action="store_true", help="write no config.json (the reader then uses the shapes)")
    a = ap.parse_args()

    cfg, params, src = read_checkpoint(a.checkpoint)
    dst = src if a.dtype == "same" else {"f32": "F32", "bf16": "BF16", "f16": "F16"}[a.dtype]
    if a.out.endswith(".safetensors"):
        path = a.out
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    else:
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, "model.safetensors")
    tensors = hf_tensors(cfg, params, src, dst, a.prefix)
    writer = a.writer if a.writer != "auto" else ("safetensors" if have_package() else "hand")
    if writer == "safetensors" and not have_package():
        sys.exit("export_safetensors.py: --writer safetensors needs the safetensors and torch packages")
    (write_with_package if writer == "safetensors" else write_by_hand)(path, tensors)
    if not a.no_config:
        with open(os.path.join(os.path.dirname(path) or ".", "config.json"), "w") as f:
            json.dump(hf_config(cfg, dst), f, indent=2)
            f.write("\n")
    print(f"wrote {path}: {len(tensors)} tensors ({dst}, {writer} writer), L={cfg['L']} C={cfg['C']} "
          f"NH={cfg['NH']} V={cfg['V']} maxT={cfg['maxT']}{'' if a.no_config else ', config.json beside it'}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
