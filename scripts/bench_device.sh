#!/usr/bin/env bash
# One call on the GPU machine: build, then `./gpt2 bench` and/or scripts/bench_torch.py, writing
# JSON, tables and charts under $OUT (or ./bench_out). What runs is chosen by the arguments:
#   scripts/bench_device.sh smoke           e2e_bench.sh (with --kernels --quick), the 124M bench, a short torch run
#   scripts/bench_device.sh gpt2 SIZE...    full ./gpt2 bench of each size (+ --kernels), JSON per size
#   scripts/bench_device.sh torch SIZE      scripts/bench_torch.py at SIZE, then charts of every JSON in $OUT and docs/bench/
# Needs the headers/libraries that scripts/devkit.sh puts in .devkit (carry it).
set -u
# The binary reads the commit with git, which the device copy may lack: BENCH_COMMIT=$(git rev-parse --short HEAD) here.
COMMIT=(); [ -n "${BENCH_COMMIT:-}" ] && COMMIT=(--commit "$BENCH_COMMIT")
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devkit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
build() {
    make -j16 CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" EXTRA_CFLAGS=-I$PWD/.devkit/include \
        EXTRA_LDFLAGS=-L$PWD/.devkit/lib gpt2 >/tmp/build.log 2>&1 && return 0
    echo "build failed:"; grep -E "error" /tmp/build.log | head -20
    return 1
}
what=${1:-smoke}; shift || true
case "$what" in
smoke)
    build || exit 1
    GPT2_BUILD=build/gpu GPT2_BIN=$PWD/gpt2 GPT2_TMP=/tmp/e2e bash tests/e2e_bench.sh 2>&1 | tee "$OUT/e2e_bench.txt"
    cp /tmp/e2e/e2e_bench/gpu.err "$OUT/e2e_gpu.err" 2>/dev/null
    ./gpt2 bench "${COMMIT[@]}" --size 124M --json "$OUT/smoke_124M.json" >"$OUT/smoke_124M.txt" 2>&1; echo "bench rc=$?"
    timeout 240 python3 scripts/bench_torch.py "${COMMIT[@]}" --size 124M --quick --batches 1,8 --prompts 16,1024 --new 32 \
        --json "$OUT/torch_smoke.json" >"$OUT/torch_smoke.txt" 2>&1; echo "torch rc=$?"
    grep -v "^bench \[" "$OUT/smoke_124M.txt" | tail -n 45; tail -n 25 "$OUT/torch_smoke.txt"
    ;;
gpt2)
    build || exit 1
    for size in "$@"; do
        ./gpt2 bench "${COMMIT[@]}" --size "$size" --json "$OUT/gpt2_$size.json" >"$OUT/gpt2_$size.txt" 2>&1; echo "bench $size rc=$?"
    done
    ./gpt2 bench "${COMMIT[@]}" --kernels --json "$OUT/kernels.json" >"$OUT/kernels.txt" 2>&1; echo "kernels rc=$?"
    for size in "$@"; do grep -v "^bench \[" "$OUT/gpt2_$size.txt" | tail -n 45; done
    tail -n 60 "$OUT/kernels.txt"
    ;;
all)  # one call for everything, each part under its own time limit (JSON is written as it goes)
    t0=$(date +%s)
    build || exit 1
    echo "built in $(( $(date +%s) - t0 )) s"
    timeout 90 ./gpt2 bench "${COMMIT[@]}" --size 124M --json "$OUT/gpt2_124M.json" >"$OUT/gpt2_124M.txt" 2>&1; echo "124M rc=$? at $(( $(date +%s) - t0 )) s"
    timeout 120 python3 scripts/bench_torch.py "${COMMIT[@]}" --size 124M --quick --json "$OUT/torch_124M.json" >"$OUT/torch_124M.txt" 2>&1
    echo "torch rc=$? at $(( $(date +%s) - t0 )) s"
    timeout 170 ./gpt2 bench "${COMMIT[@]}" --size 1558M --warmup 1 --json "$OUT/gpt2_1558M.json" >"$OUT/gpt2_1558M.txt" 2>&1; echo "1558M rc=$? at $(( $(date +%s) - t0 )) s"
    timeout 40 ./gpt2 bench "${COMMIT[@]}" --kernels --quick --json "$OUT/kernels.json" >"$OUT/kernels.txt" 2>&1; echo "kernels rc=$? at $(( $(date +%s) - t0 )) s"
    for f in gpt2_124M gpt2_1558M; do grep -v "^bench \[" "$OUT/$f.txt" | grep -v "^check" | tail -n 40; done
    tail -n 12 "$OUT/torch_124M.txt"; tail -n 40 "$OUT/kernels.txt"
    ;;
torch)
    size=${1:-124M}
    python3 scripts/bench_torch.py "${COMMIT[@]}" --size "$size" --json "$OUT/torch_$size.json" >"$OUT/torch_$size.txt" 2>&1
    echo "torch rc=$?"
    python3 scripts/plot_bench.py --out "$OUT" "$OUT"/*.json docs/bench/*.json
    tail -n 30 "$OUT/torch_$size.txt"
    ;;
esac
