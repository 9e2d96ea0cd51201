#!/usr/bin/env bash
# Safetensors written by transformers' save_pretrained (fp32, bf16, fp16, with and without the
# "transformer." prefix) load in C and reproduce transformers' logits: scripts/check_hf_safetensors.py.
# Needs transformers, so it runs where that is installed (the GPU machine) and skips elsewhere.
cd "$(dirname "$0")/.."
source tests/lib.sh
PY=$(torch_python) || { skip e2e_hf_safetensors "no Python with PyTorch"; exit 0; }
$PY -c 'import transformers, safetensors' 2>/dev/null ||
    { skip e2e_hf_safetensors "no transformers (with safetensors) for $PY"; exit 0; }
$PY scripts/check_hf_safetensors.py --bin "$GPT2_BIN" --out "$GPT2_TMP/e2e_hf_safetensors"
