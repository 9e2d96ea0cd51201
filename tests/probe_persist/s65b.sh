#!/usr/bin/env bash
# SCRATCH prepared in session 64 for session 65: ncu's memory tables on the persistent probe's bias-only forms
# (TMA stores at once, and a 16-row box a slice) and on cuBLASLt's kernels, qkv at 8,192 rows: where y's stores
# still cost ~4-5 us (docs/PERF.md "Session 64"). Binary from `bash scratch/s64build.sh`. ~2-3 minutes.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
PROBE_ONCE=1 timeout 400 ncu --kernel-name regex:'persist|nvjet' \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section WarpStateStats --section SchedulerStats \
  scratch/bin/probe_persist 8192 0 > $OUT/ncu_qkv.txt 2>&1
echo "ncu: exit $?"
grep -E "^  [a-z_]+.*\(|^    (Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Mem Busy|Max Bandwidth|L2 Hit Rate|No Eligible)" \
  $OUT/ncu_qkv.txt | cut -c1-140
gzip -f $OUT/ncu_qkv.txt
