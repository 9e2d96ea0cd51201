// libFuzzer target for the tokenizer: arbitrary bytes as text must encode, and decode back to
// themselves after Python-style UTF-8 repair; the same bytes read as token ids must decode
// without reading out of bounds, out-of-range ids refused. Run from the repository root (it
// loads ./tokenizer):
//   make fuzz && build/fuzz/fuzz_tokenizer -max_total_time=60
#include <stdint.h>

#include "tokenizer.h"
#include "utf8.h"

static Tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    Error err;
    tok = tokenizer_create(tokenizer_default_dir(), &err);
    if (!tok) die("fuzz_tokenizer: %s", err.msg);
    return 0;
}

#define REQUIRE(cond)                                                                    \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_tokenizer: %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
            __builtin_trap();                                                            \
        }                                                                                \
    } while (0)

// Text: encode, decode through the streaming decoder, compare with the repaired input.
static void round_trip(const char *text, size_t len) {
    int *ids;
    size_t n, replaced;
    Error err;
    REQUIRE(tokenizer_encode(tok, text, len, &ids, &n, &replaced, &err) == 0);
    char *fixed;
    size_t fixed_len;
    REQUIRE(utf8_repair(text, len, &fixed, &fixed_len) == replaced);
    const char *expect = fixed ? fixed : text;

    TokenDecoder dec;
    token_decoder_init(&dec);
    char buf[TOKEN_DECODE_MAX];
    size_t at = 0, k;
    for (size_t i = 0; i < n; i++) {
        REQUIRE(tokenizer_decode_next(tok, &dec, ids[i], buf, &k, &err) == 0);
        REQUIRE(k <= TOKEN_DECODE_MAX && at + k <= fixed_len && memcmp(buf, expect + at, k) == 0);
        at += k;
    }
    k = token_decoder_flush(&dec, buf);
    REQUIRE(k == 0);  // repaired text is valid UTF-8: nothing is left incomplete at its end
    REQUIRE(at == fixed_len);
    free(fixed);
    free(ids);
}

// Ids: two bytes each, a few past the end of the vocabulary.
static void decode_ids(const uint8_t *data, size_t size) {
    TokenDecoder dec;
    token_decoder_init(&dec);
    char buf[TOKEN_DECODE_MAX];
    size_t k;
    Error err;
    for (size_t i = 0; i + 1 < size; i += 2) {
        int id = (data[i] | data[i + 1] << 8) % (tokenizer_vocab_size(tok) + 16);
        int rc = tokenizer_decode_next(tok, &dec, id, buf, &k, &err);
        REQUIRE(rc == (id < tokenizer_vocab_size(tok) ? 0 : -1) && k <= TOKEN_DECODE_MAX);
    }
    REQUIRE(token_decoder_flush(&dec, buf) <= 3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    round_trip((const char *)data, size);
    decode_ids(data, size);
    return 0;
}
