#!/usr/bin/env bash
# ./gpt2 bench: the CPU path end to end (table on stdout, JSON with the schema of issue 6, a checkpoint
# given with -m), the errors a user meets, and on a GPU build with a GPU the fused/reference bench
# and --kernels at quick settings (skipped otherwise).
source "$(dirname "$0")/lib.sh"
dir="$GPT2_TMP/e2e_bench"
mkdir -p "$dir"
PYJ=$(command -v python3 || command -v /usr/bin/python3)
small=(--quick --no-forward --prompts 16,64 --batches 1,2 --new 4)

# JSON check: the schema's keys and types, and what the run should hold (phases, paths).
check_json() {  # file want_paths want_phases
    "$PYJ" - "$@" <<'PY'
import json, sys
f, paths, phases = sys.argv[1], set(sys.argv[2].split(",")), set(sys.argv[3].split(","))
d = json.load(open(f))
for k in ("device", "commit", "model", "results"):
    assert k in d, f"missing {k}"
for k in ("L", "C", "NH", "V", "maxT", "dtype"):
    assert k in d["model"], f"missing model.{k}"
assert d["results"], "no results"
for r in d["results"]:
    for k in ("path", "dtype", "phase", "batch", "prompt_len", "new_tokens", "tok_s", "ms", "roofline_pct"):
        assert k in r, f"result lacks {k}: {r}"
    assert r["path"] in ("fused", "reference", "cpu") and r["dtype"] in ("fp32", "bf16"), r
    assert r["phase"] in ("prefill", "forward", "decode"), r
    assert r["tok_s"] > 0 and r["ms"] > 0, r
    assert r["roofline_pct"] is None or r["roofline_pct"] > 0, r
got_paths = {r["path"] for r in d["results"]}
got_phases = {r["phase"] for r in d["results"]}
assert got_paths == paths, f"paths {got_paths}, want {paths}"
assert got_phases == phases, f"phases {got_phases}, want {phases}"
dec = [r for r in d["results"] if r["phase"] == "decode"]
assert all(r["prompt_len"] == 16 for r in dec), dec
PY
}

out=$("$GPT2_BIN" bench --cpu --size tiny "${small[@]}" --json "$dir/cpu.json" 2>"$dir/cpu.err"); rc=$?
check bench_cpu_runs $rc "exit $rc: $(tail -n 3 "$dir/cpu.err")"
echo "$out" | grep -q "^path .*tok/s" && [ "$(echo "$out" | grep -c '^cpu  *fp32 ')" -eq 4 ]
check bench_cpu_table $? "stdout: $out"
echo "$out" | grep -q "^check cpu .*: ok$"; check bench_cpu_checked_before_timing $? "no check line: $out"
grep -q "^bench \[1/1\] cpu fp32" "$dir/cpu.err"; check bench_progress_on_stderr $? "stderr: $(head -c 300 "$dir/cpu.err")"
check_json "$dir/cpu.json" cpu prefill,decode 2>"$dir/json.err"; check bench_cpu_json_schema $? "$(cat "$dir/json.err")"

out=$("$GPT2_BIN" bench --cpu --size tiny --quick --prompts 16 --batches 1 --new 2 --no-forward --json "$dir/fwd.json" \
      --no-profile --commit abc123 2>/dev/null)
"$PYJ" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["commit"] == "abc123", d["commit"]' "$dir/fwd.json"
check bench_commit_flag $? "commit not abc123"

# A checkpoint through -m (PyTorch writes it; skipped without it).
if PY=$(torch_python); then
    m="$dir/tiny.bin"
    if $PY scripts/make_model.py --out "$m" --layers 2 --channels 64 --heads 4 --max-seq 128 --seed 3 2>/dev/null; then
        out=$("$GPT2_BIN" bench --cpu -m "$m" "${small[@]}" --json "$dir/m.json" 2>"$dir/m.err"); rc=$?
        check bench_cpu_checkpoint $rc "exit $rc: $(tail -n 3 "$dir/m.err")"
        "$PYJ" -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d["model"]; assert (m["L"], m["C"], m["maxT"]) == (2, 64, 128), m' \
            "$dir/m.json"
        check bench_checkpoint_model_in_json $? "model: $(grep -o '"model": {[^}]*}' "$dir/m.json")"
    else
        fail bench_cpu_checkpoint "make_model.py failed"
    fi
else
    skip bench_cpu_checkpoint "no Python with PyTorch to write a checkpoint"
fi

# Generation's sampler instead of greedy picks: the settings say so in the JSON and the footer.
out=$("$GPT2_BIN" bench --cpu --size tiny --quick --prompts 16 --batches 2 --new 3 --no-forward --temp 0.8 --top-k 40 \
      --top-p 0.9 --json "$dir/smp.json" 2>"$dir/smp.err"); rc=$?
check bench_sampled_runs $rc "exit $rc: $(tail -n 3 "$dir/smp.err")"
echo "$out" | grep -q "3 sampled (--temp 0.8 --top-k 40 --top-p 0.9) tokens" &&
    "$PYJ" -c 'import json,sys; s=json.load(open(sys.argv[1]))["settings"]["sampling"]; assert s == {"temperature": 0.8, "top_k": 40, "top_p": 0.9}, s' \
        "$dir/smp.json"
check bench_sampled_settings $? "stdout: $(echo "$out" | tail -n 4); $(grep -o '"sampling": {[^}]*}' "$dir/smp.json")"

# Decode at a depth: the timed steps follow a prompt of that length, as the table and the JSON say.
out=$("$GPT2_BIN" bench --cpu --size tiny --quick --prompts 16 --batches 1 --new 2 --no-forward --depth 40 \
      --json "$dir/depth.json" 2>"$dir/depth.err"); rc=$?
check bench_depth_runs $rc "exit $rc: $(tail -n 3 "$dir/depth.err")"
echo "$out" | grep -Eq "^cpu +fp32 decode +1 +40 +2 " && echo "$out" | grep -q "after a 40-token prompt" &&
    "$PYJ" -c 'import json,sys; r=[r for r in json.load(open(sys.argv[1]))["results"] if r["phase"]=="decode"]; assert [x["prompt_len"] for x in r] == [40], r' \
        "$dir/depth.json"
check bench_depth_in_table_and_json $? "stdout: $(echo "$out" | grep decode)"
expect_error bench_depth_past_context "--depth 1024: the model's context is 1024 positions, so at most 1023" \
    "$GPT2_BIN" bench --cpu --size tiny --depth 1024
expect_error bench_bad_size "--size: '7B'" "$GPT2_BIN" bench --cpu --size 7B
expect_error bench_bad_top_p "--top-p: '2' is not a number in 0..1" "$GPT2_BIN" bench --cpu --top-p 2
expect_error bench_bad_batches "--batches: 'x' is not an integer" "$GPT2_BIN" bench --cpu --batches 1,x
expect_error bench_bad_path "--path: 'gpu'" "$GPT2_BIN" bench --path gpu
expect_error bench_missing_model "nope.bin: model not found" "$GPT2_BIN" bench --cpu -m "$dir/nope.bin"
expect_error bench_kernels_needs_gpu_path "--kernels times GPU kernels" "$GPT2_BIN" bench --cpu --kernels

if ! have_gpu; then
    expect_error bench_without_gpu "bench needs a GPU" "$GPT2_BIN" bench --size tiny
    skip bench_gpu "no GPU (build $GPT2_BUILD)"
    exit 0
fi

out=$("$GPT2_BIN" bench --size tiny "${small[@]}" --json "$dir/gpu.json" 2>"$dir/gpu.err"); rc=$?
check bench_gpu_runs $rc "exit $rc: $(tail -n 5 "$dir/gpu.err")"
paths=reference
grep -q "^check fused" <<<"$out" && paths=fused,reference
check_json "$dir/gpu.json" "$paths" prefill,decode 2>"$dir/json.err"; check bench_gpu_json_schema $? "$(cat "$dir/json.err")"
"$PYJ" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert all(r["roofline_pct"] for r in d["results"] if r["phase"]=="decode"); assert d["breakdown"]' \
    "$dir/gpu.json"; check bench_gpu_roofline_and_breakdown $? "no roofline or breakdown"
if grep -q "^check fused" <<<"$out"; then
    out=$("$GPT2_BIN" bench --kernels --quick 2>"$dir/k.err"); rc=$?
    check bench_kernels_validated $rc "exit $rc: $(echo "$out" | grep FAILED) $(tail -n 3 "$dir/k.err")"
else
    skip bench_kernels "no fused path in this build"
fi
exit 0
