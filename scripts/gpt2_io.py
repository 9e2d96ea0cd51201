"""llm.c's flat GPT-2 checkpoint and logits-dump formats, and a small PyTorch GPT-2 with Hugging Face
GPT-2 semantics. Shared by make_model.py, dump_logits.py and the other scripts.

Checkpoint: 256 x int32 header [magic 20240326, version 3 (fp32) | 5 (bf16), maxT, V, L, NH, C, Vp],
then 16 tensors in llm.c's order (PARAM_SHAPES). Dump: 256 x int32 header [20240327, 2, B, T], then
x int32[B*T], y int32[B*T], logits fp32[B*T*V], loss fp32.
"""
import math
import struct

import torch
import torch.nn.functional as F

CKPT_MAGIC, DUMP_MAGIC = 20240326, 20240327
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def param_shapes(cfg):
    L, C, Vp, T = cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]
    return {"wte": (Vp, C), "wpe": (T, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C),
            "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C),
            "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
            "lnfw": (C,), "lnfb": (C,)}


def write_checkpoint(path, cfg, params, dtype="fp32"):
    """params: name -> float tensor of param_shapes(cfg)[name]."""
    header = torch.zeros(256, dtype=torch.int32)
    header[:8] = torch.tensor([CKPT_MAGIC, 5 if dtype == "bf16" else 3, cfg["maxT"], cfg["V"], cfg["L"],
                               cfg["NH"], cfg["C"], cfg["Vp"]], dtype=torch.int32)
    with open(path, "wb") as f:
        f.write(header.numpy().tobytes())
        for name, shape in param_shapes(cfg).items():
            t = params[name].detach().float().contiguous()
            assert tuple(t.shape) == shape, (name, tuple(t.shape), shape)
            if dtype == "bf16":
                f.write(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
            else:
                f.write(t.numpy().tobytes())


def read_checkpoint(path):
    """Returns (cfg, params as fp32 tensors, dtype name)."""
    with open(path, "rb") as f:
        data = f.read()
    h = struct.unpack("<256i", data[:1024])
    if h[0] != CKPT_MAGIC or h[1] not in (3, 5):
        raise SystemExit(f"{path}: not an llm.c GPT-2 checkpoint (magic {h[0]}, version {h[1]})")
    cfg = dict(maxT=h[2], V=h[3], L=h[4], NH=h[5], C=h[6], Vp=h[7])
    bf16 = h[1] == 5
    params, offset = {}, 1024
    for name, shape in param_shapes(cfg).items():
        n = math.prod(shape)
        nbytes = n * (2 if bf16 else 4)
        raw = bytearray(data[offset:offset + nbytes])
        if bf16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).float()
        else:
            t = torch.frombuffer(raw, dtype=torch.float32).clone()
        params[name] = t.reshape(shape)
        offset += nbytes
    if offset != len(data):
        raise SystemExit(f"{path}: {len(data)} bytes, header implies {offset}")
    return cfg, params, "bf16" if bf16 else "fp32"


def write_dump(path, x, y, logits, loss):
    B, T = x.shape
    header = torch.zeros(256, dtype=torch.int32)
    header[:4] = torch.tensor([DUMP_MAGIC, 2, B, T], dtype=torch.int32)
    with open(path, "wb") as f:
        f.write(header.numpy().tobytes())
        f.write(x.to(torch.int32).contiguous().numpy().tobytes())
        f.write(y.to(torch.int32).contiguous().numpy().tobytes())
        f.write(logits.detach().float().contiguous().numpy().tobytes())
        f.write(struct.pack("<f", float(loss)))


def forward(cfg, p, idx):
    """GPT-2 forward (Hugging Face semantics) on token ids idx [B, T]: logits [B, T, V] in fp32.
    Attention is written out (Debian's torch 1.13 has no scaled_dot_product_attention)."""
    L, C, NH, V = cfg["L"], cfg["C"], cfg["NH"], cfg["V"]
    B, T = idx.shape
    HS = C // NH
    x = p["wte"][idx] + p["wpe"][torch.arange(T)]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        a = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + a @ p["attprojw"][l].T + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    return x @ p["wte"][:V].T


def to_hf(cfg, p):
    """A transformers.GPT2LMHeadModel holding these weights (Conv1D weights are [in, out])."""
    from transformers import GPT2Config, GPT2LMHeadModel
    hc = GPT2Config(vocab_size=cfg["V"], n_positions=cfg["maxT"], n_embd=cfg["C"], n_layer=cfg["L"],
                    n_head=cfg["NH"], activation_function="gelu_new", layer_norm_epsilon=1e-5,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(hc).eval()
    sd = {"transformer.wte.weight": p["wte"][:cfg["V"]], "transformer.wpe.weight": p["wpe"],
          "transformer.ln_f.weight": p["lnfw"], "transformer.ln_f.bias": p["lnfb"]}
    for l in range(cfg["L"]):
        pre = f"transformer.h.{l}."
        sd.update({pre + "ln_1.weight": p["ln1w"][l], pre + "ln_1.bias": p["ln1b"][l],
                   pre + "attn.c_attn.weight": p["qkvw"][l].T, pre + "attn.c_attn.bias": p["qkvb"][l],
                   pre + "attn.c_proj.weight": p["attprojw"][l].T, pre + "attn.c_proj.bias": p["attprojb"][l],
                   pre + "ln_2.weight": p["ln2w"][l], pre + "ln_2.bias": p["ln2b"][l],
                   pre + "mlp.c_fc.weight": p["fcw"][l].T, pre + "mlp.c_fc.bias": p["fcb"][l],
                   pre + "mlp.c_proj.weight": p["fcprojw"][l].T, pre + "mlp.c_proj.bias": p["fcprojb"][l]})
    with torch.no_grad():
        for name, tensor in model.named_parameters():  # lm_head.weight is tied to wte: not listed
            tensor.copy_(sd[name].contiguous())
    return model
