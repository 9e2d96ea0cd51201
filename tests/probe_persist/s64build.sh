#!/usr/bin/env bash
# SCRATCH session 64: builds scratch/bin/probe_persist here (no GPU needed; CUDA 13 like the device), linking the
# six objects of kernels/ that matmul_lt needs. Then `bash scratch/s64d.sh` on the device runs it (~40 s a call).
set -eu
cd "$(dirname "$0")/.."
mkdir -p build/probe scratch/bin
F="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Ikernels -DGPT2_CUDA=1 -DGPT2_SM90A=1"
for f in matmul_lt bias convert gelu matmul_cublas residual layernorm; do
  nvcc $F -c kernels/$f.cu -o build/probe/$f.o &
done
nvcc $F -Iscratch --expt-relaxed-constexpr -lineinfo -Xptxas -v -c scratch/probe_persist.cu -o build/probe/probe.o \
  >build/probe/probe.log 2>&1 || { grep error build/probe/probe.log; exit 1; }
grep -E "spill|C7518" build/probe/probe.log | sort | uniq -c
wait
nvcc -gencode arch=compute_90a,code=sm_90a -o scratch/bin/probe_persist build/probe/*.o -lcublasLt -lcublas -lcuda
echo "built scratch/bin/probe_persist"
