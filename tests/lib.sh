# Shared helpers for the end-to-end scripts (sourced). Results use tests/test.h's line format.
set -u
GPT2_BIN="${GPT2_BIN:-./gpt2}"
GPT2_BUILD="${GPT2_BUILD:-build/cpu}"
GPT2_TMP="${GPT2_TMP:-$GPT2_BUILD/testdata}"
mkdir -p "$GPT2_TMP"

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }
check() {  # name condition-exit-code message
    if [ "$2" -eq 0 ]; then pass "$1"; else fail "$1" "$3"; fi
}

# expect_error NAME SUBSTRING CMD...: CMD must exit non-zero (not by a signal) and print SUBSTRING
# on stderr within one line.
expect_error() {
    local name=$1 want=$2; shift 2
    local err rc
    err=$("$@" 2>&1 >/dev/null); rc=$?
    if [ "$rc" -eq 0 ]; then fail "$name" "exited 0, wanted an error containing '$want'"
    elif [ "$rc" -ge 128 ]; then fail "$name" "killed by signal $((rc - 128)): $err"
    elif ! printf '%s\n' "$err" | grep -qF -- "$want"; then fail "$name" "stderr lacks '$want': $err"
    else pass "$name"; fi
}

# The Python that has PyTorch: $PYTHON if set, else Debian's /usr/bin/python3, else python3 on PATH.
torch_python() {
    local p
    for p in ${PYTHON:-} /usr/bin/python3 python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then echo "$p"; return 0; fi
    done
    return 1
}

# True when this build has CUDA and a GPU answers.
have_gpu() {
    case "$GPT2_BUILD" in *gpu*) ;; *) return 1 ;; esac
    nvidia-smi -L >/dev/null 2>&1
}
