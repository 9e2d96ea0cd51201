#!/usr/bin/env bash
# scripts/download_model.sh against a stand-in for the Hugging Face hub on localhost (this machine
# has no internet): the hub's answers as huggingface.co gives them (config.json served directly,
# model.safetensors a redirect to a CDN with X-Linked-Size, ranges honoured), then a fresh
# download, a finished one left alone, a resumed one, a renamed repository, a size mismatch, a
# missing repository, no network at all, and a name that is not GPT-2.
cd "$(dirname "$0")/.."
source tests/lib.sh
dir="$GPT2_TMP/e2e_download"
rm -rf "$dir" && mkdir -p "$dir"

if ! command -v python3 >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
    skip e2e_download "needs python3 (the stand-in hub) and curl"
    exit 0
fi

cat >"$dir/hub.py" <<'EOF'
# Stand-in hub: repos openai-community/gpt2 (honest), gpt2-medium (reports one byte too many) and
# gpt2-xl (moved: redirects to gpt2); anything else is 404. Every request is logged with its Range header.
import http.server, random, sys
out = sys.argv[1]
payload = random.Random(7).randbytes(300000)
open(f"{out}/payload", "wb").write(payload)
config = b'{"n_layer": 1, "n_head": 1, "n_embd": 64, "n_positions": 8, "vocab_size": 10}\n'

class Hub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, body):
        with open(f"{out}/requests.log", "a") as log:
            log.write(f"{self.command} {self.path} range={self.headers.get('Range')}\n")
        parts = self.path.split("/")
        repo = "/".join(parts[1:3])
        if self.path.startswith("/cdn/"):
            start = 0
            rng = self.headers.get("Range")
            if rng:
                start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206 if rng else 200)
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(payload) - 1}/{len(payload)}")
            self.send_header("Content-Length", str(len(payload) - start))
            self.end_headers()
            if body:
                self.wfile.write(payload[start:])
        elif repo == "openai-community/gpt2-xl":  # a renamed repository: a same-site redirect
            self.send_response(307)
            self.send_header("Location", "/openai-community/gpt2/resolve/main/" + parts[-1])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif repo in ("openai-community/gpt2", "openai-community/gpt2-medium") and parts[-1] == "model.safetensors":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/cdn/blob?signature=x")
            self.send_header("X-Linked-Size", str(len(payload) + (repo.endswith("medium"))))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif repo in ("openai-community/gpt2", "openai-community/gpt2-medium") and parts[-1] == "config.json":
            self.send_response(200)
            self.send_header("Content-Length", str(len(config)))
            self.end_headers()
            if body:
                self.wfile.write(config)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_HEAD(self):
        self.answer(False)

    def do_GET(self):
        self.answer(True)

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
open(f"{out}/port.tmp", "w").write(str(server.server_port))
import os; os.rename(f"{out}/port.tmp", f"{out}/port")
server.serve_forever()
EOF
python3 "$dir/hub.py" "$dir" &
hub_pid=$!
trap 'kill "$hub_pid" 2>/dev/null' EXIT
for _ in $(seq 50); do [ -f "$dir/port" ] && break; sleep 0.1; done
if [ ! -f "$dir/port" ]; then
    fail e2e_download_hub "the stand-in hub did not start"
    exit 0
fi
export GPT2_HF_ENDPOINT="http://127.0.0.1:$(cat "$dir/port")" GPT2_MODEL_DIR="$dir/model"
dl() { bash scripts/download_model.sh "$@" >"$dir/out.txt" 2>&1; }
got="$dir/model/gpt2/model.safetensors"

dl gpt2
rc=$?
cmp -s "$got" "$dir/payload" && [ -s "$dir/model/gpt2/config.json" ] && [ ! -e "$got.part" ]
check e2e_download_fetch $((rc + $?)) "rc=$rc: $(tail -n 3 "$dir/out.txt")"

: >"$dir/requests.log"
dl gpt2 && ! grep -q '^GET' "$dir/requests.log" && grep -q 'already complete' "$dir/out.txt"
check e2e_download_complete_left_alone $? "downloaded again: $(cat "$dir/requests.log")"
# `make download` takes MODEL from its command line only, not from an environment's MODEL.
MODEL=/data/llama make -s download >"$dir/make.txt" 2>&1 && grep -q 'already complete' "$dir/make.txt"
check e2e_download_make_ignores_env_model $? "$(tail -n 3 "$dir/make.txt")"

# An interrupted download: the first 100000 bytes are there; only the rest may be fetched.
rm -f "$got" && head -c 100000 "$dir/payload" >"$got.part" && : >"$dir/requests.log"
dl gpt2 && cmp -s "$got" "$dir/payload" && grep -q 'GET /cdn/blob?signature=x range=bytes=100000-' "$dir/requests.log"
check e2e_download_resume $? "$(cat "$dir/requests.log") $(tail -n 2 "$dir/out.txt")"

dl gpt2-xl && cmp -s "$dir/model/gpt2-xl/model.safetensors" "$dir/payload"
check e2e_download_same_site_redirect $? "$(tail -n 3 "$dir/out.txt")"

expect_error e2e_download_size_mismatch "300000 bytes, but the hub reports 300001" \
    bash scripts/download_model.sh gpt2-medium
[ ! -e "$dir/model/gpt2-medium/model.safetensors" ]
check e2e_download_mismatch_not_installed $? "a file of the wrong size was moved into place"
expect_error e2e_download_missing_repo "HTTP 404: no such file on the hub" bash scripts/download_model.sh gpt2-large
expect_error e2e_download_offline "cannot reach http://127.0.0.1:1" \
    env GPT2_HF_ENDPOINT=http://127.0.0.1:1 bash scripts/download_model.sh gpt2
expect_error e2e_download_unknown_name "unknown model 'gpt3'" bash scripts/download_model.sh gpt3
exit 0
