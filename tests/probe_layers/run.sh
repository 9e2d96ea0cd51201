#!/usr/bin/env bash
# SCRATCH session 66: the two probes of docs/PERF.md "Session 66", as its device calls ran them (one H200).
#   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o scratch/bin/probe_stages tests/probe_stages/probe_stages.cu
#   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o scratch/bin/probe_layers tests/probe_layers/probe_layers.cu
set -u
nvidia-smi -L
for i in 1 2; do timeout 120 scratch/bin/probe_stages; done
for p in 0123 1111 2323 0123 1111 2323 0123; do timeout 120 scratch/bin/probe_layers $p; done
for tool in memcheck racecheck; do
  for probe in probe_stages probe_layers; do
    timeout 150 compute-sanitizer --tool $tool scratch/bin/$probe once 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY"
  done
done
