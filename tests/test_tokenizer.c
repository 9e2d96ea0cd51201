// The tokenizer against tiktoken's ids on the fixture corpus, the UTF-8 repair against Python's
// rules, round trips of random text, the streaming decoder, and the cost of very long words.
#include <cjson/cJSON.h>
#include <time.h>

#include "test.h"
#include "tokenizer.h"
#include "utf8.h"

#define FIXTURES "tests/fixtures/tokenizer/cases.jsonl"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Sanitizers slow the encoder several times over; the time limits below allow for it.
#if defined(__SANITIZE_ADDRESS__)
#define SLOWDOWN 10.0
#else
#define SLOWDOWN 1.0
#endif

// ----------------------------------------------------------------------------
// Helpers

typedef struct {
    char *bytes;
    size_t len;
} Bytes;

// Decodes ids through the streaming decoder; every chunk must be whole characters when the ids
// came from valid text (*chunks_ok says whether they were).
static Bytes decode_all(const Tokenizer *t, const int *ids, size_t n, bool *chunks_ok) {
    size_t cap = 4 * n + TOKEN_DECODE_MAX;
    Bytes out = {xmalloc(cap), 0};
    TokenDecoder dec;
    token_decoder_init(&dec);
    Error err;
    *chunks_ok = true;
    for (size_t i = 0; i < n; i++) {
        if (out.len + TOKEN_DECODE_MAX > cap) {
            out.bytes = realloc(out.bytes, cap *= 2);
            if (!out.bytes) die("out of memory");
        }
        size_t k;
        if (tokenizer_decode_next(t, &dec, ids[i], out.bytes + out.len, &k, &err)) {
            *chunks_ok = false;
            break;
        }
        char *fixed;
        size_t fixed_len;
        if (utf8_repair(out.bytes + out.len, k, &fixed, &fixed_len)) *chunks_ok = false;
        free(fixed);
        out.len += k;
    }
    out.len += token_decoder_flush(&dec, out.bytes + out.len);
    return out;
}

static int encode(const Tokenizer *t, const char *s, size_t len, int **ids, size_t *n, size_t *replaced) {
    Error err;
    int rc = tokenizer_encode(t, s, len, ids, n, replaced, &err);
    if (rc) printf("# encode failed: %s\n", err.msg);
    return rc;
}

static bool ids_equal(const int *a, size_t na, const int *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(int)) == 0);
}

static int *json_ids(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    int *ids = xmalloc(*n * sizeof(int));
    size_t i = 0;
    for (const cJSON *e = arr ? arr->child : NULL; e; e = e->next) ids[i++] = e->valueint;
    return ids;
}

static void print_ids(const char *label, const int *ids, size_t n) {
    printf("#   %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) printf(" %d", ids[i]);
    printf(n > 40 ? " ...\n" : "\n");
}

// ----------------------------------------------------------------------------
// Checks

static void test_basics(const Tokenizer *t) {
    CHECK(tokenizer_vocab_size(t) == 50257 && tokenizer_eot(t) == 50256, "tokenizer_sizes", "vocab %d eot %d",
          tokenizer_vocab_size(t), tokenizer_eot(t));
    int *ids;
    size_t n, r;
    int want[] = {15496, 995};
    CHECK(!encode(t, "Hello world", 11, &ids, &n, &r) && ids_equal(ids, n, want, 2), "tokenizer_hello_world",
          "wrong ids");
    free(ids);
    CHECK(!encode(t, "", 0, &ids, &n, &r) && n == 0 && r == 0, "tokenizer_empty", "%zu ids", n);
    free(ids);
    int want_eot[] = {64, 50256, 65};
    CHECK(!encode(t, "a<|endoftext|>b", 15, &ids, &n, &r) && ids_equal(ids, n, want_eot, 3), "tokenizer_eot",
          "<|endoftext|> is not 50256");
    free(ids);

    Error err;
    Tokenizer *none = tokenizer_create("/nonexistent-dir", &err);
    CHECK(!none && strstr(err.msg, "encoder.json"), "tokenizer_missing_dir", "message: %s", err.msg);
}

static void test_fixtures(const Tokenizer *t) {
    FILE *f = fopen(FIXTURES, "rb");
    if (!f) {
        CHECK(0, "tokenizer_fixtures", "cannot open %s", FIXTURES);
        return;
    }
    char *line = NULL;
    size_t cap = 0, cases = 0, bad_ids = 0, bad_replaced = 0, bad_roundtrip = 0, bad_chunks = 0, hf_differs = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        cJSON *c = cJSON_ParseWithLength(line, (size_t)got);
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItem(c, "hex"));
        if (!name || (!text && !hex)) {
            CHECK(0, "tokenizer_fixtures", "malformed line %zu", cases + 1);
            cJSON_Delete(c);
            break;
        }
        Bytes in;
        if (hex) {
            in.len = strlen(hex) / 2;
            in.bytes = xmalloc(in.len + 1);
            for (size_t i = 0; i < in.len; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&in.bytes[i]);
        } else {
            in.len = strlen(text);
            in.bytes = xmalloc(in.len + 1);
            memcpy(in.bytes, text, in.len);
        }
        size_t n_want, n_hf;
        int *want = json_ids(cJSON_GetObjectItem(c, "tiktoken"), &n_want);
        int *hf = json_ids(cJSON_GetObjectItem(c, "hf"), &n_hf);
        hf_differs += !ids_equal(want, n_want, hf, n_hf);
        int *ids = NULL;
        size_t n = 0, replaced = 0;
        if (encode(t, in.bytes, in.len, &ids, &n, &replaced) || !ids_equal(ids, n, want, n_want)) {
            if (bad_ids++ < 5) {
                printf("# fixture %s: ids differ from tiktoken\n", name);
                print_ids("got ", ids, n);
                print_ids("want", want, n_want);
            }
        }
        if ((double)replaced != cJSON_GetNumberValue(cJSON_GetObjectItem(c, "replaced"))) {
            if (bad_replaced++ < 5) printf("# fixture %s: %zu replacements\n", name, replaced);
        }
        bool chunks_ok;
        Bytes back = decode_all(t, want, n_want, &chunks_ok);
        char *fixed;
        size_t fixed_len;
        utf8_repair(in.bytes, in.len, &fixed, &fixed_len);
        const char *expect = fixed ? fixed : in.bytes;
        if (back.len != fixed_len || memcmp(back.bytes, expect, fixed_len)) {
            if (bad_roundtrip++ < 5) printf("# fixture %s: decoding tiktoken's ids does not give the text back\n", name);
        }
        if (!chunks_ok && bad_chunks++ < 5) printf("# fixture %s: a decoded chunk split a character\n", name);
        free(fixed);
        free(back.bytes);
        free(ids);
        free(want);
        free(hf);
        free(in.bytes);
        cJSON_Delete(c);
        cases++;
    }
    free(line);
    fclose(f);
    printf("# %zu fixture cases; Hugging Face's ids differ from tiktoken's on %zu\n", cases, hf_differs);
    CHECK(cases > 100 && bad_ids == 0, "tokenizer_fixtures_ids", "%zu of %zu cases differ from tiktoken", bad_ids,
          cases);
    CHECK(cases > 100 && bad_replaced == 0, "tokenizer_fixtures_replacements",
          "%zu of %zu cases count U+FFFD differently from Python", bad_replaced, cases);
    CHECK(cases > 100 && bad_roundtrip == 0 && bad_chunks == 0, "tokenizer_fixtures_decode",
          "%zu cases decode wrong, %zu split characters", bad_roundtrip, bad_chunks);
}

// Python's bytes.decode("utf-8", errors="replace") on these, written out by hand.
static void test_repair(void) {
    static const struct {
        const char *in, *out;
        size_t replaced;
    } cases[] = {
        {"ok \xc3\xa9", "ok \xc3\xa9", 0},
        {"\x80", "\xef\xbf\xbd", 1},
        {"\xc0\x80", "\xef\xbf\xbd\xef\xbf\xbd", 2},
        {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
        {"\xe2\x82", "\xef\xbf\xbd", 1},
        {"\xe2\x82" "A", "\xef\xbf\xbd" "A", 1},
        {"\xf0\x9f\x98" " x", "\xef\xbf\xbd x", 1},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4},
        {"\xf1\x80\x80\xe1\x80\xc2", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
        {"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd", 2},
    };
    size_t bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *fixed;
        size_t len;
        size_t r = utf8_repair(cases[i].in, strlen(cases[i].in), &fixed, &len);
        const char *got = fixed ? fixed : cases[i].in;
        if (r != cases[i].replaced || len != strlen(cases[i].out) || memcmp(got, cases[i].out, len)) {
            printf("# repair case %zu: %zu replacements\n", i, r);
            bad++;
        }
        free(fixed);
    }
    CHECK(bad == 0, "tokenizer_utf8_repair", "%zu cases differ from Python", bad);
}

// A random code point: mostly ASCII, then the rest of the BMP and the astral planes, no surrogates.
static uint32_t random_code_point(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    uint32_t r = (uint32_t)(*s >> 11);
    switch (r % 8) {
    case 0: case 1: case 2: return 0x20 + r / 8 % 95;
    case 3: return r / 8 % 32;  // controls, NUL included
    case 4: return 0x80 + r / 8 % 0x780;
    case 5: return 0x800 + r / 8 % (0xD800 - 0x800);
    case 6: return 0xE000 + r / 8 % 0x2000;
    default: return 0x10000 + r / 8 % 0x100000;
    }
}

static size_t put_utf8(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18), o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)), o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static void test_round_trip(const Tokenizer *t) {
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    char buf[4 * 200 + 64];
    size_t bad = 0, bad_chunks = 0, bad_count = 0;
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = 0, n_chars = 1 + (size_t)(seed >> 40) % 200;
        for (size_t i = 0; i < n_chars; i++) {
            len += put_utf8(random_code_point(&seed), buf + len);
            if (seed % 11 == 0) len += (size_t)sprintf(buf + len, "%s", seed % 3 ? " 's" : "<|endoftext|>");
        }
        int *ids;
        size_t n, r;
        if (encode(t, buf, len, &ids, &n, &r)) {
            bad++;
            continue;
        }
        bool chunks_ok;
        Bytes back = decode_all(t, ids, n, &chunks_ok);
        if (back.len != len || memcmp(back.bytes, buf, len)) bad++;
        bad_chunks += !chunks_ok;
        bad_count += r != 0;
        free(back.bytes);
        free(ids);
    }
    CHECK(bad == 0 && bad_chunks == 0 && bad_count == 0, "tokenizer_round_trip_random",
          "%zu of 3000 random texts do not come back, %zu split characters, %zu counted replacements", bad, bad_chunks,
          bad_count);
}

static void test_decoder(const Tokenizer *t) {
    // "🤖" is 3 tokens (bytes F0 9F | A4 | 96 of it spread over them, as GPT-2 splits it).
    int *ids;
    size_t n, r;
    encode(t, " \xf0\x9f\xa4\x96!", 6, &ids, &n, &r);
    TokenDecoder dec;
    token_decoder_init(&dec);
    char out[TOKEN_DECODE_MAX];
    size_t k, lens[8] = {0};
    Error err;
    for (size_t i = 0; i < n && i < 8; i++) tokenizer_decode_next(t, &dec, ids[i], out, &lens[i], &err);
    CHECK(n >= 3 && lens[n - 1] > 0 && token_decoder_flush(&dec, out) == 0, "tokenizer_decoder_holds_partial",
          "%zu ids; chunk lengths %zu %zu %zu", n, lens[0], lens[1], lens[2]);
    free(ids);

    // A stream that ends inside a character gives the held bytes back on flush.
    token_decoder_init(&dec);
    int lead = -1;
    encode(t, "\xf0\x9f\xa4\x96", 4, &ids, &n, &r);  // the first id holds F0 9F or part of it
    tokenizer_decode_next(t, &dec, ids[0], out, &k, &err);
    size_t flushed = token_decoder_flush(&dec, out);
    lead = ids[0];
    free(ids);
    CHECK(k == 0 && flushed > 0 && (unsigned char)out[0] == 0xF0, "tokenizer_decoder_flush",
          "id %d: %zu bytes out, %zu flushed", lead, k, flushed);

    int bad_ids[] = {-1, 50257, 1 << 30};
    int rejected = 0;
    for (int i = 0; i < 3; i++) {
        err.msg[0] = '\0';
        rejected += tokenizer_decode_next(t, &dec, bad_ids[i], out, &k, &err) == -1 && k == 0 &&
                    strstr(err.msg, "out of range");
    }
    CHECK(rejected == 3, "tokenizer_decoder_rejects_bad_ids", "%d of 3 rejected", rejected);
}

// One very long word of each kind, encoded well under a second (merging is O(n log n)) and back.
static void test_long_words(const Tokenizer *t) {
    const size_t n = 100000;
    char *s = xmalloc(4 * n);
    const char *fills[] = {"a", "abcdefghij", "0123456789", " ", "\n", "!?", "\xc3\xa9", "\xe6\x9d\xb1"};
    const char *names[] = {"a", "letters", "digits", "spaces", "newlines", "punctuation", "e-acute", "cjk"};
    uint64_t seed = 42;
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        size_t len = 0, fl = strlen(fills[f]);
        for (size_t i = 0; len + fl <= n; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            size_t pick = fl > 3 ? seed % fl : 0;  // random letters or digits, else the fill repeated
            if (fl > 3) s[len++] = fills[f][pick];
            else memcpy(s + len, fills[f], fl), len += fl;
        }
        double t0 = now_seconds();
        int *ids;
        size_t n_ids, r;
        int rc = encode(t, s, len, &ids, &n_ids, &r);
        double dt = now_seconds() - t0;
        bool chunks_ok;
        Bytes back = rc ? (Bytes){NULL, 0} : decode_all(t, ids, n_ids, &chunks_ok);
        char name[64];
        snprintf(name, sizeof name, "tokenizer_long_word_%s", names[f]);
        CHECK(!rc && dt < 1.0 * SLOWDOWN && back.len == len && !memcmp(back.bytes, s, len), name,
              "%zu bytes -> %zu ids in %.3f s", len, n_ids, dt);
        free(back.bytes);
        if (!rc) free(ids);
    }
    free(s);
}

// Embedded NULs and megabytes of text.
static void test_big_and_nul(const Tokenizer *t) {
    const char with_nul[] = "a\0b\0\0 c";
    int *ids;
    size_t n, r;
    bool chunks_ok;
    int rc = encode(t, with_nul, sizeof with_nul - 1, &ids, &n, &r);
    Bytes back = rc ? (Bytes){NULL, 0} : decode_all(t, ids, n, &chunks_ok);
    CHECK(!rc && back.len == sizeof with_nul - 1 && !memcmp(back.bytes, with_nul, back.len), "tokenizer_nul_bytes",
          "NULs lost");
    free(back.bytes);
    if (!rc) free(ids);

    const char *para = "The tokenizer reads megabytes of text; it's fast (\xe2\x89\xa5 5 MB/s) and exact. \xf0\x9f\x98\x80\n";
    size_t pl = strlen(para), len = 0, cap = 8 << 20;
    char *big = xmalloc(cap);
    while (len + pl <= cap) memcpy(big + len, para, pl), len += pl;
    double t0 = now_seconds();
    rc = encode(t, big, len, &ids, &n, &r);
    double dt = now_seconds() - t0;
    back = rc ? (Bytes){NULL, 0} : decode_all(t, ids, n, &chunks_ok);
    CHECK(!rc && back.len == len && !memcmp(back.bytes, big, len), "tokenizer_8mb_round_trip",
          "8 MB did not come back");
    printf("# 8 MB encoded in %.3f s (%.1f MB/s)\n", dt, (double)len / dt / 1e6);
    free(back.bytes);
    if (!rc) free(ids);
    free(big);
}

// The header promises that encoding only reads the Tokenizer: threads sharing one must agree
// with a single thread.
static void test_threads(const Tokenizer *t) {
    enum { N = 64 };
    static char texts[N][256];
    for (int i = 0; i < N; i++)
        snprintf(texts[i], sizeof texts[i], "Thread %d says: it's \xe6\x9d\xb1\xe4\xba\xac %d\xf0\x9f\x99\x82 %s", i,
                 i * 7919, i % 2 ? "supercalifragilistic" : "<|endoftext|>  x");
    int *serial[N], *parallel[N];
    size_t n_serial[N], n_parallel[N], r;
    for (int i = 0; i < N; i++) encode(t, texts[i], strlen(texts[i]), &serial[i], &n_serial[i], &r);
#pragma omp parallel for num_threads(4)
    for (int i = 0; i < N; i++) {
        size_t rr;
        encode(t, texts[i], strlen(texts[i]), &parallel[i], &n_parallel[i], &rr);
    }
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += !ids_equal(serial[i], n_serial[i], parallel[i], n_parallel[i]);
        free(serial[i]);
        free(parallel[i]);
    }
    CHECK(bad == 0, "tokenizer_threads", "%d of %d texts encode differently on 4 threads", bad, N);
}

int main(void) {
    Error err;
    Tokenizer *t = tokenizer_create(tokenizer_default_dir(), &err);
    if (!t) {
        CHECK(0, "tokenizer_load", "%s", err.msg);
        return test_exit_code();
    }
    test_basics(t);
    test_fixtures(t);
    test_repair();
    test_round_trip(t);
    test_decoder(t);
    test_long_words(t);
    test_big_and_nul(t);
    test_threads(t);
    tokenizer_free(t);
    return test_exit_code();
}
