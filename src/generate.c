// ./gpt2 -p "prompt": GPT-2 continues the prompt, streaming text to stdout as tokens arrive.
// The prompt runs as one batched prefill; each new token is one decode step over the KV cache.
// stdout gets the prompt's text and the continuation and nothing else; notes, the load report and
// the closing timing summary go to stderr (as ggml's gpt-2 and llama.cpp do).
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "engine.h"
#include "sampler.h"
#include "tokenizer.h"

typedef struct {
    const char *model_path, *prompt, *tokenizer_dir;
    int max_new_tokens, batch, ignore_eos, print_ids;
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    EngineOptions engine;
    int dtype;  // -1: the checkpoint's own
} GenerateArgs;

static void usage(void) {
    fprintf(stderr,
            "usage: gpt2 [options]            generate text (the default command)\n"
            "       gpt2 validate|tokenize|detokenize|bench|compare ... --help\n"
            "\n"
            "  -m, --model PATH     llm.c .bin, .safetensors, or a directory holding one (default %s)\n"
            "  -p, --prompt TEXT    the prompt; \"-\" reads it from stdin; empty: unconditional, from\n"
            "                       <|endoftext|> (default \"\")\n"
            "  -n N                 new tokens to generate (default 256; stops earlier at the context length)\n"
            "  --temp T             temperature; 0 is greedy (default 1.0)\n"
            "  --top-k K            sample from the K most likely tokens; 0: all (default 40)\n"
            "  --top-p P            then from the smallest set reaching probability P (default 0.9)\n"
            "  -s, --seed S         random seed (default: from the clock, printed on stderr)\n"
            "  -b N                 generate N continuations at once, printed one after another (default 1)\n"
            "  --ignore-eos         keep going past <|endoftext|>\n"
            "  --gpu                fused GPU kernels (the default when a GPU is usable); no GPU is an error\n"
            "  --reference          the unfused GPU reference ops (LayerNorm, cuBLAS, GELU, softmax, residual)\n"
            "  --cpu                the CPU path (the default without a GPU)\n"
            "  --dtype fp32|bf16    GPU compute type (default: the checkpoint's own)\n"
            "  --tokenizer DIR      encoder.json + vocab.bpe (default: %s)\n"
            "  --ids                print token ids (prompt, then continuation) instead of text\n"
            "  -h, --help           this text\n"
            "The text \"<|endoftext|>\" in a prompt is GPT-2's end-of-text token (id 50256).\n",
            gpt2_default_model_path(), tokenizer_default_dir());
}

static void parse_args(GenerateArgs *a, int argc, char **argv) {
    *a = (GenerateArgs){.model_path = gpt2_default_model_path(), .prompt = "", .max_new_tokens = 256, .batch = 1,
                        .temperature = 1.0f, .top_k = 40, .top_p = 0.9f, .seed = (uint64_t)time(NULL),
                        .engine = {.backend = BACKEND_AUTO}, .dtype = -1};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) usage(), exit(0);
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model_path = cli_value(argc, argv, &i);
        else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) a->prompt = cli_value(argc, argv, &i);
        else if (!strcmp(f, "-n")) a->max_new_tokens = (int)cli_int(cli_value(argc, argv, &i), f, 0, 1 << 20);
        else if (!strcmp(f, "--temp")) a->temperature = (float)cli_double(cli_value(argc, argv, &i), f, 0, 100);
        else if (!strcmp(f, "--top-k")) a->top_k = (int)cli_int(cli_value(argc, argv, &i), f, 0, 1 << 24);
        else if (!strcmp(f, "--top-p")) a->top_p = (float)cli_double(cli_value(argc, argv, &i), f, 0, 1);
        else if (!strcmp(f, "-s") || !strcmp(f, "--seed"))
            a->seed = (uint64_t)cli_int(cli_value(argc, argv, &i), f, 0, __LONG_MAX__);
        else if (!strcmp(f, "-b")) a->batch = (int)cli_int(cli_value(argc, argv, &i), f, 1, 4096);
        else if (!strcmp(f, "--ignore-eos")) a->ignore_eos = 1;
        else if (!strcmp(f, "--gpu")) a->engine.backend = BACKEND_GPU;
        else if (!strcmp(f, "--reference")) a->engine.backend = BACKEND_GPU_REFERENCE;
        else if (!strcmp(f, "--cpu")) a->engine.backend = BACKEND_CPU;
        else if (!strcmp(f, "--dtype")) a->dtype = cli_dtype(cli_value(argc, argv, &i), f);
        else if (!strcmp(f, "--tokenizer")) a->tokenizer_dir = cli_value(argc, argv, &i);
        else if (!strcmp(f, "--ids")) a->print_ids = 1;
        else cli_usage_error("unknown argument '%s'", f);
    }
}

// The whole of stdin, NUL-terminated (the prompt "-").
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, stdin)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            buf = realloc(buf, cap *= 2);
            if (!buf) die("out of host memory reading the prompt from stdin");
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// ----------------------------------------------------------------------------
// Output: text streamed through a decoder per sequence, or ids

typedef struct {
    const Tokenizer *tok;
    int print_ids;
    TokenDecoder decoder;
} Printer;

static void print_token(Printer *p, int id) {
    if (p->print_ids) {
        printf("%d ", id);
        return;
    }
    char buf[TOKEN_DECODE_MAX];
    size_t n;
    Error err;
    if (id >= tokenizer_vocab_size(p->tok)) {  // a model's id without text (warned of at start): U+FFFD
        fwrite(buf, 1, token_decoder_flush(&p->decoder, buf), stdout);
        memcpy(buf, "\xEF\xBF\xBD", n = 3);
    } else if (tokenizer_decode_next(p->tok, &p->decoder, id, buf, &n, &err)) {
        die("%s", err.msg);
    }
    fwrite(buf, 1, n, stdout);
    fflush(stdout);
}

static void print_end(Printer *p) {
    if (!p->print_ids) {
        char buf[TOKEN_DECODE_MAX];
        fwrite(buf, 1, token_decoder_flush(&p->decoder, buf), stdout);
    }
    fputc('\n', stdout);
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// Generation

// The continuations as the steps arrive: each sequence's new tokens (the one that streams printed
// as it comes), until it picks <|endoftext|> (unless ignored); the steps stop when none is live.
typedef struct {
    Printer *printer;
    int B, max_new, live, eot, ignore_eos;
    int *generated;    // [B, max_new + 1]
    int *count, *done;  // [B]
    int steps;
} Continuations;

static int take_step(void *user, const int *next) {
    Continuations *c = user;
    for (int b = 0; b < c->B; b++) {
        if (c->done[b]) continue;
        c->generated[(size_t)b * (c->max_new + 1) + c->count[b]++] = next[b];
        if (c->B == 1 && (next[b] != c->eot || c->ignore_eos)) print_token(c->printer, next[b]);
        if (next[b] == c->eot && !c->ignore_eos) c->done[b] = 1, c->live--;
    }
    c->steps++;
    return c->live == 0;
}

int cmd_generate(int argc, char **argv) {
    GenerateArgs a;
    parse_args(&a, argc, argv);
    Error err;

    if (access(a.model_path, R_OK) != 0)
        die("%s: model not found. Get GPT-2 with `make download` (Hugging Face safetensors into model/gpt2), "
            "or point -m at llm.c's gpt2_124M.bin",
            a.model_path);
    GPT2Model model;
    if (gpt2_model_load(&model, a.model_path, &err)) die("%s", err.msg);
    gpt2_model_describe(&model, stderr);
    const GPT2Config *c = &model.config;

    Tokenizer *tok = tokenizer_create(a.tokenizer_dir ? a.tokenizer_dir : tokenizer_default_dir(), &err);
    if (!tok) die("%s", err.msg);
    if (tokenizer_vocab_size(tok) > c->vocab_size)
        die("%s: the model's vocabulary (%d) is smaller than the tokenizer's (%d)", a.model_path, c->vocab_size,
            tokenizer_vocab_size(tok));
    if (tokenizer_vocab_size(tok) < c->vocab_size && !a.print_ids)  // e.g. nanoGPT's 50304
        fprintf(stderr, "gpt2: warning: %s: the model's vocabulary (%d) is larger than the tokenizer's (%d); "
                        "ids past %d have no text and print as U+FFFD (--ids prints ids)\n",
                a.model_path, c->vocab_size, tokenizer_vocab_size(tok), tokenizer_vocab_size(tok) - 1);

    // Prompt → ids; an empty prompt starts from <|endoftext|>, GPT-2's unconditional sampling.
    size_t text_len = strlen(a.prompt), n_prompt = 0, n_replaced = 0;
    char *text = NULL;
    if (!strcmp(a.prompt, "-")) text = read_stdin(&text_len);
    int *prompt_ids = NULL;
    if (tokenizer_encode(tok, text ? text : a.prompt, text_len, &prompt_ids, &n_prompt, &n_replaced, &err))
        die("%s", err.msg);
    free(text);
    if (n_replaced) fprintf(stderr, "gpt2: warning: prompt is not valid UTF-8; %zu sequences replaced by U+FFFD\n",
                            n_replaced);
    int unconditional = n_prompt == 0;
    if (unconditional) {
        prompt_ids = xmalloc(sizeof(int));
        prompt_ids[0] = tokenizer_eot(tok);
        n_prompt = 1;
    }
    int P = (int)n_prompt, maxT = c->max_seq_len;
    if (P >= maxT) die("prompt is %d tokens, but the model's context is %d: no room to generate", P, maxT);
    int n_new = a.max_new_tokens;
    int clipped = P + n_new > maxT;
    if (clipped) n_new = maxT - P;  // learned absolute positions: nothing past maxT, never a silent wrap

    a.engine.max_batch = a.batch;
    a.engine.max_seq = P + n_new;  // P >= 1: an empty prompt is <|endoftext|>
    a.engine.dtype = a.dtype < 0 ? model.dtype : (DType)a.dtype;
    Engine *engine = engine_create(&model, &a.engine, &err);
    if (!engine) die("%s", err.msg);
    fprintf(stderr, "engine: %s, %s, batch %d, context %d; seed %llu\n", engine->name, dtype_name(engine->dtype),
            a.batch, a.engine.max_seq, (unsigned long long)a.seed);

    int B = a.batch, V = c->vocab_size;
    int *tokens = xmalloc((size_t)B * P * sizeof(int));  // B copies of the prompt
    for (int b = 0; b < B; b++) memcpy(tokens + (size_t)b * P, prompt_ids, P * sizeof(int));
    float *logits = xmalloc((size_t)B * V * sizeof(float));
    Sampler sampler;
    sampler_create(&sampler, V, a.temperature, a.top_k, a.top_p, a.seed);

    // With one sequence the text streams; with several each is printed whole once finished.
    Printer printer = {.tok = tok, .print_ids = a.print_ids};
    token_decoder_init(&printer.decoder);
    if (B == 1)
        for (int i = unconditional ? 1 : 0; i < P; i++) print_token(&printer, prompt_ids[i]);

    // The prefill gives the first new token; each decode step feeds the last one at the next position.
    Continuations out = {.printer = &printer, .B = B, .max_new = n_new, .live = B, .eot = tokenizer_eot(tok),
                         .ignore_eos = a.ignore_eos, .generated = xmalloc((size_t)B * (n_new + 1) * sizeof(int)),
                         .count = xcalloc(B, sizeof(int)), .done = xcalloc(B, sizeof(int))};
    int *first = xmalloc(B * sizeof(int)), *next = xmalloc(B * sizeof(int));
    double t0 = now_ms();
    if (n_new > 0 && engine_decode(engine, tokens, B, P, 0, &sampler, logits, first, &err)) die("%s", err.msg);
    double t_prefill = now_ms() - t0;
    if (n_new > 0 && !take_step(&out, first) &&
        engine_decode_steps(engine, first, B, P, n_new - 1, &sampler, logits, next, take_step, &out, &err))
        die("%s", err.msg);
    double t_total = now_ms() - t0;
    if (B == 1) {
        print_end(&printer);
    } else {
        for (int b = 0; b < B; b++) {
            fprintf(stderr, "--- sequence %d of %d ---\n", b + 1, B);
            fflush(stderr);
            token_decoder_init(&printer.decoder);
            for (int i = unconditional ? 1 : 0; i < P; i++) print_token(&printer, prompt_ids[i]);
            for (int i = 0; i < out.count[b]; i++) {
                int id = out.generated[(size_t)b * (n_new + 1) + i];
                if (id != out.eot || a.ignore_eos) print_token(&printer, id);
            }
            print_end(&printer);
        }
    }

    if (clipped && out.live > 0)
        fprintf(stderr, "gpt2: stopped at the model's context length of %d tokens\n", maxT);
    double decode_ms = t_total - t_prefill;
    int steps = out.steps, decode_steps = steps > 1 ? steps - 1 : 0;  // the first token comes from the prefill
    fprintf(stderr, "prompt: %d tokens, prefill %.2f ms\n", P, t_prefill);
    fprintf(stderr, "decode: %d steps x %d sequences in %.2f ms, %.1f tokens/s\n", decode_steps, B, decode_ms,
            decode_ms > 0 ? decode_steps * B * 1e3 / decode_ms : 0.0);
    int n_generated = 0;  // each sequence's own, <|endoftext|> included; not the steps after it ended
    for (int b = 0; b < B; b++) n_generated += out.count[b];
    fprintf(stderr, "total: %d new tokens in %.2f ms\n", n_generated, t_total);

    sampler_free(&sampler);
    free(first), free(next), free(logits), free(out.count), free(out.done), free(out.generated), free(tokens);
    free(prompt_ids);
    engine_free(engine);
    tokenizer_free(tok);
    gpt2_model_free(&model);
    return 0;
}
