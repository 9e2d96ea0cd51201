// ./gpt2 tokenize and ./gpt2 detokenize: the tokenizer on its own, for scripts and for checking
// it against other implementations; `tokenize --bench` times it.
#include <errno.h>
#include <time.h>

#include "cli.h"
#include "commands.h"
#include "tokenizer.h"

// ----------------------------------------------------------------------------
// Input

// All of a file ("-" is standard input), NUL bytes included, with a NUL after the end; NULL with
// errno set on failure.
static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = xmalloc(cap);
    errno = 0;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n == cap - 1) {
            buf = realloc(buf, cap *= 2);
            if (!buf) die("out of host memory reading %s", path);
        }
    }
    const int bad = ferror(f), e = errno;  // fread's own reason (EISDIR for a directory), else EIO
    if (f != stdin) fclose(f);
    if (bad) {
        free(buf);
        errno = e ? e : EIO;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static Tokenizer *load(const char *verb, const char *dir) {
    Error err;
    Tokenizer *t = tokenizer_create(dir ? dir : tokenizer_default_dir(), &err);
    if (!t) die("%s: %s", verb, err.msg);
    return t;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// tokenize

static void tokenize_usage(void) {
    printf("usage: gpt2 tokenize [-t DIR] [TEXT | -f FILE]\n"
           "       gpt2 tokenize [-t DIR] --bench FILE\n"
           "\n"
           "Prints the GPT-2 token ids of TEXT, separated by single spaces, then a newline.\n"
           "With -f the text is FILE's bytes; with neither TEXT nor -f (or FILE '-') it is standard input.\n"
           "The literal <|endoftext|> becomes the special token 50256, as Hugging Face's tokenizer does.\n"
           "Invalid UTF-8 is replaced by U+FFFD as Python's bytes.decode(errors=\"replace\") does,\n"
           "with one warning on stderr. Empty input prints an empty line.\n"
           "\n"
           "  -f FILE       tokenize FILE (- for standard input)\n"
           "  -t DIR        tokenizer directory holding encoder.json and vocab.bpe\n"
           "                (default: $GPT2_TOKENIZER, else ./tokenizer, else tokenizer/ beside the binary)\n"
           "  --bench FILE  instead of printing ids, time loading the tokenizer and encoding FILE\n"
           "                (one thread; repeated for at least a second) and print load ms and MB/s\n"
           "  -h, --help    this text\n");
}

static void bench(const char *dir, const char *path) {
    double t0 = now_seconds();
    Tokenizer *t = load("tokenize", dir);
    double load_ms = 1e3 * (now_seconds() - t0);
    size_t len;
    char *text = read_all(path, &len);
    if (!text) die("tokenize: %s: %s", path, strerror(errno));
    Error err;
    int *ids;
    size_t n_ids = 0, n_replaced, runs = 0;
    double best = 1e30, total = 0;
    while (total < 1.0 || runs < 3) {
        double s = now_seconds();
        if (tokenizer_encode(t, text, len, &ids, &n_ids, &n_replaced, &err)) die("tokenize: %s", err.msg);
        double dt = now_seconds() - s;
        free(ids);
        if (dt < best) best = dt;
        total += dt;
        runs++;
    }
    printf("load: %.1f ms\n", load_ms);
    printf("encode: %s, %zu bytes -> %zu tokens, best of %zu runs %.1f ms: %.2f MB/s\n", path, len, n_ids, runs,
           1e3 * best, (double)len / best / 1e6);
    free(text);
    tokenizer_free(t);
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *bench_file = NULL, *text = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage();
            return 0;
        } else if (!strcmp(a, "-f")) {
            file = cli_value(argc, argv, &i);
        } else if (!strcmp(a, "-t")) {
            dir = cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--bench")) {
            bench_file = cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--") && i + 1 < argc && !text) {
            text = argv[++i];  // a text that starts with '-'
        } else if (a[0] == '-' && a[1]) {
            cli_usage_error("tokenize: unknown option %s", a);
        } else if (!text) {
            text = a;
        } else {
            cli_usage_error("tokenize: one TEXT only (quote it)");
        }
        if (text && (file || bench_file)) cli_usage_error("tokenize: give TEXT or -f FILE or --bench FILE, not two");
    }
    if (file && bench_file) cli_usage_error("tokenize: give TEXT or -f FILE or --bench FILE, not two");
    if (bench_file) {
        bench(dir, bench_file);
        return 0;
    }

    Tokenizer *t = load("tokenize", dir);
    size_t len;
    char *owned = NULL;
    if (text) {
        len = strlen(text);
    } else {
        const char *path = file ? file : "-";
        owned = read_all(path, &len);
        if (!owned) die("tokenize: %s: %s", strcmp(path, "-") ? path : "standard input", strerror(errno));
        text = owned;
    }
    Error err;
    int *ids;
    size_t n_ids, n_replaced;
    if (tokenizer_encode(t, text, len, &ids, &n_ids, &n_replaced, &err)) die("tokenize: %s", err.msg);
    if (n_replaced)
        fprintf(stderr, "gpt2: tokenize: warning: the input is not valid UTF-8; %zu invalid sequence%s replaced by U+FFFD\n",
                n_replaced, n_replaced == 1 ? "" : "s");
    for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    free(owned);
    tokenizer_free(t);
    return fflush(stdout) == 0 ? 0 : 1;
}

// ----------------------------------------------------------------------------
// detokenize

static void detokenize_usage(void) {
    printf("usage: gpt2 detokenize [-t DIR] [ID... | -f FILE]\n"
           "\n"
           "Writes the bytes of the GPT-2 token ids, exactly (no newline is added). The ids come from the\n"
           "arguments, or whitespace-separated from FILE, or from standard input when neither is given.\n"
           "An id that is not a number in 0..50256 is an error.\n"
           "\n"
           "  -f FILE     read the ids from FILE (- for standard input)\n"
           "  -t DIR      tokenizer directory (as for tokenize)\n"
           "  -h, --help  this text\n");
}

// One id given as text; anything but a number in the vocabulary ends the program.
static int parse_id(const Tokenizer *t, const char *word) {
    char *end;
    errno = 0;
    long id = strtol(word, &end, 10);
    if (end == word || *end) die("detokenize: '%s' is not a token id", word);
    if (errno || id < 0 || id >= tokenizer_vocab_size(t))
        die("detokenize: token id %s is out of range (the vocabulary has ids 0 to %d)", word,
            tokenizer_vocab_size(t) - 1);
    return (int)id;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    int first_id = argc;
    for (int i = 1; i < argc && first_id == argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            detokenize_usage();
            return 0;
        } else if (!strcmp(a, "-f")) {
            file = cli_value(argc, argv, &i);
        } else if (!strcmp(a, "-t")) {
            dir = cli_value(argc, argv, &i);
        } else if (a[0] == '-' && !(a[1] >= '0' && a[1] <= '9')) {
            cli_usage_error("detokenize: unknown option %s", a);
        } else {
            first_id = i;  // negative numbers land here too, to be refused as out of range
        }
    }
    if (file && first_id < argc) cli_usage_error("detokenize: give IDs or -f FILE, not both");

    // All ids are checked before any byte is written, so a bad one leaves no partial output.
    Tokenizer *t = load("detokenize", dir);
    int *ids = xmalloc((size_t)argc * sizeof(int));
    size_t n = 0;
    char *text = NULL;
    if (first_id < argc) {
        for (int i = first_id; i < argc; i++) ids[n++] = parse_id(t, argv[i]);
    } else {
        const char *path = file ? file : "-";
        size_t len;
        text = read_all(path, &len);
        if (!text) die("detokenize: %s: %s", strcmp(path, "-") ? path : "standard input", strerror(errno));
        if (memchr(text, '\0', len)) die("detokenize: %s holds a NUL byte, not token ids", path);
        // Every id takes at least two bytes of text (a digit and a separator) but the last.
        ids = realloc(ids, (len / 2 + 1) * sizeof(int));
        if (!ids) die("out of host memory for %zu token ids", len / 2 + 1);
        for (char *save, *w = strtok_r(text, " \t\r\n\v\f", &save); w; w = strtok_r(NULL, " \t\r\n\v\f", &save))
            ids[n++] = parse_id(t, w);
    }
    TokenDecoder dec;
    token_decoder_init(&dec);
    char buf[TOKEN_DECODE_MAX];
    Error err;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (tokenizer_decode_next(t, &dec, ids[i], buf, &k, &err)) die("detokenize: %s", err.msg);
        fwrite(buf, 1, k, stdout);
    }
    fwrite(buf, 1, token_decoder_flush(&dec, buf), stdout);
    free(ids);
    free(text);
    tokenizer_free(t);
    return fflush(stdout) == 0 ? 0 : 1;
}
