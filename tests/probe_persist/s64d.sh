#!/usr/bin/env bash
# SCRATCH session 64 calls 8+: the probe built here (scratch/bin/probe_persist, CUDA 13, sm_90a), timed at
# 8,192 rows; its SASS to $OUT.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L
timeout 200 scratch/bin/probe_persist 8192 2>&1 | tee $OUT/probe_8192.log
echo "exit $?"
cuobjdump -sass scratch/bin/probe_persist > $OUT/probe.sass 2>&1; echo "sass: $(wc -l < $OUT/probe.sass) lines"
gzip -f $OUT/probe.sass
if [ -n "${SAN:-}" ]; then
  for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool $tool scratch/bin/probe_persist 512 > $OUT/san_$tool.log 2>&1
    echo "$tool: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$tool.log) | persist_kernel lines: $(grep -c persist_kernel $OUT/san_$tool.log)"
  done
fi
