#!/usr/bin/env bash
# ./gpt2 -p on the CPU path: streaming output, determinism, batching, and the errors a user meets.
source "$(dirname "$0")/lib.sh"
PY=$(torch_python) || { skip e2e_generate "no Python with PyTorch (apt-get install python3-torch)"; exit 0; }
dir="$GPT2_TMP/e2e_generate"
mkdir -p "$dir"
m="$dir/tiny.bin"
$PY scripts/make_model.py --out "$m" --layers 2 --channels 64 --heads 4 --max-seq 48 --std 0.3 --seed 11 2>/dev/null ||
    { fail generate_model "make_model.py failed"; exit 0; }
g() { "$GPT2_BIN" -m "$m" --cpu "$@"; }

out=$(g -p "Hello world" -n 8 --temp 0 2>/dev/null)
case "$out" in "Hello world"?*) pass generate_streams_prompt_then_text ;;
    *) fail generate_streams_prompt_then_text "stdout was '$out'" ;; esac
ids=$(g -p "Hello world" -n 8 --temp 0 --ids 2>/dev/null)
[ "$(echo "$ids" | cut -d' ' -f1-2)" = "15496 995" ] && [ "$(echo "$ids" | wc -w)" -eq 10 ]; check generate_ids_prompt_then_8_new $? "got '$ids'"
[ "$(g -p "Hello world" -n 8 --temp 0 --ids 2>/dev/null)" = "$ids" ]; check generate_greedy_deterministic $? "two greedy runs differ"
# The decode loop (engine_decode_steps) against PyTorch: greedy, a full forward per new token.
want=$($PY scripts/check_hf_generate.py --builtin -m "$m" --tokens "15496 995" -n 16 2>"$dir/torch.err")
got=$(g -p "Hello world" -n 16 --temp 0 --ignore-eos --ids 2>/dev/null | xargs)
[ -n "$want" ] && [ "$got" = "$want" ]; check generate_greedy_equals_pytorch $? "ours: $got | PyTorch: $want $(head -c 300 "$dir/torch.err")"
a=$(g -p "The" -n 12 -s 42 --ids 2>/dev/null); b=$(g -p "The" -n 12 -s 42 --ids 2>/dev/null); c=$(g -p "The" -n 12 -s 43 --ids 2>/dev/null)
[ "$a" = "$b" ] && [ "$a" != "$c" ]; check generate_seed_reproducible $? "seed 42: '$a' / '$b'; seed 43: '$c'"
[ "$(g -p "" -n 5 --temp 0 --ids 2>/dev/null | wc -w)" -eq 5 ]; check generate_unconditional $? "empty prompt should give 5 new ids"
n=$(g -p "Hi" -n 100 --temp 0 --ignore-eos --ids 2>"$dir/clip.err" | wc -w)
[ "$n" -eq 48 ] && grep -q "context length of 48" "$dir/clip.err"; check generate_stops_at_context $? "got $n ids; stderr: $(cat "$dir/clip.err")"
batch=$(g -p "Hello" -n 6 --temp 0 -b 3 --ids 2>/dev/null)
[ "$(echo "$batch" | wc -l)" -eq 3 ] && [ "$(echo "$batch" | sort -u | wc -l)" -eq 1 ] &&
    [ "$(echo "$batch" | head -n 1)" = "$(g -p "Hello" -n 6 --temp 0 --ids 2>/dev/null)" ]
check generate_batch_of_three_greedy $? "got: $batch"
summary=$(g -p "Hello" -n 4 2>&1 >/dev/null)
echo "$summary" | grep -q "prefill" && echo "$summary" | grep -q "tokens/s"; check generate_summary_on_stderr $? "$summary"
echo "Hello from stdin" | g -p - -n 2 --temp 0 2>/dev/null | grep -q "^Hello from stdin"; check generate_prompt_from_stdin $? "stdin prompt not echoed"

long=$(printf 'word %.0s' $(seq 60))
expect_error generate_prompt_too_long "context is 48" g -p "$long"
expect_error generate_bad_flag_value "-n: 'abc' is not an integer" g -n abc
expect_error generate_bad_top_p "--top-p" g --top-p 1.5
expect_error generate_unknown_flag "unknown argument '--frobnicate'" g --frobnicate
expect_error generate_missing_model "make download" "$GPT2_BIN" -m "$dir/nope.bin" -p hi
expect_error generate_bad_dtype "--dtype: 'fp64'" g --dtype fp64

# A model vocabulary past the tokenizer's (nanoGPT pads to 50304): one warning at the start, and ids
# without text print as U+FFFD instead of ending the run. ln_f's output is made all ones and so is
# id 50299's row, so greedy picks 50299 at every step.
v="$dir/vocab50300.bin"
$PY scripts/make_model.py --out "$v" --layers 1 --channels 64 --heads 4 --vocab 50300 --max-seq 16 --seed 3 \
    2>/dev/null && $PY - "$v" <<'EOF'
import array, sys
C, raw = 64, open(sys.argv[1], "rb").read()
w = array.array("f"); w.frombytes(raw[1024:])
n = len(w)
for i in range(C):
    w[n - 2 * C + i], w[n - C + i] = 0.0, 1.0  # ln_f: weight 0, bias 1
    w[50299 * C + i] = 1.0
open(sys.argv[1], "wb").write(raw[:1024] + w.tobytes())
EOF
check generate_vocab_model $? "make_model.py or the edit failed"
ids=$("$GPT2_BIN" -m "$v" --cpu -p Hi -n 3 --temp 0 --ids 2>/dev/null | xargs)
[ "$ids" = "17250 50299 50299 50299" ]; check generate_vocab_past_tokenizer_ids $? "got '$ids'"
text=$("$GPT2_BIN" -m "$v" --cpu -p Hi -n 3 --temp 0 2>"$dir/vocab.err"); rc=$?
[ $rc -eq 0 ] && [ "$text" = "Hi"$'\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd' ] &&
    grep -q "larger than the tokenizer's (50257)" "$dir/vocab.err"
check generate_vocab_past_tokenizer_text $? "exit $rc, stdout '$text', stderr: $(cat "$dir/vocab.err")"

# Without a GPU the default runs on the CPU with a one-line note; --gpu makes that an error.
if ! have_gpu; then
    note=$("$GPT2_BIN" -m "$m" -p "Hi" -n 2 --temp 0 2>&1 >/dev/null)
    echo "$note" | grep -q "no usable GPU (.*); running on the CPU"; check generate_cpu_fallback_note $? "$note"
    expect_error generate_gpu_flag_without_gpu "no usable GPU" "$GPT2_BIN" -m "$m" -p "Hi" --gpu
    expect_error generate_reference_without_gpu "no usable GPU" "$GPT2_BIN" -m "$m" -p "Hi" --reference
fi
exit 0
