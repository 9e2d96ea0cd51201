// Choosing the engine: the CPU path, or the GPU engine with its fused or reference op table. The
// GPU side is reached only through kernels/gpu_engine.h, and only in a CUDA build (GPT2_CUDA).
#include "engine.h"

#ifdef GPT2_CUDA
#include "gpu_engine.h"
#endif

// 1 when the GPU engine can run here; else 0 and the reason in err.
static int gpu_usable(Error *err) {
#ifdef GPT2_CUDA
    return gpu_available(err);
#else
    return fail(err, "this gpt2 was built without CUDA"), 0;
#endif
}

static Engine *gpu_create(const GPT2Model *model, const EngineOptions *opt, Error *err) {
#ifdef GPT2_CUDA
    return gpu_engine_create(model, opt, err);
#else
    (void)model, (void)opt;
    fail(err, "this gpt2 was built without CUDA (make GPU=1 with nvcc on the PATH)");
    return NULL;
#endif
}

Engine *engine_create(const GPT2Model *model, const EngineOptions *opt, Error *err) {
    const GPT2Config *c = &model->config;
    if (opt->max_batch < 0 || opt->max_seq < 0 || opt->max_seq > c->max_seq_len)
        return fail(err, "engine: batch %d / context %d outside 1.. / 1..%d", opt->max_batch, opt->max_seq,
                    c->max_seq_len),
               NULL;
    int max_batch = opt->max_batch > 0 ? opt->max_batch : 1;
    int max_seq = opt->max_seq > 0 ? opt->max_seq : c->max_seq_len;
    Error why;
    switch (opt->backend) {
    case BACKEND_CPU:
        return cpu_engine_create(model, max_batch, max_seq, err);
    case BACKEND_GPU:
    case BACKEND_GPU_REFERENCE:
        if (!gpu_usable(&why)) return fail(err, "no usable GPU (%s)", why.msg), NULL;
        return gpu_create(model, opt, err);
    case BACKEND_AUTO:
    default:
        if (!gpu_usable(&why)) {
            fprintf(stderr, "gpt2: no usable GPU (%s); running on the CPU\n", why.msg);
            return cpu_engine_create(model, max_batch, max_seq, err);
        }
        EngineOptions gpu = *opt;
        gpu.backend = BACKEND_GPU;  // the fused kernels
        return gpu_create(model, &gpu, err);
    }
}

void engine_free(Engine *e) {
    if (e) e->free(e);
}

// One step with the draws already made: the engine's own decode where it can, else forward and the
// host sampler.
static int decode_drawn(Engine *e, const int *tokens, int B, int T, int pos, Sampler *sampler, const float *u,
                        float *logits, int *next, Error *err) {
    if (e->decode) {
        int done = e->decode(e, tokens, B, T, pos, sampler, u, next, err);
        if (done != 0) return done < 0 ? -1 : 0;
    }
    if (e->forward(e, tokens, B, T, pos, logits, 0, err)) return -1;
    for (int b = 0; b < B; b++) next[b] = sampler_pick(sampler, logits + (size_t)b * e->config.vocab_size, u[b]);
    return 0;
}

static void draw(Sampler *sampler, float *u, int B) {
    for (int b = 0; b < B; b++) u[b] = sampler_draw(sampler);
}

int engine_decode(Engine *e, const int *tokens, int B, int T, int pos, Sampler *sampler, float *logits, int *next,
                  Error *err) {
    float u[B];
    draw(sampler, u, B);
    return decode_drawn(e, tokens, B, T, pos, sampler, u, logits, next, err);
}

int engine_decode_steps(Engine *e, const int *first, int B, int pos, int n, Sampler *sampler, float *logits,
                        int *next, StepFn on_step, void *user, Error *err) {
    if (n < 1) return 0;
    float u[B];
    draw(sampler, u, B);
    const char *knob = getenv("GPT2_QUEUE_STEPS");  // "0": step by step, for comparison
    int queued = e->queue_step && !(knob && !strcmp(knob, "0")) ? e->queue_step(e, B, pos, sampler, u, err) : 0;
    if (queued < 0) return -1;
    if (queued) {
        int spare[B];
        for (int i = 0; i < n; i++) {
            // Step i + 1 goes in before step i's picks are read.
            if (i + 1 < n) {
                draw(sampler, u, B);
                int rc = e->queue_step(e, B, pos + i + 1, sampler, u, err);
                if (rc != 1) {
                    if (rc == 0)
                        fail(err, "%s engine: the decode step at position %d could not be queued", e->name,
                             pos + i + 1);
                    Error ignored;
                    e->wait_step(e, spare, &ignored);  // step i: the engine is left with nothing queued
                    return -1;
                }
            }
            if (e->wait_step(e, next, err)) return -1;
            if (on_step(user, next)) return i + 1 < n ? e->wait_step(e, spare, err) : 0;
        }
        return 0;
    }
    int tokens[B];
    memcpy(tokens, first, sizeof(tokens));
    for (int i = 0; i < n; i++) {
        if (i > 0) draw(sampler, u, B);
        if (decode_drawn(e, tokens, B, 1, pos + i, sampler, u, logits, next, err)) return -1;
        if (on_step(user, next)) return 0;
        memcpy(tokens, next, sizeof(tokens));
    }
    return 0;
}
