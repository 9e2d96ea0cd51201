#!/usr/bin/env bash
# Runs every test and ends with one line "N passed, N failed, N skipped".
#   tests/test_*      C unit tests built by make (GPU tests among them skip without a GPU)
#   tests/e2e_*.sh    end-to-end checks through ./gpt2 and the PyTorch scripts
# Each prints PASS/FAIL/SKIP lines (tests/test.h); a test that crashes or exits non-zero without
# printing a FAIL line is counted as one failure of its own.
set -u
cd "$(dirname "$0")/.."
export GPT2_BIN="${GPT2_BIN:-./gpt2}" GPT2_BUILD="${GPT2_BUILD:-build/cpu}" GPT2_SANITIZE="${GPT2_SANITIZE:-0}"
export GPT2_TMP="${GPT2_TMP:-$GPT2_BUILD/testdata}"
mkdir -p "$GPT2_TMP"
log="$GPT2_TMP/test.log"
: > "$log"

passed=0 failed=0 skipped=0
run_one() {  # name command...
    local name=$1; shift
    local out rc
    out=$("$@" 2>"$GPT2_TMP/stderr.txt"); rc=$?
    printf '%s\n' "$out" | tee -a "$log" | grep -E '^(PASS|FAIL|SKIP) '
    local p f s
    p=$(printf '%s\n' "$out" | grep -c '^PASS ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited with status $rc; stderr:"; tail -n 20 "$GPT2_TMP/stderr.txt"
        f=1
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

for t in "$GPT2_BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t")"
    run_one "$(basename "$t")" "$t"
done
for t in tests/e2e_*.sh; do
    [ -f "$t" ] || continue
    echo "== $(basename "$t")"
    run_one "$(basename "$t")" bash "$t"
done

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
