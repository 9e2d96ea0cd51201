#!/usr/bin/env bash
# Downloads GPT-2 weights from the Hugging Face hub into model/<name>/ (model.safetensors and
# config.json), the directory ./gpt2 -m reads; `make download MODEL=<name>` runs this.
#
#   scripts/download_model.sh [gpt2|gpt2-medium|gpt2-large|gpt2-xl]     (default gpt2)
#
#   gpt2         124M   ~0.5 GB        gpt2-large   774M   ~3.2 GB
#   gpt2-medium  355M   ~1.5 GB        gpt2-xl     1558M   ~6.4 GB
#
# An interrupted download resumes (curl -C -) from model/<name>/model.safetensors.part. Each file's
# size is checked against the size the hub reports before it is moved into place.
# Environment:
#   GPT2_HF_ENDPOINT   hub or mirror to use (default $HF_ENDPOINT, else https://huggingface.co)
#   GPT2_MODEL_DIR     where model/<name>/ goes (default: model/ in the repository)
#   HF_TOKEN           sent as a bearer token when set (rate limits, private mirrors)
set -euo pipefail

prog=download_model.sh
usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

name=${1:-gpt2}
case $name in
    gpt2 | gpt2-medium | gpt2-large | gpt2-xl) ;;
    -h | --help) usage ;;
    *) echo "$prog: unknown model '$name': choose gpt2, gpt2-medium, gpt2-large or gpt2-xl" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "$prog: one model name at most (got $*)" >&2; exit 2; }
command -v curl >/dev/null || { echo "$prog: curl is not installed" >&2; exit 1; }

endpoint=${GPT2_HF_ENDPOINT:-${HF_ENDPOINT:-https://huggingface.co}}
endpoint=${endpoint%/}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${GPT2_MODEL_DIR:-$root/model}/$name
# The OpenAI checkpoints live under openai-community/; the short names redirect there.
repo=openai-community/$name
auth=()
[ -n "${HF_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $HF_TOKEN")

offline() {  # curl-message
    cat >&2 <<EOF
$prog: cannot reach $endpoint: $1
  This machine may be offline. Set GPT2_HF_ENDPOINT to a reachable mirror, or fetch
  $endpoint/$repo/resolve/main/model.safetensors and config.json elsewhere and copy
  them into $dir/ (./gpt2 -m $dir reads them).
EOF
    exit 1
}

# The file's size as the hub reports it. Large files are stored in LFS/Xet: the hub answers a
# redirect to its CDN and gives the size in X-Linked-Size; small files are served directly, with
# Content-Length. Only same-site redirects (a renamed repository) are followed: the CDN's answer
# to HEAD is not needed, and not every CDN allows one.
remote_size() {  # url -> prints the size, or nothing when the hub gives none
    local url=$1 headers status location hops
    for hops in 1 2 3 4 5; do
        headers=$(curl -sS -I --connect-timeout 15 --max-time 60 --retry 2 ${auth[@]+"${auth[@]}"} "$url" 2>&1) ||
            offline "$(printf '%s' "$headers" | tail -n 1)"
        headers=$(printf '%s' "$headers" | tr -d '\r')
        status=$(printf '%s\n' "$headers" | awk 'toupper($1) ~ /^HTTP\// { s = $2 } END { print s }')
        case $status in
            2?? | 3??) ;;
            401 | 403 | 404) echo "$prog: $url: HTTP $status: no such file on the hub (or access denied)" >&2; exit 1 ;;
            *) echo "$prog: $url: unexpected answer from the hub (HTTP ${status:-none})" >&2; exit 1 ;;
        esac
        local size
        size=$(printf '%s\n' "$headers" | awk -F': *' 'tolower($1) == "x-linked-size" { print $2 }' | tail -n 1)
        [ -n "$size" ] || [ "${status:0:1}" = 3 ] ||
            size=$(printf '%s\n' "$headers" | awk -F': *' 'tolower($1) == "content-length" { print $2 }' | tail -n 1)
        location=$(printf '%s\n' "$headers" | awk -F': *' 'tolower($1) == "location" { print $2 }' | tail -n 1)
        if [ -z "$size" ] && [ "${status:0:1}" = 3 ] && [ "${location:0:1}" = / ]; then
            url=$endpoint$location
            continue
        fi
        printf '%s' "$size"
        return 0
    done
    echo "$prog: $1: too many redirects" >&2
    exit 1
}

bytes_of() { if [ -f "$1" ]; then wc -c <"$1" | tr -d ' '; else echo 0; fi; }

fetch() {  # file
    local file=$1 url=$endpoint/$repo/resolve/main/$1 dest=$dir/$1 part=$dir/$1.part size
    size=$(remote_size "$url")
    case $size in
        '' ) echo "$prog: warning: the hub reports no size for $file; its length goes unchecked" >&2 ;;
        *[!0-9]*) echo "$prog: $url: unreadable size '$size' from the hub" >&2; exit 1 ;;
    esac
    if [ -f "$dest" ] && { [ -z "$size" ] || [ "$(bytes_of "$dest")" = "$size" ]; }; then
        echo "$dest: already complete (${size:-?} bytes)"
        return 0
    fi
    # A partial file longer than the whole is not a prefix of it: start again.
    if [ -n "$size" ] && [ "$(bytes_of "$part")" -gt "$size" ]; then rm -f "$part"; fi
    if [ -z "$size" ] || [ "$(bytes_of "$part")" != "$size" ]; then
        echo "$file <- $url${size:+ ($size bytes)}"
        local progress=(--progress-bar)
        [ -t 2 ] || progress=(-sS)
        if ! curl -fL -C - --retry 5 --retry-delay 3 --connect-timeout 15 "${progress[@]}" ${auth[@]+"${auth[@]}"} -o "$part" "$url"; then
            echo "$prog: download of $file interrupted; run the same command again to resume from $part" >&2
            exit 1
        fi
    fi
    local got
    got=$(bytes_of "$part")
    if [ -n "$size" ] && [ "$got" != "$size" ]; then
        echo "$prog: $part: $got bytes, but the hub reports $size; delete it and run again" >&2
        exit 1
    fi
    mv -f "$part" "$dest"
}

mkdir -p "$dir"
fetch config.json
fetch model.safetensors
echo "$dir: ready. Try: ./gpt2 -m $dir -p \"Hello, I'm a language model,\""
