// GPT-2's byte-level BPE. Encoding runs in three steps, as in OpenAI's encoder.py:
//   1. split the text into pieces with GPT-2's pre-tokenizer pattern (PCRE2, Unicode classes),
//   2. look each piece up whole in the vocabulary (most words are one token),
//   3. otherwise start from the piece's bytes and apply merges lowest rank first.
// Tokens are kept as raw bytes: GPT-2's files spell bytes as printable characters (the
// "byte-to-unicode" map), which only matters while loading them.
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define STB_DS_IMPLEMENTATION
#include <stb/stb_ds.h>

#include "utf8.h"

// ----------------------------------------------------------------------------
// The tokenizer

typedef struct {
    int rank;  // line of vocab.bpe: lower merges first
    int id;    // the token the pair becomes
} Merge;

typedef struct {
    char *key;  // a token's raw bytes, NUL-terminated (only the one-byte token 0x00 holds a NUL)
    int value;  // its id
} PieceEntry;

typedef struct {
    uint64_t key;  // left id << 32 | right id
    Merge value;
} MergeEntry;

struct Tokenizer {
    int vocab_size;
    int eot;
    int max_token_len;
    // Decoding: token id → its bytes, all laid end to end (each followed by a NUL) in one block.
    char *bytes;
    int *start, *len;
    // Encoding.
    int byte_token[256];   // the token of each single byte
    PieceEntry *pieces;    // stb_ds string map: whole-piece lookup
    MergeEntry *merges;    // stb_ds hash map: the merge rules
    pcre2_code *pattern;
    bool jit;
};

static const char EOT_TEXT[] = "<|endoftext|>";

// GPT-2's pre-tokenizer, with \s spelled out as Unicode's White_Space property: that is what
// OpenAI's Python `regex` and tiktoken's Rust regex mean by \s, while PCRE2's \s also takes
// U+180E. Contractions are case-sensitive, as in the original ('S is two pieces).
#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+"
                              "|[" WS "]+(?![^" WS "])|[" WS "]+";

int tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }
int tokenizer_eot(const Tokenizer *t) { return t->eot; }

// ----------------------------------------------------------------------------
// Loading

// GPT-2 shows byte b as itself when it is printable Latin-1 and otherwise as U+0100 + (its rank
// among the unprintable bytes): the 256 code points below 324 that spell a byte, -1 elsewhere.
static void byte_alphabet(int byte_of[324]) {
    for (int i = 0; i < 324; i++) byte_of[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_of[printable ? b : 256 + n++] = b;
    }
}

// The raw bytes a string of encoder.json or vocab.bpe stands for, written into out (at least
// n + 1 bytes, NUL-terminated). Returns their number, or -1 when s is not in the alphabet.
static int spelled_bytes(const int byte_of[324], const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    int o = 0;
    for (size_t i = 0; i < n;) {
        size_t subpart;
        bool at_end;
        size_t k = utf8_char(u + i, n - i, &subpart, &at_end);
        if (k == 0 || k > 2) return -1;  // the alphabet stops at U+0143: one or two bytes
        uint32_t cp = k == 1 ? u[i] : ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F);
        if (cp >= 324 || byte_of[cp] < 0) return -1;
        out[o++] = (char)byte_of[cp];
        i += k;
    }
    out[o] = '\0';
    return o;
}

static char *read_file(const char *path, size_t *len, Error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) buf = realloc(buf, cap *= 2);
        if (!buf) die("out of host memory reading %s", path);
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fail(err, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

// Map lookups through stb_ds's "_ts" entry point, which returns the slot in a local instead of the
// map's header: the maps are only read once loaded, so encoding from several threads is safe.
static int find_piece(PieceEntry *pieces, const char *bytes) {
    ptrdiff_t i;
    stbds_hmget_key_ts(pieces, sizeof *pieces, (void *)bytes, sizeof pieces->key, &i, STBDS_HM_STRING);
    return i < 0 ? -1 : pieces[i].value;
}

static const Merge *find_merge(MergeEntry *merges, int left, int right) {
    uint64_t key = (uint64_t)left << 32 | (uint32_t)right;
    ptrdiff_t i;
    stbds_hmget_key_ts(merges, sizeof *merges, &key, sizeof key, &i, STBDS_HM_BINARY);
    return i < 0 ? NULL : &merges[i].value;
}

// The id of a token given by its raw bytes (NUL-terminated unless one byte), or -1.
static int lookup_piece(const Tokenizer *t, const char *bytes, int n) {
    return n == 1 ? t->byte_token[(unsigned char)bytes[0]] : find_piece(t->pieces, bytes);
}

static int load_vocabulary(Tokenizer *t, const int byte_of[324], const char *path, Error *err) {
    size_t len;
    char *text = read_file(path, &len, err);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(err, "%s: not a JSON object of token -> id", path);
    }
    int n = cJSON_GetArraySize(root);
    size_t blob = 0;
    for (cJSON *e = root->child; e; e = e->next) blob += strlen(e->string) + 1;
    t->vocab_size = n;
    t->bytes = xmalloc(blob);
    t->start = xmalloc((size_t)n * sizeof(int));
    t->len = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) t->start[i] = -1;
    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    t->eot = -1;

    int rc = 0;
    size_t o = 0;
    for (cJSON *e = root->child; e; e = e->next) {
        int id = cJSON_IsNumber(e) ? e->valueint : -1;
        if (id < 0 || id >= n || (double)id != e->valuedouble || t->start[id] >= 0) {
            rc = fail(err, "%s: token \"%s\" has a bad or repeated id", path, e->string);
            break;
        }
        int k = spelled_bytes(byte_of, e->string, strlen(e->string), t->bytes + o);
        if (k <= 0 || k > TOKEN_DECODE_MAX - 3) {
            rc = fail(err, "%s: token \"%s\" is not in GPT-2's byte alphabet", path, e->string);
            break;
        }
        t->start[id] = (int)o;
        t->len[id] = k;
        if (k > t->max_token_len) t->max_token_len = k;
        if (strcmp(e->string, EOT_TEXT) == 0) t->eot = id;
        else if (k == 1) t->byte_token[(unsigned char)t->bytes[o]] = id;
        else shput(t->pieces, t->bytes + o, id);
        o += (size_t)k + 1;
    }
    cJSON_Delete(root);
    if (rc) return rc;
    // The single bytes go into the string map too, except NUL, which a C string key cannot hold.
    for (int b = 1; b < 256; b++)
        if (t->byte_token[b] >= 0) shput(t->pieces, t->bytes + t->start[t->byte_token[b]], t->byte_token[b]);
    for (int b = 0; b < 256; b++)
        if (t->byte_token[b] < 0) return fail(err, "%s: no token for byte 0x%02x", path, b);
    if (t->eot < 0) return fail(err, "%s: no %s token", path, EOT_TEXT);
    return 0;
}

static int load_merges(Tokenizer *t, const int byte_of[324], const char *path, Error *err) {
    size_t len;
    char *text = read_file(path, &len, err);
    if (!text) return -1;
    char *pair = xmalloc(2 * len + 2);  // both sides' raw bytes, side by side
    int rc = 0, rank = 0, line_no = 0;
    for (char *line = text, *end; *line; line = end + (*end == '\n')) {
        end = line + strcspn(line, "\n");
        line_no++;
        if (end == line || (line_no == 1 && strncmp(line, "#version", 8) == 0)) continue;
        char *space = memchr(line, ' ', (size_t)(end - line));
        int a = space ? spelled_bytes(byte_of, line, (size_t)(space - line), pair) : -1;
        int b = a > 0 ? spelled_bytes(byte_of, space + 1, (size_t)(end - space - 1), pair + a + 1) : -1;
        if (a <= 0 || b <= 0) {
            rc = fail(err, "%s:%d: not a pair of tokens", path, line_no);
            break;
        }
        int left = lookup_piece(t, pair, a);
        int right = lookup_piece(t, pair + a + 1, b);
        memmove(pair + a, pair + a + 1, (size_t)b + 1);
        int merged = lookup_piece(t, pair, a + b);
        if (left < 0 || right < 0 || merged < 0) {
            rc = fail(err, "%s:%d: merge of tokens missing from encoder.json", path, line_no);
            break;
        }
        // The first rule for a pair wins, as in OpenAI's dict of ranks; GPT-2's file repeats none.
        if (!t->merges || !find_merge(t->merges, left, right)) {
            MergeEntry e = {(uint64_t)left << 32 | (uint32_t)right, {rank, merged}};
            hmputs(t->merges, e);
        }
        rank++;
    }
    free(pair);
    free(text);
    if (!rc && rank == 0) rc = fail(err, "%s: no merges", path);
    return rc;
}

Tokenizer *tokenizer_create(const char *dir, Error *err) {
    Tokenizer *t = xcalloc(1, sizeof *t);
    size_t n = strlen(dir) + 32;
    char *path = xmalloc(n);
    int byte_of[324];
    byte_alphabet(byte_of);
    snprintf(path, n, "%s/encoder.json", dir);
    int rc = load_vocabulary(t, byte_of, path, err);
    if (!rc) {
        snprintf(path, n, "%s/vocab.bpe", dir);
        rc = load_merges(t, byte_of, path, err);
    }
    free(path);
    if (!rc) {
        int code;
        PCRE2_SIZE at;
        t->pattern = pcre2_compile((PCRE2_SPTR)PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code,
                                   &at, NULL);
        if (!t->pattern) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            rc = fail(err, "tokenizer: pre-tokenizer pattern, offset %zu: %s", (size_t)at, (char *)msg);
        } else {
            // Without the JIT (a PCRE2 built without it) matching is slower but the same.
            t->jit = pcre2_jit_compile(t->pattern, PCRE2_JIT_COMPLETE) == 0;
        }
    }
    if (rc) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    pcre2_code_free(t->pattern);
    hmfree(t->merges);
    shfree(t->pieces);
    free(t->bytes);
    free(t->start);
    free(t->len);
    free(t);
}

const char *tokenizer_default_dir(void) {
    const char *env = getenv("GPT2_TOKENIZER");
    if (env && *env) return env;
    if (access("tokenizer/encoder.json", R_OK) == 0) return "tokenizer";
    static char dir[4096];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - sizeof "tokenizer");
    char *slash = n > 0 ? memrchr(dir, '/', (size_t)n) : NULL;
    if (!slash) return "tokenizer";
    strcpy(slash + 1, "tokenizer");
    return dir;
}

// ----------------------------------------------------------------------------
// BPE on one piece
//
// The piece starts as a linked list of one-byte symbols; every adjacent pair that has a merge
// rule is a candidate in a min-heap ordered by (rank, position), which is the order OpenAI's
// loop merges in. A merge rewrites the left symbol, unlinks the right one and pushes the two new
// pairs around it; candidates made stale by earlier merges are recognised when popped, by their
// symbols' ids no longer matching. O(n log n), where rescanning for the best pair is O(n²).

typedef struct {
    int rank, pos;  // heap order
    int left, right, merged;
} Candidate;

typedef struct {
    int *id, *prev, *next;  // the symbol list, indexed by the byte each symbol starts at
    Candidate *heap;
    size_t cap, heap_len;
    char key[TOKEN_DECODE_MAX];  // a piece as a NUL-terminated string map key
} Scratch;

typedef struct {
    int *ids;
    size_t n, cap;
} IdList;

static void push_id(IdList *l, int id) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->ids = realloc(l->ids, l->cap * sizeof(int));
        if (!l->ids) die("out of host memory for %zu token ids", l->cap);
    }
    l->ids[l->n++] = id;
}

static bool before(const Candidate *a, const Candidate *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(Scratch *s, Candidate c) {
    size_t i = s->heap_len++;
    while (i > 0 && before(&c, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static Candidate heap_pop(Scratch *s) {
    Candidate top = s->heap[0], last = s->heap[--s->heap_len];
    size_t i = 0, n = s->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static void push_pair(const Tokenizer *t, Scratch *s, int pos) {
    if (pos < 0 || s->next[pos] < 0) return;
    int right = s->next[pos];
    const Merge *m = find_merge(t->merges, s->id[pos], s->id[right]);
    if (m) heap_push(s, (Candidate){m->rank, pos, s->id[pos], s->id[right], m->id});
}

static void bpe(const Tokenizer *t, Scratch *s, const unsigned char *p, size_t n, IdList *out) {
    if (n > s->cap) {
        s->cap = n;
        s->id = realloc(s->id, n * sizeof(int));
        s->prev = realloc(s->prev, n * sizeof(int));
        s->next = realloc(s->next, n * sizeof(int));
        // n - 1 pairs at the start and at most two more per merge, of which there are n - 1.
        s->heap = realloc(s->heap, 3 * n * sizeof(Candidate));
        if (!s->id || !s->prev || !s->next || !s->heap) die("out of host memory for a %zu-byte word", n);
    }
    for (size_t i = 0; i < n; i++) {
        s->id[i] = t->byte_token[p[i]];
        s->prev[i] = (int)i - 1;
        s->next[i] = i + 1 < n ? (int)i + 1 : -1;
    }
    s->heap_len = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, s, (int)i);
    while (s->heap_len) {
        Candidate c = heap_pop(s);
        int right = s->next[c.pos];
        if (s->id[c.pos] != c.left || right < 0 || s->id[right] != c.right) continue;  // stale
        s->id[c.pos] = c.merged;
        s->id[right] = -1;
        s->next[c.pos] = s->next[right];
        if (s->next[right] >= 0) s->prev[s->next[right]] = c.pos;
        push_pair(t, s, s->prev[c.pos]);
        push_pair(t, s, c.pos);
    }
    for (int i = 0; i >= 0; i = s->next[i]) push_id(out, s->id[i]);
}

// ----------------------------------------------------------------------------
// Encoding

static void encode_piece(const Tokenizer *t, Scratch *s, const unsigned char *p, size_t n, IdList *out) {
    if (n == 1) {
        push_id(out, t->byte_token[p[0]]);
        return;
    }
    // Whole-piece lookup first: it settles most words without running the merges.
    if (n <= (size_t)t->max_token_len && !memchr(p, 0, n)) {
        memcpy(s->key, p, n);
        s->key[n] = '\0';
        int id = find_piece(t->pieces, s->key);
        if (id >= 0) {
            push_id(out, id);
            return;
        }
    }
    bpe(t, s, p, n, out);
}

// Text between two <|endoftext|>: cut into pieces by the pattern, each piece encoded alone.
static int encode_segment(const Tokenizer *t, Scratch *s, pcre2_match_data *md, const char *text, size_t n,
                          IdList *out, Error *err) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    for (size_t at = 0; at < n;) {
        // The text was validated once in tokenizer_encode; PCRE2 would otherwise check all of it
        // again on every call, which is quadratic.
        int rc = t->jit ? pcre2_jit_match(t->pattern, (PCRE2_SPTR)text, n, at, PCRE2_NO_UTF_CHECK, md, NULL)
                        : pcre2_match(t->pattern, (PCRE2_SPTR)text, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fail(err, "tokenizer: pre-tokenizer failed at byte %zu: %s", at, (char *)msg);
        }
        encode_piece(t, s, (const unsigned char *)text + ov[0], ov[1] - ov[0], out);
        at = ov[1];
    }
    return 0;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids, size_t *n_ids,
                     size_t *n_replaced, Error *err) {
    *ids = NULL;
    *n_ids = 0;
    char *repaired;
    size_t replaced = utf8_repair(text, len, &repaired, &len);
    if (n_replaced) *n_replaced = replaced;
    if (repaired) text = repaired;
    if (len == 0) return 0;

    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->pattern, NULL);
    if (!md) die("out of host memory for PCRE2 match data");
    Scratch s = {0};
    IdList out = {0};
    int rc = 0;
    // <|endoftext|> is found before the pattern runs, so it is never split into ordinary pieces.
    const size_t eot_len = sizeof EOT_TEXT - 1;
    for (const char *p = text, *end = text + len; !rc && p < end;) {
        const char *eot = memmem(p, (size_t)(end - p), EOT_TEXT, eot_len);
        const char *stop = eot ? eot : end;
        rc = encode_segment(t, &s, md, p, (size_t)(stop - p), &out, err);
        if (eot) push_id(&out, t->eot);
        p = eot ? eot + eot_len : end;
    }
    pcre2_match_data_free(md);
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.heap);
    free(repaired);
    if (rc) {
        free(out.ids);
        return -1;
    }
    *ids = out.ids;
    *n_ids = out.n;
    return 0;
}

// ----------------------------------------------------------------------------
// Decoding

void token_decoder_init(TokenDecoder *dec) { dec->n_held = 0; }

int tokenizer_decode_next(const Tokenizer *t, TokenDecoder *dec, int id, char *out, size_t *out_len,
                          Error *err) {
    *out_len = 0;
    if (id < 0 || id >= t->vocab_size)
        return fail(err, "token id %d is out of range (the vocabulary has ids 0 to %d)", id, t->vocab_size - 1);
    size_t n = dec->n_held;
    memcpy(out, dec->held, n);
    memcpy(out + n, t->bytes + t->start[id], (size_t)t->len[id]);
    n += (size_t)t->len[id];
    size_t tail = utf8_incomplete_tail((const unsigned char *)out, n);
    memcpy(dec->held, out + n - tail, tail);
    dec->n_held = tail;
    *out_len = n - tail;
    return 0;
}

size_t token_decoder_flush(TokenDecoder *dec, char *out) {
    size_t n = dec->n_held;
    memcpy(out, dec->held, n);
    dec->n_held = 0;
    return n;
}
