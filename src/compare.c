// ./gpt2 compare: runs the fused and the reference GPU paths on the same tokens and prints the
// largest difference of the residual stream after the embedding, after every block, and at the
// logits, so a regression in one kernel shows up at the block where it starts.
#include <math.h>

#include "cli.h"
#include "commands.h"
#include "engine.h"
#ifdef GPT2_CUDA
#include "gpu_engine.h"
#endif

static void usage(void) {
    fprintf(stderr,
            "usage: gpt2 compare [-m MODEL] [-B 1] [-T 64] [--dtype fp32|bf16] [-s SEED]\n"
            "Runs B sequences of T random tokens (seeded) through the fused and the reference GPU paths\n"
            "and prints, after the embedding and after every block, the largest absolute difference of\n"
            "the residual stream and that difference relative to the reference's largest magnitude; then\n"
            "the logits' max_abs_err, rel_l2_err and argmax agreement.\n");
}

#ifdef GPT2_CUDA
typedef struct {
    float *blocks;  // [L + 1][rows * C]: the reference's residual stream after the embedding and each block
    size_t block_elems;
    int recording;  // 1 while the reference runs, 0 while the fused path is compared against it
} Trace;

static void on_block(void *user, int layer, const float *residual, int B, int T, int C) {
    Trace *t = user;
    float *ref = t->blocks + (size_t)(layer + 1) * t->block_elems;
    size_t n = (size_t)B * T * C;
    if (t->recording) {
        memcpy(ref, residual, n * sizeof(float));
        return;
    }
    double max_abs = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        max_abs = fmax(max_abs, fabs((double)residual[i] - ref[i]));
        max_ref = fmax(max_ref, fabs((double)ref[i]));
    }
    printf("%-10s layer %3d  max_abs_diff=%-12.4g relative=%.3g\n", layer < 0 ? "embedding" : "block", layer,
           max_abs, max_abs / (max_ref > 0 ? max_ref : 1.0));
}
#endif

int cmd_compare(int argc, char **argv) {
    const char *model_path = gpt2_default_model_path();
    int B = 1, T = 64, dtype = -1;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(), 0;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-B")) B = (int)cli_int(cli_value(argc, argv, &i), a, 1, 1024);
        else if (!strcmp(a, "-T")) T = (int)cli_int(cli_value(argc, argv, &i), a, 1, 65536);
        else if (!strcmp(a, "--dtype")) dtype = cli_dtype(cli_value(argc, argv, &i), a);
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) seed = (uint64_t)cli_int(cli_value(argc, argv, &i), a, 0, __LONG_MAX__);
        else cli_usage_error("compare: unknown argument '%s'", a);
    }
#ifndef GPT2_CUDA
    (void)model_path, (void)B, (void)T, (void)dtype, (void)seed;
    die("compare: this gpt2 was built without CUDA; compare needs the GPU paths");
#else
    Error err;
    GPT2Model model;
    if (gpt2_model_load(&model, model_path, &err)) die("%s", err.msg);
    const GPT2Config *c = &model.config;
    if (T > c->max_seq_len) die("compare: -T %d is longer than the model's context %d", T, c->max_seq_len);
    EngineOptions opt = {.backend = BACKEND_GPU_REFERENCE, .dtype = dtype < 0 ? model.dtype : (DType)dtype,
                         .max_batch = B, .max_seq = T};
    Engine *reference = engine_create(&model, &opt, &err);
    if (!reference) die("%s", err.msg);
    opt.backend = BACKEND_GPU;
    Engine *fused = engine_create(&model, &opt, &err);
    if (!fused) die("%s", err.msg);

    size_t rows = (size_t)B * T, V = (size_t)c->vocab_size;
    int *tokens = xmalloc(rows * sizeof(int));
    Sampler rng = {.rng_state = seed ? seed : 1};
    for (size_t i = 0; i < rows; i++) tokens[i] = (int)(sampler_draw(&rng) * c->vocab_size) % c->vocab_size;
    Trace trace = {.block_elems = rows * c->channels, .recording = 1};
    trace.blocks = xmalloc((size_t)(c->num_layers + 1) * trace.block_elems * sizeof(float));
    float *ref_logits = xmalloc(rows * V * sizeof(float)), *logits = xmalloc(rows * V * sizeof(float));

    printf("compare: %s vs %s, %s, B=%d T=%d\n", fused->name, reference->name, dtype_name(fused->dtype), B, T);
    if (gpu_engine_forward_trace(reference, tokens, B, T, 0, ref_logits, 1, on_block, &trace, &err))
        die("%s", err.msg);
    trace.recording = 0;
    if (gpu_engine_forward_trace(fused, tokens, B, T, 0, logits, 1, on_block, &trace, &err)) die("%s", err.msg);

    double max_abs = 0.0, d2 = 0.0, r2 = 0.0;
    size_t agree = 0;
    for (size_t r = 0; r < rows; r++) {
        int best = 0, ref_best = 0;
        for (size_t i = 0; i < V; i++) {
            double a = logits[r * V + i], b = ref_logits[r * V + i];
            max_abs = fmax(max_abs, fabs(a - b));
            d2 += (a - b) * (a - b), r2 += b * b;
            if (a > logits[r * V + best]) best = (int)i;
            if (b > ref_logits[r * V + ref_best]) ref_best = (int)i;
        }
        agree += best == ref_best;
    }
    printf("logits     max_abs_err=%.4g rel_l2_err=%.4g argmax_agree=%.2f%%\n", max_abs, sqrt(d2 / (r2 > 0 ? r2 : 1)),
           100.0 * agree / rows);

    free(tokens), free(trace.blocks), free(ref_logits), free(logits);
    engine_free(fused);
    engine_free(reference);
    gpt2_model_free(&model);
    return 0;
#endif
}
