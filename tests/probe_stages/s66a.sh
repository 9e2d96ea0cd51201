#!/usr/bin/env bash
# SCRATCH prepared in session 65 for session 66's first call (~3-4 minutes of device time; carry .devkit and
# scratch): (1) the stage probe (scratch/probe_stages.cu, built here by
#   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o scratch/bin/probe_stages scratch/probe_stages.cu)
# and memcheck/racecheck on one launch of each form; (2) `bench --quick` on HEAD for the README's table.
set -u
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.devkit/lib
nvidia-smi -L
timeout 120 scratch/bin/probe_stages 2>&1 | tee $OUT/probe_stages.log
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool scratch/bin/probe_stages once > $OUT/san_stages_$tool.log 2>&1
  echo "$tool: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_stages_$tool.log | tail -1)"
done
make -j16 CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" EXTRA_CFLAGS=-I$PWD/.devkit/include \
  EXTRA_LDFLAGS=-L$PWD/.devkit/lib gpt2 > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
timeout 200 ./gpt2 bench --quick --commit ${BENCH_COMMIT:-HEAD} --json $OUT/quick.json > $OUT/quick.txt 2>&1
echo "quick: exit $?"; grep -v "^bench \[" $OUT/quick.txt | grep -E "^(fused|reference|path)" | head -30
