#!/usr/bin/env bash
# One call on a lent GPU machine: build for sm_90a, run the whole test suite there (GPU tests
# included), compute-sanitizer (memcheck, racecheck) over the GPU unit tests, a fused-vs-reference
# `compare`, and decode/prefill timings. Logs go to $OUT (or build/gpu/check).
#   bash scripts/gpu_check.sh [build] [units] [maketest] [sanitize|memcheck|racecheck] [compare] [time] [bench] [crossover] [ttft] [ncu] [ncu_forward] [trace] [ktrace]
# (default: all but units, which runs only the GPU unit tests, a subset of maketest; ttft, which
# times prompts on both sides of each change of route; ncu, which times each kernel of a batch-1
# decode step alone, warm caches and free clocks; and trace, which builds `make TRACE=1` and times
# the kernels inside the replayed batch-1 decode graph: docs/PERF.md, "Engine decode, session 2"; and
# ktrace, which times every node of the 1024-token prompt's and the 8 x 1024 forward's graphs,
# cuBLASLt's kernels and memsets included, through CUPTI (scripts/ktrace.c).
# `compare`, `time`, `ttft`, `ncu`, `trace` and `ktrace` use the 124M-shape model that tests/e2e_gpu.sh
# writes, or a random one when it is absent)
set -u
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu/check}
mkdir -p "$out"
steps=${*:-build maketest sanitize compare time}
mk=(CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
if [ -d .devkit ]; then  # scripts/devkit.sh: headers and libraries the machine lacks
    mk+=(EXTRA_CFLAGS=-I$PWD/.devkit/include EXTRA_LDFLAGS=-L$PWD/.devkit/lib)
    export LD_LIBRARY_PATH=$PWD/.devkit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export GPT2_BIN=$PWD/gpt2 GPT2_BUILD=build/gpu PYTHONUNBUFFERED=1
m=build/gpu/testdata/e2e_gpu/gpt2_124M_shape_bf16.bin
unit_tests=${UNIT_TESTS:-test_sampling test_fused_attention test_fused_linear test_matmul_lt test_gpu_engine}
for s in $steps; do
    t0=$(date +%s)
    case $s in
    build)
        nvidia-smi -L
        make -j16 "${mk[@]}" all $(for t in tests/test_*.c tests/bench_*.c; do echo build/gpu/tests/$(basename $t .c); done) \
            >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
        grep -i "warning" "$out/build.log" | head -n 20 ;;
    units)
        for t in $unit_tests; do
            build/gpu/tests/$t >"$out/unit_$t.log" 2>&1
            echo "$t: exit $? | $(grep -c '^PASS' "$out/unit_$t.log") PASS, $(grep -c '^FAIL' "$out/unit_$t.log") FAIL"
            grep -E "^FAIL" "$out/unit_$t.log" | head -n 5
        done ;;
    maketest)
        make "${mk[@]}" test >"$out/make_test.log" 2>&1
        grep -E "^(FAIL|SKIP)|^  .*(rel_l2|argmax|greedy)|passed," "$out/make_test.log" ;;
    memcheck|racecheck|sanitize)
        tools=$s; [ $s = sanitize ] && tools="memcheck racecheck"
        for tool in $tools; do
            for t in $unit_tests; do
                GPT2_NO_OOM_TEST=1 GPT2_QUICK=1 GPT2_TEST_SMALL=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                    build/gpu/tests/$t >"$out/${tool}_$t.log" 2>&1
                echo "$tool $t: exit $? | $(grep -c '^PASS' "$out/${tool}_$t.log") PASS," \
                    "$(grep -c '^FAIL' "$out/${tool}_$t.log") FAIL |" \
                    "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/${tool}_$t.log" | tail -n 1)"
            done
        done ;;
    compare|time|ttft|ncu|trace|ncu_forward|ktrace)
        if [ ! -f "$m" ]; then
            mkdir -p "$(dirname "$m")"
            python3 scripts/make_model.py --out "$m" --seed 5 --dtype bf16 >/dev/null
        fi ;;&
    compare)
        for dt in fp32 bf16; do ./gpt2 compare -m "$m" --dtype $dt -B 2 -T 128 2>&1 | tee -a "$out/compare.log"; done ;;
    time)
        for path in --gpu --reference; do
            for b in 1 8 64; do
                for sampling in "--temp 0" "--top-k 40"; do  # greedy vs top-k: what sampling costs
                    ./gpt2 -m "$m" $path -b $b -n 256 --ignore-eos $sampling -p "Hello world" 2>&1 >/dev/null |
                        grep -E "^(decode:|gpt2:)" | sed "s/^/${path#--} bf16 b=$b $sampling: /"
                done
            done
        done 2>&1 | tee "$out/time.log"
        for b in 1 8; do  # what programmatic dependent launch is worth (kernels/pdl.cuh)
            GPT2_PDL=0 ./gpt2 -m "$m" --gpu -b $b -n 256 --ignore-eos --temp 0 -p "Hello world" 2>&1 >/dev/null |
                grep -E "^(decode:|gpt2:)" | sed "s/^/gpu GPT2_PDL=0 bf16 b=$b --temp 0: /"
        done 2>&1 | tee -a "$out/time.log" ;;
    ncu)  # the graph's nodes one by one; ncu adds ~2.5 us to each (the 1-block embedding reads ~3)
        ncu --cache-control none --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
            --csv --print-units base --launch-skip 200 --launch-count 130 ./gpt2 -m "$m" --gpu -n 8 --ignore-eos \
            --temp 0 -p "Hello world" >"$out/ncu.csv" 2>"$out/ncu.err"
        python3 - "$out/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
k, v = rows[0].index("Kernel Name"), rows[0].index("Metric Value")
seq = [(r[k].split("(")[0][:60], float(r[v].replace(",", "")) / 1e3) for r in rows[1:]]
first = next(i for i, (name, _) in enumerate(seq) if "embedding" in name)
nxt = next(i for i, (name, _) in enumerate(seq) if "embedding" in name and i > first)
step = seq[first:nxt]
for name, us in step[:7] + [("...", 0)] + step[-3:]:
    print(f"{us:8.2f} us  {name}")
print(f"{len(step)} kernels, {sum(us for _, us in step):.1f} us summed (each alone)")
PY
        ;;
    ncu_forward)  # every kernel of a bench run with one 1x1024 prefill and the 8x1024 forward, bf16 fused;
        # scripts/ncu_summary.py groups them by kernel per phase
        ncu --cache-control none --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
            --csv --print-units base \
            ./gpt2 bench --quick --path fused --dtype bf16 --batches 64 --prompts 1024 --new 2 --runs 1 --warmup 0 \
            --no-profile >"$out/ncu_forward.csv" 2>"$out/ncu_forward.err"
        python3 scripts/ncu_summary.py "$out/ncu_forward.csv" >"$out/ncu_forward.txt"
        grep "^forward" "$out/ncu_forward.txt" | awk '{print $(NF-1), $0}' | sort -n | tail -n 4 | cut -d' ' -f2- ;;
    crossover)  # decode at small batches through the fused GEMVs and through cuBLASLt (ops_fused.cu, fused_rows)
        for rows in default 0; do
            echo "GPT2_FUSED_ROWS=$rows"
            GPT2_FUSED_ROWS=${rows#default} ./gpt2 bench --quick --path fused --dtype bf16 --batches 1,2,4,8,16,32,64 \
                --prompts 16 --no-forward --no-profile 2>/dev/null | grep " decode "
        done | tee "$out/crossover.txt" ;;
    ttft)  # time to the first token at prompt lengths around each change of route on 124M (64/65: the
        # decode chain's limit until session 31; 128/129, 192/193, 704/705: gemm_rows's one-wave grids)
        ./gpt2 bench -m "$m" --path fused --dtype bf16 --batches 1 --new 2 --runs 15 --warmup 3 --no-forward \
            --no-profile --prompts 8,16,32,64,65,96,128,129,192,193,256,384,512,704,705,1024 2>/dev/null |
            grep " prefill " | tee "$out/ttft.txt" ;;
    bench)  # the bf16 table of docs/PERF.md, quick: fused and reference, batches 1, 8, 64
        ./gpt2 bench --quick --dtype bf16 --json "$out/bench_quick.json" 2>/dev/null | tee "$out/bench_quick.txt" ;;
    trace)
        make -j16 "${mk[@]}" TRACE=1 >"$out/build_trace.log" 2>&1 || { tail -n 30 "$out/build_trace.log"; exit 1; }
        # 8 steps (~5 MB of records, small enough to come back from a lent machine for a second look)
        GPT2_TRACE="$out/trace.bin" build/gpu-trace/gpt2 -m "$m" -n 8 --ignore-eos --temp 0 -p "Hello" >/dev/null
        python3 scripts/trace_decode.py "$out/trace.bin" | tee "$out/trace.txt" ;;
    ktrace)
        make ktrace >"$out/build_ktrace.log" 2>&1 || { tail -n 5 "$out/build_ktrace.log"; exit 1; }
        rm -f "$out/ktrace.txt"
        for shape in "--prompts 1024 --no-forward" "--prompts 16"; do  # the prompt's graph, then the forward's
            CUDA_INJECTION64_PATH=$PWD/build/libktrace.so KTRACE_OUT="$out/ktrace.csv" ./gpt2 bench -m "$m" \
                --path fused --dtype bf16 --batches 1 --new 2 --runs 5 --warmup 2 --no-profile $shape >/dev/null 2>&1
            python3 scripts/ktrace.py "$out/ktrace.csv" --min-nodes 80 | tee -a "$out/ktrace.txt"
        done ;;
    esac
    echo "== $s: $(( $(date +%s) - t0 )) s"
done
