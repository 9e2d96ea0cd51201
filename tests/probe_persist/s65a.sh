#!/usr/bin/env bash
# SCRATCH prepared in session 64 for session 65's first call (~40 s of device time): where the persistent
# probe's LayerNorm fold loses its 6-8 us a product (docs/PERF.md "Session 64", "The fold in the persistent
# kernel"). The binary is built here by `bash scratch/s64build.sh` (rebuild it first if the probe changed).
# Variants (PROBE_FOLD=1, qkv and fc at 8,192 rows): bias only; folded; fold diag 1 (no statistics, no waits:
# the epilogue's arithmetic and shared reads alone); diag 2 (statistics computed, consumers not waiting);
# diag 3 (the statistics warps back off with nanosleep); diag 4 (no statistics warps: each consumer quad its
# row's statistics from parts loaded at the tile's start; correct). Then the residual products by TMA
# (PROBE_RESIDUAL=1: resid_kernel, y's old tile loaded a tile ahead and stored back by TMA). memcheck at 512 rows.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L
PROBE_FOLD=1 timeout 200 scratch/bin/probe_persist 8192 2>&1 | tee $OUT/probe_fold_8192.log
echo "exit $?"
# the residual products by TMA (resid_kernel, prepared in session 64), against cuBLASLt's BIAS_RESIDUAL
PROBE_RESIDUAL=1 timeout 200 scratch/bin/probe_persist 8192 2>&1 | tee $OUT/probe_resid_8192.log
echo "exit $?"
PROBE_RESIDUAL=1 timeout 90 compute-sanitizer --tool memcheck scratch/bin/probe_persist 512 > $OUT/san_memcheck_resid.log 2>&1
echo "memcheck (residual): exit $? | $(grep -E 'ERROR SUMMARY' $OUT/san_memcheck_resid.log)"
PROBE_FOLD=1 timeout 90 compute-sanitizer --tool memcheck scratch/bin/probe_persist 512 > $OUT/san_memcheck.log 2>&1
echo "memcheck: exit $? | $(grep -E 'ERROR SUMMARY' $OUT/san_memcheck.log)"
