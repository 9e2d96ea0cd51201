// The GPU engine through the Engine API, on random models built in memory: the fused and reference
// paths against the CPU engine, KV-cache decoding against one full forward (B = 1 and B > 1, fp32
// and bf16, head sizes 32 and 64, contexts up to 1024; its prompts' last layers run on their last
// rows only, so this checks that too), the fused path's graph-replayed, device-sampled decode
// step, decode steps queued ahead of their picks, bf16 against fp32, the LayerNorm-folded vectors,
// a prompt's logits after other steps, the trace hook, and the errors (bad shapes, tokens, out of
// memory). Every check skips without a GPU.
#include <glob.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "test.h"
#ifdef GPT2_CUDA
#include "gpu_engine.h"
#endif

#ifndef GPT2_CUDA
int main(void) {
    test_skip("gpu_engine", "no GPU (built without CUDA)");
    return 0;
}
#else

// ----------------------------------------------------------------------------
// Random models and comparisons

static uint64_t rng_state;
static float randn(void) {  // Box-Muller over xorshift64*
    float u[2];
    for (int i = 0; i < 2; i++) {
        rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
        u[i] = ((rng_state * 0x2545F4914F6CDD1DULL) >> 40) / 16777216.0f + 1e-7f;
    }
    return sqrtf(-2.0f * logf(u[0])) * cosf(6.2831853f * u[1]);
}

// Weights N(0, std), LayerNorm weights 1 + N(0, 0.1) and biases N(0, 0.1) so that a wrong LayerNorm
// or bias shows; pad rows of wte zero.
static void make_model(GPT2Model *m, GPT2Config c, DType dt, uint64_t seed, float std) {
    memset(m, 0, sizeof(*m));
    m->config = c;
    m->dtype = dt;
    gpt2_param_counts(&c, m->param_counts, &m->num_parameters);
    m->param_memory = xmalloc(m->num_parameters * dtype_size(dt));
    gpt2_model_point_params(m);
    snprintf(m->path, sizeof(m->path), "random L=%d C=%d NH=%d V=%d", c.num_layers, c.channels, c.num_heads,
             c.vocab_size);
    rng_state = seed * 2654435761ULL + 1;
    for (int p = 0; p < NUM_PARAMS; p++) {
        int is_ln_w = p == PARAM_LN1W || p == PARAM_LN2W || p == PARAM_LNFW;
        int is_bias = p == PARAM_LN1B || p == PARAM_LN2B || p == PARAM_LNFB || p == PARAM_QKVB || p == PARAM_ATTPROJB ||
                      p == PARAM_FCB || p == PARAM_FCPROJB;
        for (size_t i = 0; i < m->param_counts[p]; i++) {
            float v = is_ln_w ? 1.0f + 0.1f * randn() : is_bias ? 0.1f * randn() : std * randn();
            if (p == PARAM_WTE && i >= (size_t)c.vocab_size * c.channels) v = 0.0f;
            if (dt == DTYPE_BF16) ((uint16_t *)m->params[p])[i] = float_to_bf16(v);
            else ((float *)m->params[p])[i] = v;
        }
    }
}

static double rel_l2(const float *got, const float *want, size_t n) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        if (!isfinite(got[i])) return INFINITY;
        d2 += d * d, r2 += (double)want[i] * want[i];
    }
    return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static double argmax_agreement(const float *a, const float *b, int rows, int V) {
    int same = 0;
    for (int r = 0; r < rows; r++) same += argmax(a + (size_t)r * V, V) == argmax(b + (size_t)r * V, V);
    return (double)same / rows;
}

static int *random_tokens(int n, int V, uint64_t seed) {
    int *t = xmalloc(n * sizeof(int));
    rng_state = seed + 77;
    for (int i = 0; i < n; i++) {
        rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
        t[i] = (int)(((rng_state * 0x2545F4914F6CDD1DULL) >> 33) % (uint64_t)V);
    }
    return t;
}

static Engine *make_engine(const GPT2Model *m, Backend backend, DType dt, int max_batch, int max_seq, Error *err) {
    EngineOptions opt = {.backend = backend, .dtype = dt, .max_batch = max_batch, .max_seq = max_seq};
    return engine_create(m, &opt, err);
}

// The two engines a check compares, the second built only when the first was: 1, or 0 with the
// check failed and neither kept.
static int make_engines(const GPT2Model *m, const char *name, Backend b0, DType d0, Backend b1, DType d1, int B, int T,
                        Engine **e0, Engine **e1) {
    Error err;
    *e0 = make_engine(m, b0, d0, B, T, &err);
    *e1 = *e0 ? make_engine(m, b1, d1, B, T, &err) : NULL;
    if (*e1) return 1;
    CHECK(0, name, "engine_create: %s", err.msg);
    engine_free(*e0);
    return 0;
}

// ----------------------------------------------------------------------------
// Checks, per model shape

typedef struct {
    const char *name;
    GPT2Config config;
} Shape;

static const char *path_name(Backend backend) { return backend == BACKEND_GPU ? "fused" : "reference"; }

// Full forward of B sequences of T tokens on a GPU path against the CPU engine.
static void check_against_cpu(const GPT2Model *m, Backend backend, const char *tag, DType gpu_dtype, double tol, int B,
                              int T) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_%s_%s_%s_vs_cpu", path_name(backend), tag, dtype_name(gpu_dtype));
    Error err;
    int V = m->config.vocab_size;
    Engine *g, *c;
    if (!make_engines(m, name, backend, gpu_dtype, BACKEND_CPU, DTYPE_F32, B, T, &g, &c)) return;
    int *tok = random_tokens(B * T, V, 5);
    float *lg = xmalloc((size_t)B * T * V * sizeof(float)), *lc = xmalloc((size_t)B * T * V * sizeof(float));
    int rc = g->forward(g, tok, B, T, 0, lg, 1, &err);
    if (rc == 0) rc = c->forward(c, tok, B, T, 0, lc, 1, &err);
    if (rc) {
        CHECK(0, name, "forward: %s", err.msg);
    } else {
        double r = rel_l2(lg, lc, (size_t)B * T * V), agree = argmax_agreement(lg, lc, B * T, V);
        int ok = r <= tol && (gpu_dtype == DTYPE_F32 || agree >= 0.90);
        CHECK(ok, name, "rel_l2 %.3g (tolerance %.3g), argmax agreement %.1f%%", r, tol, 100 * agree);
        if (ok) printf("  %s: rel_l2 %.3g, argmax agreement %.1f%%\n", name, r, 100 * agree);
    }
    free(tok), free(lg), free(lc);
    engine_free(g);
    engine_free(c);
}

// KV cache: a prefill of P tokens, then chunks and single-token steps through the cache, each
// logits row compared with the same position of one full forward over the whole sequence.
static void check_decode_dt(const GPT2Model *m, Backend backend, const char *tag, int B, int T, int P, DType dt,
                            double tol) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_%s_kv_decode_%s_%s_B%d", path_name(backend), tag, dtype_name(dt), B);
    Error err;
    int V = m->config.vocab_size;
    Engine *full, *inc;
    if (!make_engines(m, name, backend, dt, backend, dt, B, T, &full, &inc)) return;
    int *tok = random_tokens(B * T, V, 11 + B);
    float *ref = xmalloc((size_t)B * T * V * sizeof(float));
    float *step = xmalloc((size_t)B * T * V * sizeof(float));
    int *chunk = xmalloc((size_t)B * T * sizeof(int));
    double worst = 0;
    int rc = full->forward(full, tok, B, T, 0, ref, 1, &err);
    // Steps: the prefill [0, P), one chunk of 3 (T > 1 at pos > 0), then one token at a time.
    for (int pos = 0; rc == 0 && pos < T;) {
        int n = pos == 0 ? P : (pos == P && T - pos > 3) ? 3 : 1;
        for (int b = 0; b < B; b++) memcpy(chunk + (size_t)b * n, tok + (size_t)b * T + pos, n * sizeof(int));
        rc = inc->forward(inc, chunk, B, n, pos, step, 0, &err);
        for (int b = 0; rc == 0 && b < B; b++) {
            double r = rel_l2(step + (size_t)b * V, ref + ((size_t)b * T + pos + n - 1) * V, V);
            if (r > worst) worst = r;
        }
        pos += n;
    }
    if (rc) CHECK(0, name, "forward: %s", err.msg);
    else CHECK(worst <= tol, name, "worst rel_l2 %.3g over the steps (tolerance %.0e)", worst, tol);
    if (rc == 0 && worst <= tol) printf("  %s: worst rel_l2 %.3g\n", name, worst);
    free(tok), free(ref), free(step), free(chunk);
    engine_free(full);
    engine_free(inc);
}

static void check_decode(const GPT2Model *m, Backend backend, const char *tag, int B, int T, int P) {
    check_decode_dt(m, backend, tag, B, T, P, DTYPE_F32, 1e-5);
}

// Generation's steps on the fused path: the prompt's forward with the first pick (three times: its
// forward graph captured and replayed), then a CUDA graph per batch size replayed at each position,
// greedy sampling on the device (the logits' kernel taking the pick where it can). Fed the same
// tokens (teacher forcing), each pick (the prompt's included) must be the argmax of that position in
// one full forward. The prompt's pick also sampled with top-k, its sampler inside the forward graph.
static void check_graph_decode(const GPT2Model *m, const char *tag, DType dt, int B, int T, int P) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_fused_graph_decode_%s_%s_B%d", tag, dtype_name(dt), B);
    Error err;
    int V = m->config.vocab_size;
    Engine *full, *inc;
    if (!make_engines(m, name, BACKEND_GPU, dt, BACKEND_GPU, dt, B, T, &full, &inc)) return;
    int *tok = random_tokens(B * T, V, 23 + B);
    float *ref = xmalloc((size_t)B * T * V * sizeof(float)), *logits = xmalloc((size_t)B * V * sizeof(float));
    int *col = xmalloc((size_t)B * P * sizeof(int)), *next = xmalloc(B * sizeof(int));
    Sampler greedy;
    sampler_create(&greedy, V, 0.0f, 40, 0.9f, 1);
    int rc = full->forward(full, tok, B, T, 0, ref, 1, &err), steps = 0, wrong = 0;
    for (int b = 0; b < B; b++) memcpy(col + (size_t)b * P, tok + (size_t)b * T, P * sizeof(int));
    // The prompt's pick three times: eager, then captured as a forward graph, then replayed.
    for (int call = 0; rc == 0 && call < 3; call++) {
        rc = engine_decode(inc, col, B, P, 0, &greedy, logits, next, &err);
        for (int b = 0; rc == 0 && b < B; b++) wrong += next[b] != argmax(ref + ((size_t)b * T + P - 1) * V, V);
    }
    // And sampled (top-k 40) three times with the same draws: the graph holds the sampler, so the
    // replays must pick what the eager call did, each among the row's 40 largest logits.
    int *first = xmalloc(B * sizeof(int)), sampled_wrong = 0;
    for (int call = 0; rc == 0 && call < 3; call++) {
        Sampler topk;
        sampler_create(&topk, V, 1.0f, 40, 0.9f, 7);
        rc = engine_decode(inc, col, B, P, 0, &topk, logits, next, &err);
        sampler_free(&topk);
        for (int b = 0; rc == 0 && b < B; b++) {
            const float *row = ref + ((size_t)b * T + P - 1) * V;
            int above = 0;
            for (int i = 0; next[b] >= 0 && next[b] < V && i < V; i++)
                above += row[i] > row[next[b]] + 1e-4f * (fabsf(row[next[b]]) + 1.0f);
            if (call == 0) first[b] = next[b];
            sampled_wrong += next[b] < 0 || next[b] >= V || above >= 40 || next[b] != first[b];
        }
    }
    for (int pos = P; rc == 0 && pos < T; pos++, steps++) {
        for (int b = 0; b < B; b++) col[b] = tok[(size_t)b * T + pos];
        rc = engine_decode(inc, col, B, 1, pos, &greedy, logits, next, &err);
        for (int b = 0; rc == 0 && b < B; b++) wrong += next[b] != argmax(ref + ((size_t)b * T + pos) * V, V);
    }
    if (rc) CHECK(0, name, "%s", err.msg);
    else CHECK(wrong == 0 && sampled_wrong == 0, name,
               "%d of %d greedy picks differ from the full forward's argmax; %d of %d sampled prompt picks outside "
               "the top 40 or not the eager call's",
               wrong, (steps + 3) * B, sampled_wrong, 3 * B);
    sampler_free(&greedy);
    free(tok), free(ref), free(logits), free(col), free(next), free(first);
    engine_free(full);
    engine_free(inc);
}

// Generation's steps queued ahead of their picks (engine_decode_steps): the prompt's pick, then every
// later step fed the one before's ids where its pick left them, against the same steps fed from the
// host one at a time (engine_decode) on a second engine with the same sampler seed: every pick the
// same. With top_k 0 and a temperature the device cannot sample, so nothing is queued and the steps
// run one by one. Greedy runs also stop halfway (the step queued past the stop dropped) and go on
// with one host-fed step, which must pick what the second engine picked there.
typedef struct {
    int *picks;  // [steps, B]
    int B, steps, stop_after;
} Recorded;

static int record_step(void *user, const int *next) {
    Recorded *r = user;
    memcpy(r->picks + (size_t)r->steps * r->B, next, r->B * sizeof(int));
    return ++r->steps == r->stop_after;
}

static void check_queued_steps(const GPT2Model *m, Backend backend, const char *tag, DType dt, int B, int T, int P,
                               float temperature, int top_k) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_%s_queued_steps_%s_%s_B%d_%s", path_name(backend), tag, dtype_name(dt), B,
             temperature <= 0.0f ? "greedy" : top_k ? "top_k" : "host_sampler");
    Error err;
    int V = m->config.vocab_size, n = T - P;
    Engine *q, *h;
    if (!make_engines(m, name, backend, dt, backend, dt, B, T, &q, &h)) return;
    int *prompt = random_tokens(B * P, V, 31 + B), *first = xmalloc(B * sizeof(int)), *next = xmalloc(B * sizeof(int));
    int *want = xmalloc((size_t)n * B * sizeof(int));
    float *logits = xmalloc((size_t)B * V * sizeof(float));
    Recorded all = {xmalloc((size_t)n * B * sizeof(int)), B, 0, 0};
    Recorded half = {xmalloc((size_t)n * B * sizeof(int)), B, 0, n / 2};
    Sampler sq, sh;
    sampler_create(&sq, V, temperature, top_k, 0.9f, 9);
    sampler_create(&sh, V, temperature, top_k, 0.9f, 9);
    // The host-fed steps.
    int rc = engine_decode(h, prompt, B, P, 0, &sh, logits, first, &err);
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = engine_decode(h, i ? want + (size_t)(i - 1) * B : first, B, 1, P + i, &sh, logits, want + (size_t)i * B,
                           &err);
    }
    // The queued ones, all n, then (greedy) half of them and one host-fed step after.
    if (rc == 0) rc = engine_decode(q, prompt, B, P, 0, &sq, logits, first, &err);
    if (rc == 0) rc = engine_decode_steps(q, first, B, P, n, &sq, logits, next, record_step, &all, &err);
    int wrong = 0, after_stop = 0, greedy = temperature <= 0.0f;
    for (int i = 0; rc == 0 && i < all.steps * B; i++) wrong += all.picks[i] != want[i];
    if (rc == 0 && greedy) {
        rc = engine_decode(q, prompt, B, P, 0, &sq, logits, first, &err);
        if (rc == 0) rc = engine_decode_steps(q, first, B, P, n, &sq, logits, next, record_step, &half, &err);
        for (int i = 0; rc == 0 && i < half.steps * B; i++) wrong += half.picks[i] != want[i];
        if (rc == 0)
            rc = engine_decode(q, half.picks + (size_t)(half.steps - 1) * B, B, 1, P + half.steps, &sq, logits, next,
                               &err);
        for (int b = 0; rc == 0 && b < B; b++) after_stop += next[b] != want[(size_t)half.steps * B + b];
    }
    if (rc) CHECK(0, name, "%s", err.msg);
    else CHECK(all.steps == n && (!greedy || half.steps == n / 2) && wrong == 0 && after_stop == 0, name,
               "%d of %d steps run (%d of %d when stopped halfway); %d picks differ from the host-fed steps', "
               "%d after the stop",
               all.steps, n, half.steps, n / 2, wrong, after_stop);
    sampler_free(&sq), sampler_free(&sh);
    free(prompt), free(first), free(next), free(want), free(logits), free(all.picks), free(half.picks);
    engine_free(q);
    engine_free(h);
}

// GPT2_GRAPH_DOT=PREFIX while one forward graph was captured: exactly one PREFIX.N.dot, naming the
// forward's first kernel. The directory is removed.
static void check_graph_dot(const char *name, const char *dir) {
    char pattern[96], test[200];
    snprintf(pattern, sizeof(pattern), "%s/g.*.dot", dir);
    snprintf(test, sizeof(test), "%s GPT2_GRAPH_DOT", name);
    glob_t found;
    const int files = glob(pattern, 0, NULL, &found) == 0 ? (int)found.gl_pathc : 0;
    int names_embedding = 0;
    for (int i = 0; i < files; i++) {
        FILE *f = fopen(found.gl_pathv[i], "r");
        char line[4096];
        while (f && fgets(line, sizeof(line), f))
            if (strstr(line, "embedding_kernel")) names_embedding = 1;
        if (f) fclose(f);
        remove(found.gl_pathv[i]);
    }
    if (files) globfree(&found);
    rmdir(dir);
    CHECK(files == 1 && names_embedding, test, "%d graph files, embedding kernel named: %d", files, names_embedding);
}

// Forwards of a repeated shape (kernels/gpu_engine.cu, "Forward graphs"): the first runs eagerly, the
// second is captured and replayed, later ones replay. Against an engine without graphs
// (GPT2_FORWARD_GRAPH=0), bit for bit: three forwards of one shape after a cached prefix of P
// tokens, the third with other tokens (they must reach the graph), then one decode step through
// forward (the cache the graphs wrote).
static void check_forward_graph(const GPT2Model *m, const char *tag, DType dt, int B, int T, int P) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_fused_forward_graph_%s_%s_B%d_T%d_P%d", tag, dtype_name(dt), B, T, P);
    Error err;
    const int V = m->config.vocab_size, S = P + T + 1;
    setenv("GPT2_FORWARD_GRAPH", "0", 1);
    Engine *plain = make_engine(m, BACKEND_GPU, dt, B, S, &err);
    unsetenv("GPT2_FORWARD_GRAPH");
    Engine *graphed = plain ? make_engine(m, BACKEND_GPU, dt, B, S, &err) : NULL;
    if (!plain || !graphed) {
        CHECK(0, name, "engine_create: %s", err.msg);
        engine_free(plain);
        return;
    }
    int *tok = random_tokens(B * S, V, 31 + B), *other = random_tokens(B * T, V, 37 + B);
    const size_t n = (size_t)B * T * V;
    float *want = xmalloc(n * sizeof(float)), *want2 = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    int rc = 0, differ = 0;
    GpuGraphStats a = {0}, b = {0};
    Engine *both[2] = {plain, graphed};
    char dot_dir[] = "/tmp/gpt2_graph_dot_XXXXXX", dot_prefix[64];
    const int dot = mkdtemp(dot_dir) != NULL;
    snprintf(dot_prefix, sizeof(dot_prefix), "%s/g", dot_dir);
    for (int e = 0; e < 2 && rc == 0; e++) {
        Engine *x = both[e];
        if (P > 0) rc = x->forward(x, tok, B, P, 0, NULL, 0, &err);
        if (e == 1) gpu_engine_graph_stats(x, &a);
        if (e == 1 && dot) setenv("GPT2_GRAPH_DOT", dot_prefix, 1);  // the capture is written out
        for (int call = 0; call < 3 && rc == 0; call++) {
            float *out = e == 0 ? (call == 0 ? want : call == 2 ? want2 : got) : got;
            rc = x->forward(x, call == 2 ? other : tok + (size_t)B * P, B, T, P, out, 1, &err);
            if (rc == 0 && e == 1) differ += memcmp(got, call == 2 ? want2 : want, n * sizeof(float)) != 0;
        }
        unsetenv("GPT2_GRAPH_DOT");
        if (e == 1) gpu_engine_graph_stats(x, &b);
    }
    if (dot) check_graph_dot(name, dot_dir);
    // One step after the graphed forwards: the cache at P .. P+T-1 holds `other`'s keys on both.
    for (int e = 0; e < 2 && rc == 0; e++) {
        rc = both[e]->forward(both[e], tok, B, 1, P + T, e == 0 ? want : got, 0, &err);
        if (rc == 0 && e == 1) differ += 10 * (memcmp(got, want, (size_t)B * V * sizeof(float)) != 0);
    }
    if (rc) CHECK(0, name, "%s", err.msg);
    else
        CHECK(differ == 0 && b.forward_captures == a.forward_captures + 1 && b.forward_replays == a.forward_replays + 2,
              name, "differ %d (1s: forwards, 10s: the step after), captures %lld -> %lld, replays %lld -> %lld",
              differ, a.forward_captures, b.forward_captures, a.forward_replays, b.forward_replays);
    GpuGraphStats none;
    gpu_engine_graph_stats(plain, &none);
    CHECK(none.forward_captures == 0 && none.forward_replays == 0, "gpu_fused_forward_graph GPT2_FORWARD_GRAPH=0",
          "captures %lld, replays %lld", none.forward_captures, none.forward_replays);
    free(tok), free(other), free(want), free(want2), free(got);
    engine_free(plain);
    engine_free(graphed);
}

// bf16 compute (an fp32 checkpoint converted at upload) against fp32, both on the GPU.
static void check_bf16(const GPT2Model *m, const char *tag, int B, int T) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_reference_%s_bf16_vs_fp32", tag);
    Error err;
    int V = m->config.vocab_size;
    Engine *a, *b;
    if (!make_engines(m, name, BACKEND_GPU_REFERENCE, DTYPE_F32, BACKEND_GPU_REFERENCE, DTYPE_BF16, B, T, &a, &b))
        return;
    int *tok = random_tokens(B * T, V, 3);
    float *la = xmalloc((size_t)B * T * V * sizeof(float)), *lb = xmalloc((size_t)B * T * V * sizeof(float));
    int rc = a->forward(a, tok, B, T, 0, la, 1, &err);
    if (rc == 0) rc = b->forward(b, tok, B, T, 0, lb, 1, &err);
    if (rc) {
        CHECK(0, name, "forward: %s", err.msg);
    } else {
        double r = rel_l2(lb, la, (size_t)B * T * V), agree = argmax_agreement(lb, la, B * T, V);
        CHECK(r <= 3e-2 && agree >= 0.90, name, "rel_l2 %.3g (tolerance 3e-2), argmax agreement %.1f%%", r,
              100 * agree);
        printf("  %s: rel_l2 %.3g, argmax agreement %.1f%%\n", name, r, 100 * agree);
        // Where bf16 picks another token, how close the two were in fp32 (near-ties flip).
        for (int row = 0; row < B * T; row++) {
            const float *fa = la + (size_t)row * V, *fb = lb + (size_t)row * V;
            int ia = argmax(fa, V), ib = argmax(fb, V);
            if (ia == ib) continue;
            double mean = 0, var = 0;
            for (int i = 0; i < V; i++) mean += fa[i];
            mean /= V;
            for (int i = 0; i < V; i++) var += (fa[i] - mean) * (fa[i] - mean);
            printf("    row %d: fp32 top %d vs bf16 top %d, fp32 gap %.4f = %.4f logit std\n", row, ia, ib,
                   fa[ia] - fa[ib], (fa[ia] - fa[ib]) / sqrt(var / V));
        }
    }
    // The last-token logits are the last rows of the all-positions logits.
    float *last = xmalloc((size_t)B * V * sizeof(float));
    snprintf(name, sizeof(name), "gpu_reference_%s_last_token_rows", tag);
    rc = a->forward(a, tok, B, T, 0, last, 0, &err);
    double worst = 0;
    for (int i = 0; rc == 0 && i < B; i++) {
        double r = rel_l2(last + (size_t)i * V, la + ((size_t)i * T + T - 1) * V, V);
        if (r > worst) worst = r;
    }
    if (rc) CHECK(0, name, "forward: %s", err.msg);
    else CHECK(worst <= 1e-6, name, "rel_l2 %.3g between last-token and all-position logits", worst);
    free(tok), free(la), free(lb), free(last);
    engine_free(a);
    engine_free(b);
}

// s_n = sum_k W_nk gamma_k and b'_n = sum_k W_nk beta_k + b_n, from the weights as stored.
static void check_folded(const GPT2Model *m, const char *tag, DType dt) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_ln_fold_%s_%s", tag, dtype_name(dt));
    Error err;
    Engine *e = make_engine(m, BACKEND_GPU_REFERENCE, dt, 1, 8, &err);
    if (!e) {
        CHECK(0, name, "engine_create: %s", err.msg);
        return;
    }
    const GPT2Config *c = &m->config;
    int C = c->channels, L = c->num_layers;
    size_t nmax = (size_t)(4 * C > c->padded_vocab_size ? 4 * C : c->padded_vocab_size);
    float *s = xmalloc(nmax * sizeof(float)), *b = xmalloc(nmax * sizeof(float));
    double worst = 0;
    int rc = 0;
    for (int which = 0; which < 3 && rc == 0; which++) {
        int l = which == 2 ? 0 : L - 1;
        int N = which == 0 ? 3 * C : which == 1 ? 4 * C : c->padded_vocab_size;
        int wp = which == 0 ? PARAM_QKVW : which == 1 ? PARAM_FCW : PARAM_WTE;
        int gp = which == 0 ? PARAM_LN1W : which == 1 ? PARAM_LN2W : PARAM_LNFW;
        int bp = which == 0 ? PARAM_QKVB : which == 1 ? PARAM_FCB : -1;
        size_t woff = which == 2 ? 0 : (size_t)l * N * C, goff = which == 2 ? 0 : (size_t)l * C;
        rc = gpu_engine_copy_folded(e, which, l, s, b, &err);
        for (int n = 0; rc == 0 && n < N; n++) {
            double ws = 0, wb = 0, scale = 0;
            for (int k = 0; k < C; k++) {
                float w = gpt2_param_get(m, wp, woff + (size_t)n * C + k);
                if (dt == DTYPE_BF16) w = bf16_to_float(float_to_bf16(w));
                ws += (double)w * gpt2_param_get(m, gp, goff + k);
                wb += (double)w * gpt2_param_get(m, gp + 1, goff + k);
                scale += fabs(w) * (1.0 + fabs(gpt2_param_get(m, gp, goff + k)));
            }
            if (bp >= 0) wb += gpt2_param_get(m, bp, (which == 2 ? 0 : (size_t)l * N) + n);
            double e1 = fabs(s[n] - ws) / (scale + 1e-30), e2 = fabs(b[n] - wb) / (scale + 1e-30);
            if (e1 > worst) worst = e1;
            if (e2 > worst) worst = e2;
        }
    }
    if (rc) CHECK(0, name, "%s", err.msg);
    else CHECK(worst <= 1e-5, name, "worst error %.3g relative to sum |W|(1+|gamma|)", worst);
    free(s), free(b);
    engine_free(e);
}

// A prompt's last-token logits do not hang on what the engine ran before: the same prompt on a fresh
// engine and after a prompt and a step of other tokens, bit for bit, in bf16. B within the LayerNorm
// fold's rows and B * T past them: on Hopper the last layer's rows, gathered one a sequence, fold their
// LayerNorms while qkv, over all B * T rows, did not (its means would be the earlier step's).
static void check_prompt_repeats(const GPT2Model *m, const char *tag, int B, int T) {
    char name[160];
    snprintf(name, sizeof(name), "gpu_fused_prompt_repeats_%s_bf16_B%d_T%d", tag, B, T);
    Error err;
    const int V = m->config.vocab_size;
    Engine *fresh, *used;
    if (!make_engines(m, name, BACKEND_GPU, DTYPE_BF16, BACKEND_GPU, DTYPE_BF16, B, T + 1, &fresh, &used)) return;
    int *tok = random_tokens(B * T, V, 41 + B), *other = random_tokens(B * (T + 1), V, 43 + B);
    const size_t n = (size_t)B * V;
    float *want = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    int rc = fresh->forward(fresh, tok, B, T, 0, want, 0, &err);
    if (rc == 0) rc = used->forward(used, other, B, T, 0, got, 0, &err);
    if (rc == 0) rc = used->forward(used, other + (size_t)B * T, B, 1, T, got, 0, &err);
    if (rc == 0) rc = used->forward(used, tok, B, T, 0, got, 0, &err);
    size_t differ = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    if (rc) CHECK(0, name, "forward: %s", err.msg);
    else CHECK(differ == 0, name, "%zu of %zu logits differ from the fresh engine's", differ, n);
    free(tok), free(other), free(want), free(got);
    engine_free(fresh);
    engine_free(used);
}

static int trace_calls, trace_bad;
static void on_trace(void *user, int layer, const float *x, int B, int T, int C) {
    (void)user;
    if (layer != trace_calls - 1) trace_bad = 1;
    for (size_t i = 0; i < (size_t)B * T * C; i++)
        if (!isfinite(x[i])) trace_bad = 1;
    trace_calls++;
}

static void check_trace(const GPT2Model *m) {
    Error err;
    int V = m->config.vocab_size, B = 2, T = 7;
    Engine *e = make_engine(m, BACKEND_GPU_REFERENCE, DTYPE_F32, B, T, &err);
    if (!e) {
        CHECK(0, "gpu_forward_trace", "engine_create: %s", err.msg);
        return;
    }
    int *tok = random_tokens(B * T, V, 9);
    float *a = xmalloc((size_t)B * V * sizeof(float)), *b = xmalloc((size_t)B * V * sizeof(float));
    int rc = e->forward(e, tok, B, T, 0, a, 0, &err);
    if (rc == 0) rc = gpu_engine_forward_trace(e, tok, B, T, 0, b, 0, on_trace, NULL, &err);
    if (rc) CHECK(0, "gpu_forward_trace", "%s", err.msg);
    else
        CHECK(trace_calls == m->config.num_layers + 1 && !trace_bad && rel_l2(b, a, (size_t)B * V) == 0.0,
              "gpu_forward_trace", "%d calls for %d layers (want L + 1), bad=%d, logits rel %.3g", trace_calls,
              m->config.num_layers, trace_bad, rel_l2(b, a, (size_t)B * V));
    GpuProfile prof = {0};
    rc = gpu_engine_profile(e, &prof, &err);
    for (int i = 0; rc == 0 && i < 2; i++) rc = e->forward(e, tok, B, T, 0, b, 0, &err);
    if (rc == 0) rc = gpu_engine_profile(e, NULL, &err);
    if (rc == 0) rc = e->forward(e, tok, B, T, 0, b, 0, &err);  // not counted
    double total = 0;
    int negative = 0;
    for (int k = 0; k < GPU_PROF_KINDS; k++) total += prof.ms[k], negative |= prof.ms[k] < 0;
    if (rc) CHECK(0, "gpu_profile", "%s", err.msg);
    else CHECK(prof.forwards == 2 && total > 0 && !negative && prof.ms[GPU_PROF_ATTENTION] > 0, "gpu_profile",
               "forwards %d, total %.3f ms, attention %.3f ms", prof.forwards, total, prof.ms[GPU_PROF_ATTENTION]);
    free(tok), free(a), free(b);
    engine_free(e);
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static void check_errors(const GPT2Model *m) {
    Error err = {{0}};
    int V = m->config.vocab_size;
    Engine *e = make_engine(m, BACKEND_GPU_REFERENCE, DTYPE_F32, 2, 16, &err);
    if (!e) {
        CHECK(0, "gpu_errors", "engine_create: %s", err.msg);
        return;
    }
    int tok[64] = {0};
    float *lg = xmalloc((size_t)64 * V * sizeof(float));
    CHECK(e->forward(e, tok, 3, 1, 0, lg, 0, &err) == -1 && contains(err.msg, "batch"), "gpu_error_batch",
          "got '%s'", err.msg);
    CHECK(e->forward(e, tok, 1, 4, 14, lg, 0, &err) == -1 && contains(err.msg, "context"), "gpu_error_context",
          "got '%s'", err.msg);
    tok[1] = V;
    CHECK(e->forward(e, tok, 1, 2, 0, lg, 0, &err) == -1 && contains(err.msg, "vocabulary"), "gpu_error_token",
          "got '%s'", err.msg);
    tok[1] = 0;
    CHECK(e->forward(e, tok, 2, 16, 0, lg, 1, &err) == 0, "gpu_after_errors", "forward failed: %s", err.msg);
    engine_free(e);

    // Far more than any GPU holds: a clean error naming the sizes, and the device still usable.
    // (Not under compute-sanitizer, which counts the failed cudaMalloc as an API error.)
    if (getenv("GPT2_NO_OOM_TEST")) {
        test_skip("gpu_oom_error", "GPT2_NO_OOM_TEST is set");
    } else {
        Engine *big = make_engine(m, BACKEND_GPU_REFERENCE, DTYPE_F32, 1 << 20, m->config.max_seq_len, &err);
        CHECK(!big && contains(err.msg, "CUDA out of memory allocating") && contains(err.msg, "MiB of"),
              "gpu_oom_error", "got %s: '%s'", big ? "an engine" : "NULL", err.msg);
        if (!big) printf("  gpu_oom_error: %s\n", err.msg);
        engine_free(big);
    }
    Engine *again = make_engine(m, BACKEND_GPU_REFERENCE, DTYPE_F32, 1, 8, &err);
    CHECK(again && again->forward(again, tok, 1, 8, 0, lg, 0, &err) == 0, "gpu_usable_after_oom", "%s", err.msg);
    engine_free(again);

    free(lg);
}

int main(void) {
    Error why;
    if (!gpu_available(&why)) {
        char reason[600];
        snprintf(reason, sizeof(reason), "no GPU (%s)", why.msg);
        test_skip("gpu_engine", reason);
        return 0;
    }
    Shape shapes[] = {
        {"small", {.max_seq_len = 64, .vocab_size = 512, .padded_vocab_size = 512, .num_layers = 2, .num_heads = 4,
                   .channels = 128}},
        // C not a multiple of 64, NH not a power of two, HS odd, V and Vp not multiples of 128.
        {"odd", {.max_seq_len = 40, .vocab_size = 1001, .padded_vocab_size = 1003, .num_layers = 3, .num_heads = 6,
                 .channels = 150}},
        // One head of 1 channel, one layer: the degenerate end.
        {"tiny", {.max_seq_len = 9, .vocab_size = 7, .padded_vocab_size = 8, .num_layers = 1, .num_heads = 3,
                  .channels = 3}},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        GPT2Model m;
        make_model(&m, shapes[i].config, DTYPE_F32, 100 + i, 0.08f);
        const char *tag = shapes[i].name;
        int T = shapes[i].config.max_seq_len;
        for (Backend be = BACKEND_GPU; be <= BACKEND_GPU_REFERENCE; be++) {
            check_against_cpu(&m, be, tag, DTYPE_F32, 1e-5, 2, T);
            check_decode(&m, be, tag, 1, T, T / 3 > 0 ? T / 3 : 1);
            check_decode(&m, be, tag, 3, T, T / 3 > 0 ? T / 3 : 1);
            // 9 sequences: a prompt's last layer runs on each sequence's last row, moved to the front
            // eight rows at a time (last_rows.cu), so two groups and a partial one.
            if (i == 0) check_decode(&m, be, tag, 9, T, T / 3);
        }
        check_graph_decode(&m, tag, DTYPE_F32, 1, T, T / 3 > 0 ? T / 3 : 1);
        if (i == 0) {
            // Greedy at 1 row (the GEMV's pick in bf16 on Hopper) and 40 (logits_rows's), top-k on the
            // device, the host's sampler, and the reference path (its steps enqueued, not replayed).
            check_queued_steps(&m, BACKEND_GPU, tag, DTYPE_BF16, 1, T, T / 3, 0.0f, 40);
            check_queued_steps(&m, BACKEND_GPU, tag, DTYPE_BF16, 40, T, T / 3, 0.0f, 40);
            check_queued_steps(&m, BACKEND_GPU, tag, DTYPE_F32, 3, T, T / 3, 1.0f, 40);
            check_queued_steps(&m, BACKEND_GPU, tag, DTYPE_F32, 2, T, T / 3, 1.0f, 0);
            check_queued_steps(&m, BACKEND_GPU_REFERENCE, tag, DTYPE_F32, 2, T, T / 3, 0.0f, 40);
        }
        // 20 rows: the projections on cuBLAS; qkv and fc on the fp32 rows kernel where it takes them
        // (its block fits, K a multiple of 4: "small"), else the LayerNorm kernel and cuBLAS ("odd", "tiny").
        check_graph_decode(&m, tag, DTYPE_F32, 20, T, T / 3 > 0 ? T / 3 : 1);
        if (i < 2) check_bf16(&m, tag, 2, T);
        // 40 rows in bf16: past the cluster GEMV, so the attention reads the many-row route's qkv
        // product (on Hopper the LayerNorms folded into qkv and fc: gemm_rows_fold, two row tiles, c
        // from the other product's means in layer 1).
        if (i == 0) check_decode_dt(&m, BACKEND_GPU, tag, 40, T, T / 3, DTYPE_BF16, 3e-2);
        if (i == 0) check_prompt_repeats(&m, tag, 24, 3);
        // 1, 2 and 8 rows in bf16: on Hopper qkv and fc through gemm_rows_ln (the LayerNorm inside, 1-16
        // rows, the rows shared over a cluster of 2 blocks) and the logits through logits_rows.
        if (i == 0) check_decode_dt(&m, BACKEND_GPU, tag, 8, T, T / 3, DTYPE_BF16, 3e-2);
        if (i == 0) check_decode_dt(&m, BACKEND_GPU, tag, 2, T, T / 3, DTYPE_BF16, 3e-2);
        if (i == 0) check_decode_dt(&m, BACKEND_GPU, tag, 1, T, T / 3, DTYPE_BF16, 3e-2);
        check_forward_graph(&m, tag, DTYPE_F32, 2, T / 2, T / 3);
        check_forward_graph(&m, tag, DTYPE_BF16, 3, T / 2 > 5 ? T / 2 : 5, 0);  // bf16 prefill: attention reads qkv
        check_folded(&m, tag, DTYPE_F32);
        check_folded(&m, tag, DTYPE_BF16);
        if (i == 0) check_trace(&m), check_errors(&m);
        gpt2_model_free(&m);
    }
    // Layers of GPT-2 medium (C 1024, NH 16), large (C 1280, NH 20), XL (C 1600, NH 25) and wider against
    // the CPU; a long context (1024 positions) decoded through the cache.
    Shape big[] = {
        {"medium_layer", {.max_seq_len = 48, .vocab_size = 600, .padded_vocab_size = 640, .num_layers = 2,
                          .num_heads = 16, .channels = 1024}},
        {"large_layer", {.max_seq_len = 24, .vocab_size = 500, .padded_vocab_size = 512, .num_layers = 1,
                         .num_heads = 20, .channels = 1280}},
        {"xl_layer", {.max_seq_len = 32, .vocab_size = 1000, .padded_vocab_size = 1024, .num_layers = 1,
                      .num_heads = 25, .channels = 1600}},
        // Wider than any GPT-2 (C 2304): the embedding kernel's LayerNorm on its strided path, past the
        // 2048 values its vectors take (past the fused rows: 24 rows in check_against_cpu).
        {"wide_layer", {.max_seq_len = 12, .vocab_size = 128, .padded_vocab_size = 128, .num_layers = 1,
                        .num_heads = 36, .channels = 2304}},
    };
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        GPT2Model m;
        make_model(&m, big[i].config, DTYPE_F32, 200 + i, 0.02f);
        for (Backend be = BACKEND_GPU; be <= BACKEND_GPU_REFERENCE; be++) {
            check_against_cpu(&m, be, big[i].name, DTYPE_F32, 1e-5, 2, big[i].config.max_seq_len);
            check_decode(&m, be, big[i].name, 2, big[i].config.max_seq_len, 5);
            // One sequence, both dtypes, at GPT-2's head size and widths: fp32 through the decode GEMVs;
            // bf16 on Hopper through gemm_rows_ln (medium: K = 1024, a cluster of 4; large: K = 1280,
            // ten float4s of a row a lane) and logits_rows.
            check_decode(&m, be, big[i].name, 1, big[i].config.max_seq_len, 5);
            check_decode_dt(&m, be, big[i].name, 1, big[i].config.max_seq_len, 5, DTYPE_BF16, 3e-2);
        }
        // 24 sequences in bf16 at GPT-2 medium's width: on Hopper the batched products through
        // gemm_rows, the LayerNorms folded into qkv and fc (gemm_rows_fold at K = 1024).
        if (i == 0) check_decode_dt(&m, BACKEND_GPU, big[i].name, 24, big[i].config.max_seq_len, 5, DTYPE_BF16, 3e-2);
        check_graph_decode(&m, big[i].name, DTYPE_F32, 1, big[i].config.max_seq_len, 5);
        gpt2_model_free(&m);
    }
    GPT2Model ml;
    make_model(&ml, (GPT2Config){.max_seq_len = 1024, .vocab_size = 300, .padded_vocab_size = 384, .num_layers = 2,
                                 .num_heads = 2, .channels = 128},
               DTYPE_F32, 300, 0.1f);
    for (Backend be = BACKEND_GPU; be <= BACKEND_GPU_REFERENCE; be++) {
        check_decode(&ml, be, "long1024", 1, 1024, 1000);
        check_decode(&ml, be, "long1024", 2, 1024, 1000);
    }
    check_graph_decode(&ml, "long1024", DTYPE_F32, 1, 1024, 900);
    gpt2_model_free(&ml);
    // GPT-2 124M's width (C 768, 12 heads) at a prompt's many rows in bf16: on Hopper the layer products
    // through gemm_tiles with the LayerNorms folded (129-1024 rows), against the CPU over 1000, 600, 400
    // and 200 positions, and a 900-token prompt decoded through the cache to 1024 against one forward.
    GPT2Model mw;
    make_model(&mw, (GPT2Config){.max_seq_len = 1024, .vocab_size = 300, .padded_vocab_size = 320, .num_layers = 2,
                                 .num_heads = 12, .channels = 768},
               DTYPE_F32, 400, 0.02f);
    check_against_cpu(&mw, BACKEND_GPU, "gpt2_width", DTYPE_BF16, 3e-2, 1, 1000);
    check_against_cpu(&mw, BACKEND_GPU, "gpt2_width_T600", DTYPE_BF16, 3e-2, 1, 600);
    check_against_cpu(&mw, BACKEND_GPU, "gpt2_width_T400", DTYPE_BF16, 3e-2, 1, 400);
    check_against_cpu(&mw, BACKEND_GPU, "gpt2_width_T200", DTYPE_BF16, 3e-2, 1, 200);
    check_decode_dt(&mw, BACKEND_GPU, "gpt2_width", 1, 1024, 900, DTYPE_BF16, 3e-2);
    gpt2_model_free(&mw);
    // A bf16 checkpoint: run as bf16 (no conversion) and as fp32 (widened at upload, then exact).
    GPT2Model mb;
    make_model(&mb, shapes[1].config, DTYPE_BF16, 7, 0.08f);
    for (Backend be = BACKEND_GPU; be <= BACKEND_GPU_REFERENCE; be++) {
        check_against_cpu(&mb, be, "bf16ckpt", DTYPE_F32, 1e-5, 2, 24);
        check_against_cpu(&mb, be, "bf16ckpt", DTYPE_BF16, 3e-2, 2, 24);
    }
    gpt2_model_free(&mb);
    return test_exit_code();
}
#endif
