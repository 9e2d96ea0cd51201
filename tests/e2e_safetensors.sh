#!/usr/bin/env bash
# Hugging Face safetensors end to end: one random GPT-2 written as llm.c's .bin and exported by
# scripts/export_safetensors.py must give ./gpt2 validate the very same figures (F32, BF16, the
# "transformer." prefix, no config.json, the safetensors package's writer); F16 within its rounding;
# a damaged file one clear error line; then a bounded libFuzzer run over the header parser.
cd "$(dirname "$0")/.."
source tests/lib.sh
dir="$GPT2_TMP/e2e_safetensors"
rm -rf "$dir" && mkdir -p "$dir"

# same_figures NAME MODEL_A MODEL_B DUMP: both PASS with identical output. fp32 compute on any
# path: the loading is on trial here, not bf16 arithmetic (tests/e2e_gpu.sh has that).
same_figures() {
    local name=$1 a=$2 b=$3 dump=$4
    local out_a out_b
    out_a=$("$GPT2_BIN" validate -m "$a" "$dump" --dtype fp32 2>"$dir/$name.err"); local rc_a=$?
    out_b=$("$GPT2_BIN" validate -m "$b" "$dump" --dtype fp32 2>>"$dir/$name.err"); local rc_b=$?
    if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then
        fail "$name" "validate exited $rc_a ($a) and $rc_b ($b): $(tail -n 3 "$dir/$name.err") $out_b"
    elif [ "$out_a" != "$out_b" ]; then
        fail "$name" "figures differ: [$(echo $out_a)] vs [$(echo $out_b)]"
    else
        pass "$name"
    fi
}

py=$(torch_python) || py=""
if [ -z "$py" ]; then
    skip e2e_safetensors_models "no Python with PyTorch (scripts/make_model.py and dump_logits.py need it)"
else
    model() {  # out.bin extra make_model options...
        local out=$1; shift
        "$py" scripts/make_model.py --out "$out" --max-seq 64 --vocab 300 --seed 1 --std 0.1 --ln-std 0.1 "$@" 2>/dev/null
    }
    export_st() { "$py" scripts/export_safetensors.py "$@" 2>>"$dir/export.log"; }
    model "$dir/f32.bin" --layers 2 --channels 64 --heads 4 &&
        model "$dir/bf16.bin" --layers 2 --channels 64 --heads 4 --dtype bf16 &&
        model "$dir/c128.bin" --layers 3 --channels 128 --heads 2 &&
        "$py" scripts/dump_logits.py -m "$dir/f32.bin" --out "$dir/f32.dump" -B 2 -T 24 --seed 3 2>/dev/null &&
        "$py" scripts/dump_logits.py -m "$dir/bf16.bin" --out "$dir/bf16.dump" -B 2 -T 24 --seed 3 2>/dev/null &&
        "$py" scripts/dump_logits.py -m "$dir/c128.bin" --out "$dir/c128.dump" -B 2 -T 24 --seed 3 2>/dev/null
    check e2e_safetensors_setup $? "make_model.py or dump_logits.py failed"

    export_st "$dir/f32.bin" "$dir/f32_hf" --writer hand
    same_figures e2e_safetensors_f32_identical "$dir/f32.bin" "$dir/f32_hf" "$dir/f32.dump"
    export_st "$dir/bf16.bin" "$dir/bf16_hf" --writer hand
    same_figures e2e_safetensors_bf16_identical "$dir/bf16.bin" "$dir/bf16_hf" "$dir/bf16.dump"
    # GPT2LMHeadModel's names, and a file path with config.json beside it.
    export_st "$dir/f32.bin" "$dir/prefixed/X.safetensors" --prefix transformer. --writer hand
    same_figures e2e_safetensors_prefix_file_identical "$dir/f32.bin" "$dir/prefixed/X.safetensors" "$dir/f32.dump"
    # No config.json: the shapes give the sizes, head size 64 the heads (C=128 -> NH=2).
    export_st "$dir/c128.bin" "$dir/c128_hf" --no-config --writer hand
    same_figures e2e_safetensors_no_config_identical "$dir/c128.bin" "$dir/c128_hf" "$dir/c128.dump"
    # F16 rounds the weights (2^-11 relative), so the logits move by about that much: a looser bound.
    export_st "$dir/f32.bin" "$dir/f16_hf" --dtype f16 --writer hand
    out=$("$GPT2_BIN" validate -m "$dir/f16_hf" "$dir/f32.dump" --dtype fp32 --tol 1e-2 2>&1)
    check e2e_safetensors_f16_within_rounding $? "$(echo $out)"

    if "$py" -c 'import safetensors.torch' 2>/dev/null; then
        export_st "$dir/bf16.bin" "$dir/bf16_pkg" --writer safetensors
        same_figures e2e_safetensors_package_writer_identical "$dir/bf16.bin" "$dir/bf16_pkg" "$dir/bf16.dump"
    else
        skip e2e_safetensors_package_writer_identical "the safetensors Python package is not installed here"
    fi

    # A download cut short inside the header.
    head -c 1000 "$dir/f32_hf/model.safetensors" >"$dir/cut.safetensors"
    expect_error e2e_safetensors_truncated_error "cut.safetensors: header length" \
        "$GPT2_BIN" validate -m "$dir/cut.safetensors" "$dir/f32.dump"
    mkdir -p "$dir/empty"
    expect_error e2e_safetensors_empty_dir_error "holds no model.safetensors and no .bin" \
        "$GPT2_BIN" validate -m "$dir/empty" "$dir/f32.dump"
fi

# --- libFuzzer over the header parser and the GPT-2 conversion

if [ "$GPT2_SANITIZE" = 1 ]; then
    skip e2e_safetensors_fuzz "the fuzz target is sanitized already and runs in the plain 'make test'"
elif ! command -v clang >/dev/null 2>&1; then
    skip e2e_safetensors_fuzz "clang is not installed (libFuzzer needs it)"
elif ! printf '#include <cjson/cJSON.h>\nint LLVMFuzzerTestOneInput(const char *d, long n) { return d && n < 0; }\n' \
        >"$dir/probe.c" || ! clang -fsanitize=fuzzer "$dir/probe.c" -o "$dir/probe" -lcjson >"$dir/probe.log" 2>&1; then
    # A machine without libFuzzer's runtime or without cJSON's development files (the GPU machine).
    skip e2e_safetensors_fuzz "clang cannot build a libFuzzer target with cJSON here: $(grep -m1 error "$dir/probe.log")"
elif ! make -s build/fuzz/fuzz_safetensors >"$dir/fuzz_build.log" 2>&1; then
    fail e2e_safetensors_fuzz "build/fuzz/fuzz_safetensors does not build: $(grep -m1 -i error "$dir/fuzz_build.log")"
else
    mkdir -p "$dir/corpus"
    # Seeds: a small valid container, and GPT-2 names in the three float types.
    /usr/bin/env python3 - "$dir/corpus" <<'EOF'
import json, struct, sys
def write(name, header, data):
    text = json.dumps(header).encode()
    open(f"{sys.argv[1]}/{name}", "wb").write(struct.pack("<Q", len(text)) + text + data)
write("container", {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "I64", "shape": [1, 1], "data_offsets": [8, 16]}}, bytes(16))
tensors, at = {}, 0
for name, dtype, size, shape in [("wte.weight", "F16", 2, [1, 64]), ("transformer.wpe.weight", "BF16", 2, [1, 64]),
                                  ("h.0.ln_1.weight", "F32", 4, [64])]:
    tensors[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + 64 * size]}
    at += 64 * size
write("gpt2_names", tensors, bytes(at))
EOF
    printf '"dtype"\n"shape"\n"data_offsets"\n"__metadata__"\n"F32"\n"F16"\n"BF16"\n"wte.weight"\n"wpe.weight"\n"h.0.attn.c_attn.weight"\n"transformer."\n"lm_head.weight"\n' >"$dir/fuzz.dict"
    build/fuzz/fuzz_safetensors -max_total_time=15 -timeout=10 -rss_limit_mb=2048 -dict="$dir/fuzz.dict" \
        -artifact_prefix="$dir/" "$dir/corpus" >"$dir/fuzz.log" 2>&1
    rc=$?
    runs=$(grep -o 'Done [0-9]* runs' "$dir/fuzz.log" | tail -n 1)
    check e2e_safetensors_fuzz $rc "libFuzzer exited $rc: $(grep -m1 -E 'ERROR|SUMMARY|crash' "$dir/fuzz.log") (log: $dir/fuzz.log)"
    [ -n "$runs" ] && echo "# fuzz_safetensors: $runs in 15 s" >&2
fi
exit 0
