#!/usr/bin/env bash
# SCRATCH session 65 call 2: the fold and residual forms with every shared read before the first store.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
PROBE_FOLD=1 timeout 200 scratch/bin/probe_persist 8192 2>&1 | tee $OUT/probe_fold_8192.log
PROBE_RESIDUAL=1 timeout 200 scratch/bin/probe_persist 8192 2>&1 | grep -A12 "residual" | tee $OUT/probe_resid_8192.log
PROBE_RESIDUAL=1 timeout 90 compute-sanitizer --tool memcheck scratch/bin/probe_persist 512 > $OUT/san_memcheck_resid.log 2>&1
echo "memcheck (residual): exit $? | $(grep -E 'ERROR SUMMARY' $OUT/san_memcheck_resid.log)"
