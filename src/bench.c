// ./gpt2 bench: tokens per second a user can trust, with what they need to read them.
//
// For each path (fused, reference; the CPU with --cpu) and each dtype the model allows (an fp32
// model: fp32 and bf16; a bf16 one: bf16), through the Engine API that generation uses:
//   prefill   time to first token of one sequence, prompt lengths 16, 128, 512, 1024: the prompt's
//             forward and the pick of the next token, as generation runs them (on the GPU the pick
//             is made on the device and only its id comes back); greedy, or --temp/--top-k/--top-p
//             as generation takes them
//   forward   8 x 1024 tokens with every position's logits (what validate and scoring need); on
//             the GPU the logits stay on the device (1.65 GB of fp32 would otherwise time a host
//             copy, not the engine), as PyTorch's figures are taken
//   decode    tokens/s at batch 1, 8, 32, 64: 256 new tokens after a 16-token prompt
// (prefill and forward repeat one shape: on the GPU the timed runs replay the CUDA graph the engine
// captured at the shape's second forward, kernels/gpu_engine.cu; GPT2_FORWARD_GRAPH=0 times them
// eagerly, as the first forward of a new prompt length runs)
// and on the GPU the device's copy bandwidth, each decode figure as a % of the memory roofline
// (the bytes a step must read, weights + KV cache, over that bandwidth), and a per-op breakdown
// of one decode step and one 1024-token prefill.
//
// Honest by construction: every engine is checked before it is timed (its logits against the first
// engine's, the reference fp32 on the GPU, and its cached decode step against a full forward);
// each figure is the median of --runs timed runs after untimed warm-up runs; times are CUDA events
// around the work (the CPU: the monotonic clock). A decode step is generation's own
// (engine_decode, greedy unless --temp says otherwise): B tokens through the model over the KV cache
// and the next B tokens back, sampled on the device where the engine can, else from logits brought
// to the host.
//
// Without -m the model is a random one of --size (GPT-2's initialisation, normal(0, 0.02), seeded),
// built in memory, so the bench runs on any GPU at once.
#include <errno.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "engine.h"
#include "sampler.h"
#ifdef GPT2_CUDA
#include "bench_gpu.h"
#include "gpu_engine.h"
#endif

enum { MAX_LIST = 16, NUM_PATHS = 3 };
typedef enum { PATH_FUSED, PATH_REFERENCE, PATH_CPU } BenchPath;
static const char *const path_names[NUM_PATHS] = {"fused", "reference", "cpu"};

typedef struct {
    const char *model_path, *size, *json_path, *commit;
    int quick, cpu, kernels, profile, forward;
    int paths;   // bit per BenchPath
    int dtypes;  // bit per DType; 0: every dtype the model allows
    int runs, warmup, new_tokens;
    int depth;  // decode: the prompt before the timed steps (--depth)
    float temperature, top_p;  // the sampler of the timed picks (generation's flags): 0 greedy
    int top_k;
    int prompts[MAX_LIST], nprompts;
    int batches[MAX_LIST], nbatches;
    int forward_B, forward_T;
    uint64_t seed;
} BenchArgs;

static void usage(void) {
    fprintf(stderr,
            "usage: gpt2 bench [options]     prefill, full-forward and decode speed of every path and dtype\n"
            "\n"
            "  -m, --model PATH     benchmark this checkpoint (default: random weights of --size, built in memory)\n"
            "  --size S             124M | 355M | 774M | 1558M | tiny (L2 C64: tests) (default 124M)\n"
            "  --json FILE          write every figure as JSON (schema: docs/PERF.md, ## Bench)\n"
            "  --quick              a first look: 3 runs after 1 warm-up, 64 new tokens, batches 1,8,64\n"
            "  --cpu                time the CPU path (default: the GPU's fused and reference paths)\n"
            "  --path P             fused | reference | both (GPU; default both)\n"
            "  --dtype D            fp32 | bf16 | both (default: every dtype the model allows)\n"
            "  --runs N             timed runs per figure; the median is reported (default 5)\n"
            "  --warmup N           untimed runs before them (default 2; decode 1)\n"
            "  --new N              decode: new tokens per run (default 256)\n"
            "  --depth N            decode: time the steps that follow an N-token prompt (default 16)\n"
            "  --batches LIST       decode batch sizes (default 1,8,32,64)\n"
            "  --prompts LIST       prefill prompt lengths (default 16,128,512,1024)\n"
            "  --temp T             time sampling at temperature T (0: greedy, the default)\n"
            "  --top-k K            with --temp: the K most likely tokens; 0: all (default 0)\n"
            "  --top-p P            with --temp: the smallest set reaching probability P (default 1)\n"
            "  --no-forward         skip the 8 x 1024 full forward\n"
            "  --no-profile         skip the per-op breakdown (GPU)\n"
            "  --kernels            instead: the fused kernels against the unfused ops they replace\n"
            "  --commit STR         the commit named in the JSON (default: git rev-parse --short HEAD)\n"
            "  -s, --seed S         random weights' seed (default 1)\n"
            "  -h, --help           this text\n"
            "stdout gets the table; stderr a progress line. Exit status 1 if an engine fails its check.\n");
}

// "1,8,32" -> list; every entry in lo..hi.
static int parse_list(const char *s, const char *flag, int *out, int lo, int hi) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAX_LIST) cli_usage_error("%s: at most %d values", flag, MAX_LIST);
        out[n++] = (int)cli_int(tok, flag, lo, hi);
    }
    if (n == 0) cli_usage_error("%s: '%s' is not a comma-separated list", flag, s);
    return n;
}

static void parse_args(BenchArgs *a, int argc, char **argv) {
    *a = (BenchArgs){.size = "124M", .profile = 1, .forward = 1, .runs = -1, .warmup = -1, .new_tokens = -1,
                     .depth = 16, .forward_B = 8, .forward_T = 1024, .seed = 1, .top_p = 1.0f,
                     .paths = 1 << PATH_FUSED | 1 << PATH_REFERENCE, .nprompts = -1, .nbatches = -1};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) usage(), exit(0);
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model_path = cli_value(argc, argv, &i);
        else if (!strcmp(f, "--size")) a->size = cli_value(argc, argv, &i);
        else if (!strcmp(f, "--json")) a->json_path = cli_value(argc, argv, &i);
        else if (!strcmp(f, "--quick")) a->quick = 1;
        else if (!strcmp(f, "--cpu")) a->cpu = 1;
        else if (!strcmp(f, "--kernels")) a->kernels = 1;
        else if (!strcmp(f, "--no-forward")) a->forward = 0;
        else if (!strcmp(f, "--no-profile")) a->profile = 0;
        else if (!strcmp(f, "--commit")) a->commit = cli_value(argc, argv, &i);
        else if (!strcmp(f, "-s") || !strcmp(f, "--seed"))
            a->seed = (uint64_t)cli_int(cli_value(argc, argv, &i), f, 0, __LONG_MAX__);
        else if (!strcmp(f, "--runs")) a->runs = (int)cli_int(cli_value(argc, argv, &i), f, 1, 1000);
        else if (!strcmp(f, "--warmup")) a->warmup = (int)cli_int(cli_value(argc, argv, &i), f, 0, 1000);
        else if (!strcmp(f, "--temp")) a->temperature = (float)cli_double(cli_value(argc, argv, &i), f, 0, 100);
        else if (!strcmp(f, "--top-k")) a->top_k = (int)cli_int(cli_value(argc, argv, &i), f, 0, 1 << 24);
        else if (!strcmp(f, "--top-p")) a->top_p = (float)cli_double(cli_value(argc, argv, &i), f, 0, 1);
        else if (!strcmp(f, "--new")) a->new_tokens = (int)cli_int(cli_value(argc, argv, &i), f, 1, 1 << 20);
        else if (!strcmp(f, "--depth")) a->depth = (int)cli_int(cli_value(argc, argv, &i), f, 1, 1 << 20);
        else if (!strcmp(f, "--batches")) a->nbatches = parse_list(cli_value(argc, argv, &i), f, a->batches, 1, 4096);
        else if (!strcmp(f, "--prompts")) a->nprompts = parse_list(cli_value(argc, argv, &i), f, a->prompts, 1, 1 << 20);
        else if (!strcmp(f, "--path")) {
            const char *v = cli_value(argc, argv, &i);
            if (!strcmp(v, "fused")) a->paths = 1 << PATH_FUSED;
            else if (!strcmp(v, "reference")) a->paths = 1 << PATH_REFERENCE;
            else if (!strcmp(v, "both")) a->paths = 1 << PATH_FUSED | 1 << PATH_REFERENCE;
            else cli_usage_error("--path: '%s' is not fused, reference or both", v);
        } else if (!strcmp(f, "--dtype")) {
            const char *v = cli_value(argc, argv, &i);
            a->dtypes = !strcmp(v, "both") ? 1 << DTYPE_F32 | 1 << DTYPE_BF16 : 1 << cli_dtype(v, f);
        } else cli_usage_error("unknown argument '%s'", f);
    }
    if (a->cpu) a->paths = 1 << PATH_CPU;
    if (a->runs < 0) a->runs = a->quick ? 3 : 5;
    if (a->warmup < 0) a->warmup = a->quick ? 1 : 2;
    if (a->new_tokens < 0) a->new_tokens = a->quick ? 64 : 256;
    if (a->nprompts < 0) {
        static const int p[] = {16, 128, 512, 1024};
        a->nprompts = 4;
        memcpy(a->prompts, p, sizeof(p));
    }
    if (a->nbatches < 0) {
        static const int full[] = {1, 8, 32, 64}, quick[] = {1, 8, 64};
        a->nbatches = a->quick ? 3 : 4;
        memcpy(a->batches, a->quick ? quick : full, a->nbatches * sizeof(int));
    }
}

// ----------------------------------------------------------------------------
// The model: a checkpoint, or random weights of one of GPT-2's sizes built in memory

static const struct {
    const char *name;
    int L, C, NH;
} gpt2_sizes[] = {
    {"124M", 12, 768, 12}, {"355M", 24, 1024, 16}, {"774M", 36, 1280, 20}, {"1558M", 48, 1600, 25}, {"tiny", 2, 64, 4},
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// n values mean + std * normal(0, 1), Box-Muller. Chunks of 64k draw from their own stream (seed,
// tensor, chunk), so the values do not depend on the number of threads.
static void fill_normal(float *p, size_t n, float mean, float std, uint64_t seed) {
    const size_t chunk = 1 << 16;
    size_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        uint64_t s = seed * 0x2545F4914F6CDD1Dull + c;
        size_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (size_t i = c * chunk; i < end; i += 2) {
            double u1 = ((splitmix64(&s) >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
            double u2 = (splitmix64(&s) >> 11) / 9007199254740992.0;
            double r = sqrt(-2.0 * log(u1));
            p[i] = mean + std * (float)(r * cos(6.283185307179586 * u2));
            if (i + 1 < end) p[i + 1] = mean + std * (float)(r * sin(6.283185307179586 * u2));
        }
    }
}

// GPT-2's initialisation: matrices, embeddings and biases normal(0, 0.02), LayerNorm weights
// normal(1, 0.02), fp32. Speed does not depend on the values, but zeros would flatter it (and hide
// unwritten outputs), so they are random.
static int build_random_model(GPT2Model *m, const char *size, uint64_t seed, Error *err) {
    int k = -1;
    for (size_t i = 0; i < sizeof(gpt2_sizes) / sizeof(gpt2_sizes[0]); i++)
        if (!strcmp(size, gpt2_sizes[i].name)) k = (int)i;
    if (k < 0) return fail(err, "--size: '%s' is not 124M, 355M, 774M, 1558M or tiny", size);
    memset(m, 0, sizeof(*m));
    m->config = (GPT2Config){.max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304,
                             .num_layers = gpt2_sizes[k].L, .num_heads = gpt2_sizes[k].NH,
                             .channels = gpt2_sizes[k].C};
    m->dtype = DTYPE_F32;
    size_t total;
    if (gpt2_param_counts(&m->config, m->param_counts, &total)) return fail(err, "--size %s: too large", size);
    m->param_memory = xmalloc(total * sizeof(float));
    gpt2_model_point_params(m);
    for (int p = 0; p < NUM_PARAMS; p++) {
        int ln_w = p == PARAM_LN1W || p == PARAM_LN2W || p == PARAM_LNFW;
        fill_normal(m->params[p], m->param_counts[p], ln_w ? 1.0f : 0.0f, 0.02f, seed * 31 + (uint64_t)p);
    }
    snprintf(m->path, sizeof(m->path), "random GPT-2 %s (seed %llu)", size, (unsigned long long)seed);
    return 0;
}

// ----------------------------------------------------------------------------
// Results

typedef struct {
    BenchPath path;
    DType dtype;
    const char *phase;  // "prefill", "forward", "decode"
    int batch, prompt_len, new_tokens;
    double ms;            // prefill, forward: one forward; decode: one step (the run's median over new_tokens)
    double tok_s;         // tokens processed (prefill, forward) or generated (decode) per second
    double roofline_pct;  // decode on the GPU: the memory roofline's time over the measured; else < 0
    double bytes_per_step;
    double device_ms;     // decode through a CUDA graph: one step's device time alone (the graph replayed
                          // back to back, no host work between steps); else < 0
} Result;

#ifdef GPT2_CUDA
static const char *const prof_names[GPU_PROF_KINDS] = {"input", "attn_in", "attention", "attn_out",
                                                        "mlp_in", "mlp_out", "logits", "output"};
typedef struct {
    BenchPath path;
    DType dtype;
    const char *phase;
    int batch, tokens, pos;
    double ms[GPU_PROF_KINDS];  // per forward
} Breakdown;
#endif

typedef struct {
    BenchArgs *args;
    const GPT2Model *model;
    int gpu;
    char device[256];
    double bandwidth_gbps;  // device copy bandwidth (0 on the CPU)
    Result *results;
    int nresults, cap;
#ifdef GPT2_CUDA
    BenchTimer *timer;
    Breakdown *breakdowns;
    int nbreakdowns;
#endif
    // Validation: the first engine's logits for the check tokens are the baseline of the others.
    float *baseline;
    BenchPath baseline_path;
    DType baseline_dtype;
    int failures;
    int step, steps;  // progress
} Bench;

static void add_result(Bench *b, Result r) {
    if (b->nresults == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->results = realloc(b->results, b->cap * sizeof(Result));
        if (!b->results) die("out of host memory");
    }
    b->results[b->nresults++] = r;
}

// On a terminal one line rewritten in place; in a log, only the lines that start something (log).
static void progress(Bench *b, int log, const char *fmt, ...) GPT2_PRINTF(3, 4);
static void progress(Bench *b, int log, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (isatty(2)) fprintf(stderr, "\rbench [%d/%d] %s\033[K", b->step, b->steps, line);
    else if (log) fprintf(stderr, "bench [%d/%d] %s\n", b->step, b->steps, line);
    fflush(stderr);
}

// ----------------------------------------------------------------------------
// Timing

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double timer_start(Bench *b) {
#ifdef GPT2_CUDA
    Error err;
    if (b->gpu && bench_timer_start(b->timer, &err)) die("%s", err.msg);
#endif
    (void)b;
    return now_ms();
}

static double timer_stop(Bench *b, double t0) {
#ifdef GPT2_CUDA
    if (b->gpu) {
        Error err;
        double ms;
        if (bench_timer_stop(b->timer, &ms, &err)) die("%s", err.msg);
        return ms;
    }
#endif
    (void)b;
    return now_ms() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Token ids that look like text to nobody but exercise every row of wte: a fixed stream per seed.
static void fill_tokens(int *t, size_t n, int V, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) t[i] = (int)(splitmix64(&s) % (uint64_t)V);
}

// ----------------------------------------------------------------------------
// Checks before timing

static double rel_l2(const float *got, const float *want, size_t n) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double d = (double)got[i] - want[i];
        d2 += d * d;
        r2 += (double)want[i] * want[i];
    }
    return r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
}

enum { CHECK_B = 2, CHECK_T = 65 };

// The engine's logits for CHECK_B x CHECK_T fixed tokens against the baseline's (the first engine
// checked: the GPU reference fp32 when it runs), and its decode step over the KV cache (a prefill
// of CHECK_T - 1 tokens, then one step) against its own full forward at the last position.
// fp32 against fp32: rel_l2 <= 1e-4; anything bf16: <= 3e-2 (validate's tolerances).
static int check_engine(Bench *b, Engine *e, BenchPath path, DType dt) {
    int V = b->model->config.vocab_size, B = CHECK_B, T = CHECK_T < e->max_seq ? CHECK_T : e->max_seq;
    int *tokens = xmalloc((size_t)B * T * sizeof(int)), *last = xmalloc(B * sizeof(int));
    float *full = xmalloc((size_t)B * T * V * sizeof(float)), *step = xmalloc((size_t)B * V * sizeof(float));
    float *full_last = xmalloc((size_t)B * V * sizeof(float));
    fill_tokens(tokens, (size_t)B * T, V, 12345);
    Error err;
    int ok = 1;
    double vs_base = 0, vs_full = 0, tol_full = dt == DTYPE_BF16 ? 3e-2 : 1e-4;
    int *prefix = xmalloc((size_t)B * (T - 1) * sizeof(int));
    for (int s = 0; s < B; s++) {
        memcpy(prefix + (size_t)s * (T - 1), tokens + (size_t)s * T, (T - 1) * sizeof(int));
        last[s] = tokens[(size_t)s * T + T - 1];
    }
    if (e->forward(e, tokens, B, T, 0, full, 1, &err) || e->forward(e, prefix, B, T - 1, 0, step, 0, &err) ||
        e->forward(e, last, B, 1, T - 1, step, 0, &err)) {
        fprintf(stderr, "\ngpt2: bench: %s %s: %s\n", path_names[path], dtype_name(dt), err.msg);
        ok = 0;
    } else {
        for (int s = 0; s < B; s++)
            memcpy(full_last + (size_t)s * V, full + ((size_t)s * T + T - 1) * V, V * sizeof(float));
        vs_full = rel_l2(step, full_last, (size_t)B * V);
        ok = vs_full <= tol_full;
        // The decode step generation uses (on the device where the engine samples there): greedy,
        // so each pick must be a maximum of that step's logits (ties within rounding allowed).
        Sampler greedy;
        sampler_create(&greedy, V, 0.0f, 0, 1.0f, 1);
        int *next = xmalloc(B * sizeof(int)), picks_ok = 1;
        float *scratch = xmalloc((size_t)B * V * sizeof(float));
        if (engine_decode(e, last, B, 1, T - 1, &greedy, scratch, next, &err)) {
            fprintf(stderr, "\ngpt2: bench: %s %s: %s\n", path_names[path], dtype_name(dt), err.msg);
            picks_ok = 0;
        }
        for (int s = 0; picks_ok && s < B; s++) {
            const float *row = step + (size_t)s * V;
            float mx = row[0];
            for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
            picks_ok = next[s] >= 0 && next[s] < V && row[next[s]] >= mx - 1e-3f * (fabsf(mx) + 1.0f);
        }
        if (!picks_ok) printf("check %-9s %-4s: the decode step's greedy token is not the logits' argmax\n",
                              path_names[path], dtype_name(dt));
        ok &= picks_ok;
        sampler_free(&greedy);
        free(next), free(scratch);
        char base[96] = "baseline";
        if (!b->baseline) {
            b->baseline = full, full = NULL;
            b->baseline_path = path, b->baseline_dtype = dt;
        } else {
            double tol = dt == DTYPE_F32 && b->baseline_dtype == DTYPE_F32 ? 1e-4 : 3e-2;
            vs_base = rel_l2(full, b->baseline, (size_t)B * T * V);
            ok &= vs_base <= tol;
            snprintf(base, sizeof(base), "rel_l2 %.1e vs %s %s (tol %.0e)", vs_base, path_names[b->baseline_path],
                     dtype_name(b->baseline_dtype), tol);
        }
        printf("check %-9s %-4s %s; cached decode step vs full forward rel_l2 %.1e (tol %.0e): %s\n",
               path_names[path], dtype_name(dt), base, vs_full, tol_full, ok ? "ok" : "FAILED, not timed");
        fflush(stdout);
    }
    if (!ok) b->failures++;
    free(tokens), free(last), free(full), free(step), free(full_last), free(prefix);
    return ok;
}

// ----------------------------------------------------------------------------
// The workloads

// Bytes one decode step must read from device memory: every weight once in the compute dtype
// (wte for the logits; wpe only the rows it uses), LayerNorm parameters and biases in fp32, and the
// K and V of positions 0..pos of every layer and sequence.
static double decode_step_bytes(const GPT2Config *c, DType dt, int B, int pos) {
    double L = c->num_layers, C = c->channels, ds = (double)dtype_size(dt);
    double matrices = (double)c->vocab_size * C + L * 12 * C * C;
    double vectors = L * (4 * C + 3 * C + C + 4 * C + C) + 2 * C;
    double kv = 2 * L * B * (pos + 1.0) * C * ds;
    return matrices * ds + vectors * 4 + C * ds + kv;
}

static void run_prefill(Bench *b, Engine *e, BenchPath path, DType dt, int P, float *logits) {
    const BenchArgs *a = b->args;
    int *tokens = xmalloc((size_t)P * sizeof(int));
    fill_tokens(tokens, P, b->model->config.vocab_size, 7 + P);
    double *t = xmalloc(a->runs * sizeof(double));
    Sampler smp;
    sampler_create(&smp, b->model->config.vocab_size, a->temperature, a->top_k, a->top_p, 1);
    Error err;
    int first;
    // Each step as generation runs it (engine_decode): on the GPU the pick is made on the device and
    // only ids cross to the host; elsewhere the logits come to the host and the sampler picks there.
    for (int r = 0; r < a->warmup + a->runs; r++) {
        progress(b, r == 0, "%s %s prefill %d: run %d/%d", path_names[path], dtype_name(dt), P, r + 1, a->warmup + a->runs);
        double t0 = timer_start(b);
        if (engine_decode(e, tokens, 1, P, 0, &smp, logits, &first, &err)) die("%s", err.msg);
        double ms = timer_stop(b, t0);
        if (r >= a->warmup) t[r - a->warmup] = ms;
    }
    double ms = median(t, a->runs);
    add_result(b, (Result){path, dt, "prefill", 1, P, 0, ms, P * 1e3 / ms, -1, 0, -1});
    sampler_free(&smp);
    free(tokens), free(t);
}

static void run_forward(Bench *b, Engine *e, BenchPath path, DType dt, int B, int T, float *logits) {
    const BenchArgs *a = b->args;
    int *tokens = xmalloc((size_t)B * T * sizeof(int));
    fill_tokens(tokens, (size_t)B * T, b->model->config.vocab_size, 99);
    double *t = xmalloc(a->runs * sizeof(double));
    Error err;
    for (int r = 0; r < a->warmup + a->runs; r++) {
        progress(b, r == 0, "%s %s forward %dx%d: run %d/%d", path_names[path], dtype_name(dt), B, T, r + 1,
                 a->warmup + a->runs);
        double t0 = timer_start(b);
        if (e->forward(e, tokens, B, T, 0, path == PATH_CPU ? logits : NULL, 1, &err)) die("%s", err.msg);
        double ms = timer_stop(b, t0);
        if (r >= a->warmup) t[r - a->warmup] = ms;
    }
    double ms = median(t, a->runs);
    add_result(b, (Result){path, dt, "forward", B, T, 0, ms, (double)B * T * 1e3 / ms, -1, 0, -1});
    free(tokens), free(t);
}

static int every_step(void *user, const int *next) {
    (void)user, (void)next;
    return 0;
}

// A prompt of P tokens per sequence and the pick of the first new token (untimed), then N decode
// steps (greedy, or --temp's sampler), each feeding the last step's tokens, timed as one run: as
// generation runs them (engine_decode_steps: on the GPU each step queued before the last one's
// tokens reach the host).
static void run_decode(Bench *b, Engine *e, BenchPath path, DType dt, int B, int P, int N, float *logits) {
    const BenchArgs *a = b->args;
    int V = b->model->config.vocab_size;
    int *prompt = xmalloc((size_t)B * P * sizeof(int)), *first = xmalloc(B * sizeof(int));
    int *next = xmalloc(B * sizeof(int));
    fill_tokens(prompt, (size_t)B * P, V, 3);
    Sampler smp;
    sampler_create(&smp, V, a->temperature, a->top_k, a->top_p, 1);
    int warmup = a->warmup < 1 ? a->warmup : 1;  // a whole decode run warms everything a step uses
    double *t = xmalloc(a->runs * sizeof(double));
    Error err;
    for (int r = 0; r < warmup + a->runs; r++) {
        progress(b, r == 0, "%s %s decode batch %d, %d new: run %d/%d", path_names[path], dtype_name(dt), B, N, r + 1,
                 warmup + a->runs);
        if (engine_decode(e, prompt, B, P, 0, &smp, logits, first, &err)) die("%s", err.msg);
        double t0 = timer_start(b);
        if (engine_decode_steps(e, first, B, P, N, &smp, logits, next, every_step, NULL, &err)) die("%s", err.msg);
        double ms = timer_stop(b, t0);
        if (r >= warmup) t[r - warmup] = ms;
    }
    double ms = median(t, a->runs);
    double bytes = 0;
    for (int i = 0; i < N; i++) bytes += decode_step_bytes(&b->model->config, dt, B, P + i);
    double pct = b->bandwidth_gbps > 0 ? 100.0 * (bytes / (b->bandwidth_gbps * 1e9)) / (ms * 1e-3) : -1;
    double device_ms = -1;  // what the host's work between steps costs: the step's graph alone
#ifdef GPT2_CUDA
    if (b->gpu && gpu_engine_time_decode_graph(e, B, 50, &device_ms, &err) < 0) die("%s", err.msg);
#endif
    add_result(b, (Result){path, dt, "decode", B, P, N, ms / N, (double)B * N * 1e3 / ms, pct, bytes / N, device_ms});
    sampler_free(&smp);
    free(prompt), free(first), free(next), free(t);
}

#ifdef GPT2_CUDA
// The per-op breakdown: with the engine's profile attached, `reps` forwards of B x T at pos.
static void run_profile(Bench *b, Engine *e, BenchPath path, DType dt, const char *phase, int B, int T, int pos,
                        int reps, float *logits) {
    int V = b->model->config.vocab_size;
    int *tokens = xmalloc((size_t)B * (pos + T) * sizeof(int));
    fill_tokens(tokens, (size_t)B * (pos + T), V, 5);
    Error err;
    GpuProfile prof;
    memset(&prof, 0, sizeof(prof));
    progress(b, 1, "%s %s per-op breakdown of %s", path_names[path], dtype_name(dt), phase);
    for (int r = 0; r < reps; r++) {
        if (pos > 0 && e->forward(e, tokens, B, pos, 0, logits, 0, &err)) die("%s", err.msg);
        if (gpu_engine_profile(e, &prof, &err) || e->forward(e, tokens + (size_t)B * pos, B, T, pos, logits, 0, &err) ||
            gpu_engine_profile(e, NULL, &err))
            die("%s", err.msg);
    }
    Breakdown d = {path, dt, phase, B, T, pos, {0}};
    for (int k = 0; k < GPU_PROF_KINDS; k++) d.ms[k] = prof.forwards ? prof.ms[k] / prof.forwards : 0;
    b->breakdowns = realloc(b->breakdowns, (b->nbreakdowns + 1) * sizeof(Breakdown));
    if (!b->breakdowns) die("out of host memory");
    b->breakdowns[b->nbreakdowns++] = d;
    free(tokens);
}
#endif

static Engine *make_engine(Bench *b, BenchPath path, DType dt, int max_batch, int max_seq) {
    EngineOptions opt = {.backend = path == PATH_CPU ? BACKEND_CPU : path == PATH_FUSED ? BACKEND_GPU
                                                                                         : BACKEND_GPU_REFERENCE,
                         .dtype = dt, .max_batch = max_batch, .max_seq = max_seq};
    Error err;
    Engine *e = engine_create(b->model, &opt, &err);
    if (!e) {
        fprintf(stderr, "\ngpt2: bench: %s %s: %s\n", path_names[path], dtype_name(dt), err.msg);
        b->failures++;
    }
    return e;
}

// The timed decode steps of a run: --new of them, or as many as the context leaves after --depth.
static int decode_steps(const BenchArgs *a, int maxT) {
    return a->depth + a->new_tokens > maxT ? maxT - a->depth : a->new_tokens;
}

// Everything for one path and dtype, in two engines: one sized for the prefills and the full
// forward (batch forward_B, the model's context), one for decode (the largest batch, prompt + new).
static void bench_engine(Bench *b, BenchPath path, DType dt) {
    const BenchArgs *a = b->args;
    const GPT2Config *c = &b->model->config;
    int maxT = c->max_seq_len, V = c->vocab_size;

    int fwd = a->forward && a->forward_T <= maxT;
    int maxP = 0;
    for (int i = 0; i < a->nprompts; i++)
        if (a->prompts[i] <= maxT && a->prompts[i] > maxP) maxP = a->prompts[i];
    int seq1 = maxP > CHECK_T ? maxP : CHECK_T;
    if (fwd && a->forward_T > seq1) seq1 = a->forward_T;
    if (seq1 > maxT) seq1 = maxT;
    int batch1 = fwd && a->forward_B > CHECK_B ? a->forward_B : CHECK_B;
    b->step++;
    progress(b, 1, "%s %s: building the engine (batch %d x %d positions)", path_names[path], dtype_name(dt), batch1,
             seq1);
    Engine *e = make_engine(b, path, dt, batch1, seq1);
    if (!e) return;
    size_t rows = fwd && path == PATH_CPU ? (size_t)a->forward_B * a->forward_T : 1;  // the GPU's stay there
    float *logits = xmalloc(rows * V * sizeof(float));
    if (check_engine(b, e, path, dt)) {
        for (int i = 0; i < a->nprompts; i++)
            if (a->prompts[i] <= maxT) run_prefill(b, e, path, dt, a->prompts[i], logits);
        if (fwd) run_forward(b, e, path, dt, a->forward_B, a->forward_T, logits);
#ifdef GPT2_CUDA
        if (b->gpu && a->profile && maxP > 0) run_profile(b, e, path, dt, "prefill", 1, maxP, 0, 3, logits);
#endif
    }
    engine_free(e);
    free(logits);

    int P = a->depth, N = decode_steps(a, maxT), maxB = 0;
    for (int i = 0; i < a->nbatches; i++) maxB = a->batches[i] > maxB ? a->batches[i] : maxB;
    if (N < 1 || maxB < 1) return;
    int seq2 = P + N > CHECK_T ? P + N : CHECK_T;
    if (seq2 > maxT) seq2 = maxT;
    int batch2 = maxB > CHECK_B ? maxB : CHECK_B;
    progress(b, 1, "%s %s: building the decode engine (batch %d x %d positions)", path_names[path], dtype_name(dt),
             batch2, seq2);
    e = make_engine(b, path, dt, batch2, seq2);
    if (!e) return;
    logits = xmalloc((size_t)batch2 * V * sizeof(float));
    if (check_engine(b, e, path, dt)) {
        for (int i = 0; i < a->nbatches; i++) run_decode(b, e, path, dt, a->batches[i], P, N, logits);
#ifdef GPT2_CUDA
        if (b->gpu && a->profile) {
            run_profile(b, e, path, dt, "decode", 1, 1, P, 8, logits);
            if (maxB > 1) run_profile(b, e, path, dt, "decode", maxB, 1, P, 8, logits);
        }
#endif
    }
    engine_free(e);
    free(logits);
}

// ----------------------------------------------------------------------------
// Output: the table on stdout, and the JSON

// "greedy", or the sampler's settings as generation's flags name them.
static void sampling_label(const BenchArgs *a, char *out, size_t len) {
    if (a->temperature <= 0.0f) snprintf(out, len, "greedy");
    else snprintf(out, len, "sampled (--temp %g --top-k %d --top-p %g)", a->temperature, a->top_k, a->top_p);
}

static void print_table(const Bench *b) {
    const BenchArgs *a = b->args;
    printf("\n%-9s %-4s %-7s %5s %6s %5s %10s %12s %9s %10s\n", "path", "dtype", "phase", "batch", "prompt", "new",
           "ms", "tok/s", "roofline", "device ms");
    for (int i = 0; i < b->nresults; i++) {
        const Result *r = &b->results[i];
        char roof[16] = "-", nw[16] = "-", dev[16] = "-";
        if (r->roofline_pct >= 0) snprintf(roof, sizeof(roof), "%.1f%%", r->roofline_pct);
        if (r->new_tokens) snprintf(nw, sizeof(nw), "%d", r->new_tokens);
        if (r->device_ms >= 0) snprintf(dev, sizeof(dev), "%.4f", r->device_ms);
        printf("%-9s %-4s %-7s %5d %6d %5s %10.3f %12.1f %9s %10s\n", path_names[r->path], dtype_name(r->dtype),
               r->phase, r->batch, r->prompt_len, nw, r->ms, r->tok_s, roof, dev);
    }
    char pick[96];
    sampling_label(a, pick, sizeof(pick));
    printf("prefill: ms to the first token of one sequence (the prompt's forward and its %s pick, on the device "
           "where the engine samples there); forward: %d x %d tokens, every position's logits to the "
           "host (the GPU's: kept on the device); on the GPU both repeat one shape, so after the warm-up they replay a "
           "CUDA graph (GPT2_FORWARD_GRAPH=0: eager, as a prompt's first forward runs);\ndecode: ms per step and generated tokens/s, %d %s tokens after a "
           "%d-token prompt (generation's step);\nroofline: (weights + KV cache bytes per step) / copy bandwidth over the "
           "measured time; device ms: the step's CUDA graph alone, replayed back to back.\n"
           "Median of %d runs after %d warm-up (decode: %d).\n",
           pick, a->forward_B, a->forward_T, decode_steps(a, b->model->config.max_seq_len), pick, a->depth,
           a->runs, a->warmup,
           a->warmup < 1 ? a->warmup : 1);
#ifdef GPT2_CUDA
    if (b->nbreakdowns) {
        printf("\nper-op time (ms per forward; input: tokens to the device + embedding; output: logits to the host)\n");
        printf("%-9s %-4s %-7s %5s %6s", "path", "dtype", "phase", "batch", "tokens");
        for (int k = 0; k < GPU_PROF_KINDS; k++) printf(" %9s", prof_names[k]);
        printf(" %9s\n", "total");
        for (int i = 0; i < b->nbreakdowns; i++) {
            const Breakdown *d = &b->breakdowns[i];
            double total = 0;
            printf("%-9s %-4s %-7s %5d %6d", path_names[d->path], dtype_name(d->dtype), d->phase, d->batch, d->tokens);
            for (int k = 0; k < GPU_PROF_KINDS; k++) printf(" %9.3f", d->ms[k]), total += d->ms[k];
            printf(" %9.3f\n", total);
        }
    }
#endif
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void json_number(FILE *f, double v) {
    if (v < 0 || !isfinite(v)) fputs("null", f);
    else fprintf(f, "%.6g", v);
}

static void commit_id(const BenchArgs *a, char *out, size_t len) {
    snprintf(out, len, "%s", a->commit ? a->commit : "unknown");
    if (a->commit) return;
    FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (!p) return;
    char buf[64];
    if (fgets(buf, sizeof(buf), p)) {
        buf[strcspn(buf, "\r\n")] = '\0';
        if (buf[0]) snprintf(out, len, "%s", buf);
    }
    pclose(p);
}

static int write_json(const Bench *b, const char *path, Error *err) {
    const BenchArgs *a = b->args;
    const GPT2Config *c = &b->model->config;
    FILE *f = fopen(path, "w");
    if (!f) return fail(err, "%s: cannot write: %s", path, strerror(errno));
    char commit[64], date[32];
    commit_id(a, commit, sizeof(commit));
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\n  \"engine\": \"gpt2.c\",\n  \"device\": ");
    json_string(f, b->device);
    fprintf(f, ",\n  \"commit\": ");
    json_string(f, commit);
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"model\": {\"name\": ", date);
    json_string(f, b->model->path);
    fprintf(f, ", \"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"maxT\": %d, \"dtype\": \"%s\"},\n", c->num_layers,
            c->channels, c->num_heads, c->vocab_size, c->max_seq_len, dtype_name(b->model->dtype));
    fprintf(f, "  \"bandwidth_gbps\": ");
    json_number(f, b->gpu ? b->bandwidth_gbps : -1);
    fprintf(f, ",\n  \"settings\": {\"runs\": %d, \"warmup\": %d, \"quick\": %s, \"timer\": \"%s\", "
               "\"sampling\": {\"temperature\": %g, \"top_k\": %d, \"top_p\": %g}},\n",
            a->runs, a->warmup, a->quick ? "true" : "false", b->gpu ? "cuda-events" : "clock_monotonic", a->temperature,
            a->top_k, a->top_p);
    fprintf(f, "  \"results\": [");
    for (int i = 0; i < b->nresults; i++) {
        const Result *r = &b->results[i];
        fprintf(f, "%s\n    {\"path\": \"%s\", \"dtype\": \"%s\", \"phase\": \"%s\", \"batch\": %d, \"prompt_len\": %d, "
                   "\"new_tokens\": %d, \"tok_s\": ",
                i ? "," : "", path_names[r->path], dtype_name(r->dtype), r->phase, r->batch, r->prompt_len,
                r->new_tokens);
        json_number(f, r->tok_s);
        fprintf(f, ", \"ms\": ");
        json_number(f, r->ms);
        fprintf(f, ", \"roofline_pct\": ");
        json_number(f, r->roofline_pct);
        if (r->bytes_per_step > 0) fprintf(f, ", \"bytes_per_step\": %.6g", r->bytes_per_step);
        if (r->device_ms >= 0) fprintf(f, ", \"device_ms\": %.6g", r->device_ms);
        fputc('}', f);
    }
    fprintf(f, "\n  ]");
#ifdef GPT2_CUDA
    fprintf(f, ",\n  \"breakdown\": [");
    for (int i = 0; i < b->nbreakdowns; i++) {
        const Breakdown *d = &b->breakdowns[i];
        fprintf(f, "%s\n    {\"path\": \"%s\", \"dtype\": \"%s\", \"phase\": \"%s\", \"batch\": %d, \"tokens\": %d, "
                   "\"pos\": %d, \"ms\": {",
                i ? "," : "", path_names[d->path], dtype_name(d->dtype), d->phase, d->batch, d->tokens, d->pos);
        for (int k = 0; k < GPU_PROF_KINDS; k++) fprintf(f, "%s\"%s\": %.6g", k ? ", " : "", prof_names[k], d->ms[k]);
        fprintf(f, "}}");
    }
    fprintf(f, "\n  ]");
#endif
    fprintf(f, "\n}\n");
    if (fclose(f)) return fail(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

// ----------------------------------------------------------------------------
// --kernels: the fused kernels against the unfused ops, at GPT-2's shapes

#ifdef GPT2_CUDA
static int bench_kernels(const BenchArgs *a, const char *device) {
    BenchKernelRow *rows = NULL;
    int n = 0;
    Error err;
    if (bench_gpu_kernels(a->quick, &rows, &n, &err)) die("%s", err.msg);
    if (isatty(2)) fputc('\n', stderr);
    printf("gpt2 bench --kernels: %s. Median per call (CUDA graph of back-to-back calls between events);\n"
           "each case validated (fused vs unfused rel_l2) before it is timed.\n\n", device);
    printf("%-16s %-4s %-22s %11s %11s %8s %9s %8s %10s\n", "op", "dtype", "shape", "fused us", "unfused us", "speedup",
           "GB/s", "TFLOP/s", "rel_l2");
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const BenchKernelRow *r = &rows[i];
        if (!r->ok) bad++;
        printf("%-16s %-4s %-22s %11.2f %11.2f %7.2fx %9.0f %8.1f %10.1e%s\n", r->op, dtype_name(r->dtype), r->shape,
               r->fused_us, r->unfused_us, r->fused_us > 0 ? r->unfused_us / r->fused_us : 0, r->fused_gbps,
               r->fused_tflops, r->rel_l2, r->ok ? "" : "  FAILED");
    }
    if (a->json_path) {
        char commit[64];
        commit_id(a, commit, sizeof(commit));
        FILE *f = fopen(a->json_path, "w");
        if (!f) die("%s: cannot write: %s", a->json_path, strerror(errno));
        fprintf(f, "{\n  \"engine\": \"gpt2.c\",\n  \"device\": ");
        json_string(f, device);
        fprintf(f, ",\n  \"commit\": ");
        json_string(f, commit);
        fprintf(f, ",\n  \"kernels\": [");
        for (int i = 0; i < n; i++) {
            const BenchKernelRow *r = &rows[i];
            fprintf(f, "%s\n    {\"op\": \"%s\", \"dtype\": \"%s\", \"shape\": \"%s\", \"M\": %d, \"K\": %d, \"N\": %d, "
                       "\"B\": %d, \"T\": %d, \"L\": %d, \"fused_us\": %.6g, \"unfused_us\": %.6g, \"rel_l2\": %.3g, "
                       "\"ok\": %s}",
                    i ? "," : "", r->op, dtype_name(r->dtype), r->shape, r->M, r->K, r->N, r->B, r->T, r->L,
                    r->fused_us, r->unfused_us, r->rel_l2, r->ok ? "true" : "false");
        }
        fprintf(f, "\n  ]\n}\n");
        if (fclose(f)) die("%s: write failed", a->json_path);
    }
    free(rows);
    return bad ? 1 : 0;
}
#endif

// ----------------------------------------------------------------------------

int cmd_bench(int argc, char **argv) {
    BenchArgs a;
    parse_args(&a, argc, argv);
    Error err;
    Bench b = {.args = &a};
    snprintf(b.device, sizeof(b.device), "CPU");

    if (!a.cpu) {
#ifdef GPT2_CUDA
        if (!gpu_available(&err)) die("bench needs a GPU (%s); `gpt2 bench --cpu` times the CPU path", err.msg);
        double mem = 0;
        if (bench_gpu_device(b.device, sizeof(b.device), &mem, &err)) die("%s", err.msg);
        if (a.kernels) return bench_kernels(&a, b.device);
        b.gpu = 1;
        if (!(b.timer = bench_timer_create(&err))) die("%s", err.msg);
        fprintf(stderr, "bench: measuring the copy bandwidth of %s\n", b.device);
        if (bench_gpu_copy_bandwidth((size_t)1 << 30, a.quick ? 5 : 11, &b.bandwidth_gbps, &err)) die("%s", err.msg);
#else
        die("bench needs a GPU (this gpt2 was built without CUDA); `gpt2 bench --cpu` times the CPU path");
#endif
    } else if (a.kernels) {
        die("--kernels times GPU kernels; it has no --cpu form");
    }

    GPT2Model model;
    if (a.model_path) {
        if (access(a.model_path, R_OK) != 0) die("%s: model not found", a.model_path);
        if (gpt2_model_load(&model, a.model_path, &err)) die("%s", err.msg);
    } else {
        fprintf(stderr, "bench: building a random GPT-2 %s in memory\n", a.size);
        if (build_random_model(&model, a.size, a.seed, &err)) cli_usage_error("%s", err.msg);
    }
    gpt2_model_describe(&model, stderr);
    b.model = &model;
    if (a.depth >= model.config.max_seq_len && a.nbatches > 0)
        cli_usage_error("--depth %d: the model's context is %d positions, so at most %d", a.depth,
                        model.config.max_seq_len, model.config.max_seq_len - 1);

    // Every dtype the model allows: fp32 weights run as fp32 or bf16; bf16 weights as bf16.
    int dtypes = a.dtypes ? a.dtypes : model.dtype == DTYPE_F32 ? (1 << DTYPE_F32 | 1 << DTYPE_BF16) : 1 << DTYPE_BF16;
    if (a.cpu) dtypes = 1 << DTYPE_F32;  // the CPU path computes in fp32 whatever it is given
    // The reference first, fp32 first: the first engine checked is the baseline of the others.
    static const BenchPath order[] = {PATH_REFERENCE, PATH_FUSED, PATH_CPU};
    static const DType dorder[] = {DTYPE_F32, DTYPE_BF16};
    for (int di = 0; di < 2; di++)
        for (int pi = 0; pi < 3; pi++)
            if ((dtypes & 1 << dorder[di]) && (a.paths & 1 << order[pi])) b.steps++;

    for (int di = 0; di < 2; di++)
        for (int pi = 0; pi < 3; pi++)
            if ((dtypes & 1 << dorder[di]) && (a.paths & 1 << order[pi])) {
                bench_engine(&b, order[pi], dorder[di]);
                // Written after every engine too, so that a run cut short keeps what it measured.
                if (a.json_path && write_json(&b, a.json_path, &err)) die("%s", err.msg);
            }
    if (isatty(2)) fputc('\n', stderr);

    char commit[64];
    commit_id(&a, commit, sizeof(commit));
    const GPT2Config *c = &model.config;
    printf("\ngpt2 bench: %s, L=%d C=%d NH=%d V=%d maxT=%d (%s weights); %s", model.path, c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->max_seq_len, dtype_name(model.dtype), b.device);
    if (b.gpu) printf(", copy bandwidth %.0f GB/s", b.bandwidth_gbps);
    printf("; commit %s%s\n", commit, a.quick ? "; --quick" : "");
    print_table(&b);

    if (a.json_path) {
        if (write_json(&b, a.json_path, &err)) die("%s", err.msg);
        fprintf(stderr, "bench: wrote %s\n", a.json_path);
    }
    if (b.failures) fprintf(stderr, "gpt2: bench: %d engine(s) failed their check or could not be built\n", b.failures);

#ifdef GPT2_CUDA
    bench_timer_free(b.timer);
    free(b.breakdowns);
#endif
    free(b.results);
    free(b.baseline);
    gpt2_model_free(&model);
    return b.failures ? 1 : 0;
}
