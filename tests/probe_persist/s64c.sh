#!/usr/bin/env bash
# SCRATCH session 64 call 4: ncu on the probe's kernels and cuBLASLt's at 8,192 rows (qkv, MLP projection).
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.devkit/lib
t0=$(date +%s)
make -j16 CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" EXTRA_CFLAGS=-I$PWD/.devkit/include \
  EXTRA_LDFLAGS=-L$PWD/.devkit/lib gpt2 >$OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
objs=$(ls build/gpu/src/*.o build/gpu/tokenizer/*.o build/gpu/kernels/*.o | grep -v '/main.o$')
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Ikernels -Iscratch -DGPT2_CUDA=1 -DGPT2_SM90A=1 \
  --expt-relaxed-constexpr -lineinfo -o build/probe_persist scratch/probe_persist.cu $objs -Xcompiler -fopenmp \
  -L$PWD/.devkit/lib -lcublasLt -lcublas -lcjson -lpcre2-8 -lm >$OUT/probe_build.log 2>&1 \
  || { grep -v warning $OUT/probe_build.log | tail -20; exit 1; }
echo "probe built at $(( $(date +%s) - t0 )) s"
for shape in 0 3; do
  PROBE_ONCE=1 timeout 200 ncu --kernel-name regex:'persist|nvjet' \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second \
    build/probe_persist 8192 $shape > $OUT/ncu_$shape.txt 2>&1
  echo "shape $shape: exit $? at $(( $(date +%s) - t0 )) s"
done
for f in $OUT/ncu_*.txt; do
  echo "== $f"
  grep -E "^  [a-z_]+.*\(|^    (Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc Active|SM Busy|Issue Slots Busy|Shared Memory|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Mem Pipes Busy|Warp Cycles Per Issued|No Eligible|Avg. Active Threads|One or More Eligible|SM Frequency)|sm__pipe_tensor|cycles_elapsed" $f | cut -c1-150
done
