# ./gpt2 tokenize / detokenize from the outside: output format, input sources, errors, round
# trips through files; then a short libFuzzer run of the tokenizer where clang's libFuzzer works.
source "$(dirname "$0")/lib.sh"

tok() { "$GPT2_BIN" tokenize "$@"; }
detok() { "$GPT2_BIN" detokenize "$@"; }

# ----------------------------------------------------------------------------
# tokenize

[ "$(tok "Hello world")" = "15496 995" ]
check tokenize_text $? "'Hello world' is not '15496 995': $(tok "Hello world" 2>&1)"

[ "$(printf 'Hello world' | tok)" = "15496 995" ] && [ "$(printf 'Hello world' | tok -f -)" = "15496 995" ]
check tokenize_stdin $? "standard input gave $(printf 'Hello world' | tok 2>&1)"

[ "$(tok "a<|endoftext|>b")" = "64 50256 65" ]
check tokenize_endoftext $? "'a<|endoftext|>b' gave $(tok "a<|endoftext|>b" 2>&1)"

help=$(tok --help)
printf '%s' "$help" | grep -qF '<|endoftext|>' && printf '%s' "$help" | grep -qF 50256
check tokenize_help $? "--help does not mention <|endoftext|> -> 50256"

out=$(printf '' | tok | od -An -c | tr -d ' ')
[ "$out" = '\n' ]
check tokenize_empty $? "empty input printed '$out', wanted one newline"

# Invalid UTF-8: one warning line, and ids of the text with U+FFFD in place (Python's rules).
printf 'caf\xe9 \xff\xfe' > "$GPT2_TMP/latin1.txt"
ids=$(tok -f "$GPT2_TMP/latin1.txt" 2>"$GPT2_TMP/warn.txt")
want=$(printf 'caf\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd' | tok)
[ "$ids" = "$want" ] && [ "$(wc -l < "$GPT2_TMP/warn.txt")" -eq 1 ] && grep -q 'not valid UTF-8; 3 invalid' "$GPT2_TMP/warn.txt"
check tokenize_invalid_utf8 $? "ids '$ids' (want '$want'), stderr: $(cat "$GPT2_TMP/warn.txt")"

expect_error tokenize_missing_file "gpt2: tokenize: $GPT2_TMP/none.txt" "$GPT2_BIN" tokenize -f "$GPT2_TMP/none.txt"
mkdir -p "$GPT2_TMP/a_directory"
expect_error tokenize_file_is_directory "$GPT2_TMP/a_directory: Is a directory" \
    "$GPT2_BIN" tokenize -f "$GPT2_TMP/a_directory"
expect_error tokenize_bad_dir "encoder.json" "$GPT2_BIN" tokenize -t "$GPT2_TMP/no-tokenizer" "x"

# ----------------------------------------------------------------------------
# detokenize

[ "$(detok 15496 995)" = "Hello world" ]
check detokenize_args $? "'15496 995' gave '$(detok 15496 995 2>&1)'"

[ "$(printf '15496\n 995 \n' | detok)" = "Hello world" ] && [ "$(printf '15496 995' | detok -f -)" = "Hello world" ]
check detokenize_stdin $? "ids on standard input did not give 'Hello world'"

# A file of every kind of text, NULs and CRLF included, comes back byte for byte.
printf 'line one\r\n\ttab\x00nul  spaces \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x91\xa9\xf0\x9f\x8f\xbd\xe2\x80\x8d\xf0\x9f\x92\xbb <|endoftext|> it'"'"'S\n\n' > "$GPT2_TMP/mixed.txt"
tok -f "$GPT2_TMP/mixed.txt" > "$GPT2_TMP/mixed.ids" && detok -f "$GPT2_TMP/mixed.ids" > "$GPT2_TMP/mixed.back" &&
    cmp -s "$GPT2_TMP/mixed.txt" "$GPT2_TMP/mixed.back"
check tokenize_round_trip_file $? "tokenize | detokenize changed the file"

expect_error detokenize_not_a_number "gpt2: detokenize: 'abc' is not a token id" "$GPT2_BIN" detokenize 15496 abc
expect_error detokenize_too_big "gpt2: detokenize: token id 50257 is out of range" "$GPT2_BIN" detokenize 50257
expect_error detokenize_negative "gpt2: detokenize: token id -1 is out of range" "$GPT2_BIN" detokenize -1
expect_error detokenize_huge "gpt2: detokenize: token id 99999999999999999999 is out of range" \
    "$GPT2_BIN" detokenize 99999999999999999999
out=$(detok 15496 995 abc 2>/dev/null)
[ -z "$out" ]
check detokenize_error_writes_nothing $? "wrote '$out' before failing on a bad id"
expect_error detokenize_file_junk "gpt2: detokenize: '12x' is not a token id" \
    bash -c "printf '1 2 12x' | \"$GPT2_BIN\" detokenize"

# ----------------------------------------------------------------------------
# A bounded libFuzzer run

fuzz_tokenizer() {
    if [ "$GPT2_SANITIZE" = 1 ]; then
        skip fuzz_tokenizer "the fuzz target is sanitized already and runs in the plain 'make test'"; return
    fi
    if ! command -v clang >/dev/null; then skip fuzz_tokenizer "no clang"; return; fi
    local probe="$GPT2_TMP/fuzz_probe"
    printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' > "$probe.c"
    if ! clang -fsanitize=fuzzer "$probe.c" -o "$probe" >/dev/null 2>&1; then
        skip fuzz_tokenizer "clang cannot link libFuzzer here"; return
    fi
    if ! make -s build/fuzz/fuzz_tokenizer > "$GPT2_TMP/fuzz_build.log" 2>&1; then
        fail fuzz_tokenizer "build failed: $(tail -n 5 "$GPT2_TMP/fuzz_build.log")"; return
    fi
    mkdir -p "$GPT2_TMP/fuzz_corpus"
    printf 'Hello world<|endoftext|> it'"'"'s \xe6\x9d\xb1 \xf0\x9f\x91\x8d\xff' > "$GPT2_TMP/fuzz_corpus/seed"
    if build/fuzz/fuzz_tokenizer -max_total_time=15 -max_len=4096 "$GPT2_TMP/fuzz_corpus" \
        > "$GPT2_TMP/fuzz.log" 2>&1; then
        pass fuzz_tokenizer
    else
        fail fuzz_tokenizer "$(grep -m 3 -E 'fuzz_tokenizer:|ERROR|SUMMARY' "$GPT2_TMP/fuzz.log")"
    fi
}
fuzz_tokenizer
