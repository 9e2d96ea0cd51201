#!/usr/bin/env bash
# One call on a lent GPU machine for the reference GPU path (issue 4): build for sm_90a, the unit
# test, the end-to-end checks against transformers, compute-sanitizer (memcheck, racecheck) on the
# unit test, and a decode timing for docs/PERF.md. Logs go to $OUT (or build/gpu/check).
#   bash scripts/gpu_reference_check.sh [build] [unit] [e2e] [sanitize|memcheck|racecheck] [maketest] [time]
# (default: build unit e2e sanitize time; `time` needs the 124M-shape model that e2e writes)
set -u
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu/check}
mkdir -p "$out"
steps=${*:-build unit e2e sanitize time}
mk=(CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
if [ -d .devkit ]; then
    mk+=(EXTRA_CFLAGS=-I$PWD/.devkit/include EXTRA_LDFLAGS=-L$PWD/.devkit/lib)
    export LD_LIBRARY_PATH=$PWD/.devkit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export GPT2_BIN=./gpt2 GPT2_BUILD=build/gpu PYTHONUNBUFFERED=1
for s in $steps; do
    t0=$(date +%s)
    case $s in
    build)
        nvidia-smi -L
        make -j16 "${mk[@]}" gpt2 build/gpu/tests/test_gpu_engine >"$out/build.log" 2>&1 ||
            { tail -n 30 "$out/build.log"; exit 1; }
        grep -i "warning" "$out/build.log" | head -n 20 ;;
    unit)
        build/gpu/tests/test_gpu_engine 2>&1 | tee "$out/unit.log" ;;
    e2e)
        bash tests/e2e_gpu.sh 2>&1 | tee "$out/e2e.log" ;;
    maketest)
        timeout 200 make "${mk[@]}" test 2>&1 | tee "$out/make_test.log" | grep -E "^(FAIL|SKIP|==)|passed," ;;
    memcheck|racecheck|sanitize)
        tools=$s; [ $s = sanitize ] && tools="memcheck racecheck"
        for tool in $tools; do
            GPT2_NO_OOM_TEST=1 compute-sanitizer --tool $tool --error-exitcode 9 build/gpu/tests/test_gpu_engine \
                >"$out/$tool.log" 2>&1
            rc=$?
            echo "$tool: exit $rc | $(grep -c '^PASS' "$out/$tool.log") PASS," \
                "$(grep -c '^FAIL' "$out/$tool.log") FAIL |" \
                "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -n 1)"
        done ;;
    time)
        m=build/gpu/testdata/e2e_gpu/gpt2_124M_shape.bin
        for dt in fp32 bf16; do
            for b in 1 8; do
                ./gpt2 -m "$m" --reference --dtype $dt -b $b -n 256 --ignore-eos --temp 0 -p "Hello world" \
                    2>&1 >/dev/null | grep -E "^(gpu|prompt|decode):" | sed "s/^/$dt b=$b /"
            done
        done 2>&1 | tee "$out/time.log" ;;
    esac
    echo "== $s: $(( $(date +%s) - t0 )) s"
done
