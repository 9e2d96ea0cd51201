#!/usr/bin/env bash
# End to end on the CPU path: random models of awkward shapes, written by scripts/make_model.py,
# run by PyTorch (scripts/dump_logits.py) and by ./gpt2 validate --cpu, which must PASS.
source "$(dirname "$0")/lib.sh"
PY=$(torch_python) || { skip e2e_validate "no Python with PyTorch (apt-get install python3-torch)"; exit 0; }
dir="$GPT2_TMP/e2e_validate"
mkdir -p "$dir"

# name | make_model.py arguments | dump_logits.py arguments
cases=(
  "odd_shape_fp32|--layers 2 --channels 96 --heads 3 --vocab 301 --max-seq 64 --std 0.1 --ln-std 0.2 --seed 1|-B 2 -T 64"
  "one_layer_one_token_bf16|--layers 1 --channels 40 --heads 5 --vocab 257 --max-seq 8 --std 0.3 --ln-std 0.3 --dtype bf16 --seed 2|-B 3 -T 1"
  "full_context_bf16|--layers 1 --channels 40 --heads 5 --vocab 257 --max-seq 8 --std 0.3 --ln-std 0.3 --dtype bf16 --seed 3|-B 2 -T 8"
  "wide_spread_fp32|--layers 3 --channels 72 --heads 6 --vocab 500 --max-seq 32 --std 0.5 --ln-std 0.5 --seed 4|-B 1 -T 20"
  "gpt2_124M_shape_fp32|--seed 5|-B 1 -T 16"
)
for c in "${cases[@]}"; do
    IFS='|' read -r name make dump <<<"$c"
    ckpt="$dir/$name.bin" ref="$dir/$name.dump"
    if ! $PY scripts/make_model.py --out "$ckpt" $make 2>"$dir/$name.log" ||
       ! $PY scripts/dump_logits.py -m "$ckpt" --out "$ref" $dump --seed 7 2>>"$dir/$name.log"; then
        fail "validate_$name" "reference generation failed: $(tail -n 3 "$dir/$name.log")"
        continue
    fi
    out=$("$GPT2_BIN" validate --cpu -m "$ckpt" "$ref" 2>&1)
    check "validate_$name" $? "$(echo "$out" | tr '\n' ' ')"
    [ "$name" = gpt2_124M_shape_fp32 ] && rm -f "$ckpt"  # 500 MB: keep the test directory small
done

# A dump from a different model must FAIL (exit 1), not pass by accident.
"$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/wide_spread_fp32.dump" >/dev/null 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ]; check validate_detects_mismatch $? "exit $rc on a dump of another model"
"$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/odd_shape_fp32.dump" --tol 1e-12 >/dev/null 2>&1
[ $? -eq 1 ]; check validate_tolerance_is_applied $? "--tol 1e-12 should FAIL with exit 1"

# Malformed dumps: one clear line each.
printf 'garbage' >"$dir/short.dump"
expect_error dump_truncated_header "truncated" "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/short.dump"
head -c 2000 "$dir/odd_shape_fp32.dump" >"$dir/cut.dump"
expect_error dump_truncated_logits "truncated" "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/cut.dump"
# A header whose B and T would need 52 GB of logits: the file's size is checked before any allocation.
$PY -c 'import struct, sys; h = bytearray(open(sys.argv[1], "rb").read(1024)); h[8:16] = struct.pack("<ii", 4096, 64)
open(sys.argv[2], "wb").write(bytes(h))' "$dir/odd_shape_fp32.dump" "$dir/huge.dump"
expect_error dump_absurd_header_sizes "truncated: B=4096 T=64" \
    "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/huge.dump"
mkdir -p "$dir/dump_dir"
expect_error dump_is_directory "not a regular file" \
    "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/dump_dir"
rm -f "$dir/fifo.dump" && mkfifo "$dir/fifo.dump"  # no writer: refused, not waited on
expect_error dump_is_fifo "not a regular file" \
    timeout 20 "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/fifo.dump"
expect_error dump_bad_magic "bad magic" "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.bin" "$dir/odd_shape_fp32.bin"
expect_error model_bad_magic "bad magic" "$GPT2_BIN" validate --cpu -m "$dir/odd_shape_fp32.dump" "$dir/odd_shape_fp32.dump"
exit 0
