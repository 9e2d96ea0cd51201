// ./gpt2 validate: runs the model on the tokens of a PyTorch logits dump and compares its logits.
//
// The dump uses llm.c's debug-state layout (so llm.c's own gpt2_124M_debug_state.bin works):
// 256 int32 header [0] magic 20240327, [1] version 2, [2] B, [3] T; then x int32[B*T],
// y int32[B*T] (targets), logits fp32[B*T*V] (V unpadded), loss fp32; anything after is ignored.
#include <math.h>

#include "cli.h"
#include "commands.h"
#include "engine.h"
#include "mapped_file.h"

enum { DUMP_HEADER_INTS = 256, DUMP_MAGIC = 20240327, DUMP_VERSION = 2 };

// The dump's arrays are read in place, from its mapping.
typedef struct {
    MappedFile file;
    int B, T;
    const int32_t *inputs;   // [B*T]
    const int32_t *targets;  // [B*T]
    const float *logits;     // [B*T*V]
    float loss;
} LogitsDump;

// ----------------------------------------------------------------------------
// Reading the dump

static int dump_load(LogitsDump *d, const char *path, const GPT2Config *c, Error *err) {
    memset(d, 0, sizeof(*d));
    MappedFile *f = &d->file;  // mapped_file refuses what is not a regular file (a FIFO included)
    if (mapped_file_open(f, path, err)) return -1;
    const int32_t *h = f->data;
    int rc = 0;
    if (f->bytes < DUMP_HEADER_INTS * sizeof(int32_t)) {
        rc = fail(err, "%s: truncated: shorter than the 1024-byte header", path);
    } else if (h[0] != DUMP_MAGIC) {
        rc = fail(err, "%s: bad magic %d (want %d): not a logits dump", path, h[0], DUMP_MAGIC);
    } else if (h[1] != DUMP_VERSION) {
        rc = fail(err, "%s: unsupported version %d (want %d)", path, h[1], DUMP_VERSION);
    } else if (h[2] < 1 || h[3] < 1 || h[3] > c->max_seq_len || h[2] > 4096) {
        rc = fail(err, "%s: B=%d T=%d: need B in 1..4096 and T in 1..%d (the model's context)", path, h[2], h[3],
                  c->max_seq_len);
    } else {
        d->B = h[2], d->T = h[3];
        size_t n = (size_t)d->B * d->T, V = (size_t)c->vocab_size;
        // The size first: the header's B and T place the arrays below.
        const size_t need = (DUMP_HEADER_INTS + 2 * n) * sizeof(int32_t) + (n * V + 1) * sizeof(float);
        if (f->bytes < need) {
            rc = fail(err, "%s: truncated: B=%d T=%d with V=%zu needs %zu bytes", path, d->B, d->T, V, need);
        } else {
            d->inputs = h + DUMP_HEADER_INTS;
            d->targets = d->inputs + n;
            d->logits = (const float *)(d->targets + n);
            d->loss = d->logits[n * V];
        }
        for (size_t i = 0; rc == 0 && i < n; i++)
            if (d->inputs[i] < 0 || d->inputs[i] >= c->vocab_size || d->targets[i] < -1 ||
                d->targets[i] >= c->vocab_size)
                rc = fail(err, "%s: token %d at %zu is outside the model's vocabulary of %d", path,
                          d->inputs[i] < 0 || d->inputs[i] >= c->vocab_size ? d->inputs[i] : d->targets[i], i,
                          c->vocab_size);
    }
    if (rc != 0) mapped_file_close(f);
    return rc;
}

static void dump_free(LogitsDump *d) { mapped_file_close(&d->file); }

// ----------------------------------------------------------------------------
// Comparing

// Mean cross-entropy of logits [n, V] against targets (-1: no target, skipped, as PyTorch's ignore_index).
static double mean_loss(const float *logits, const int *targets, size_t n, int V) {
    double total = 0.0;
    size_t counted = 0;
    for (size_t r = 0; r < n; r++) {
        if (targets[r] < 0) continue;
        const float *x = logits + r * V;
        double m = x[0], sum = 0.0;
        for (int i = 1; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int i = 0; i < V; i++) sum += exp(x[i] - m);
        total += log(sum) + m - x[targets[r]];
        counted++;
    }
    return counted ? total / counted : 0.0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void usage(void) {
    fprintf(stderr,
            "usage: gpt2 validate [-m MODEL] DUMP [options]\n"
            "Runs MODEL on the tokens of DUMP (llm.c debug-state layout, written by scripts/dump_logits.py)\n"
            "and compares its logits with the dump's. Prints max_abs_err, rel_l2_err, argmax agreement and\n"
            "the loss, then PASS or FAIL (exit 0 or 1).\n"
            "  -m, --model PATH   checkpoint: llm.c .bin, .safetensors, or a directory (default %s)\n"
            "  --cpu              the CPU path (the default without a GPU)\n"
            "  --gpu              the fused GPU path (the default with a GPU); no GPU is an error\n"
            "  --reference        the unfused GPU reference path\n"
            "  --dtype fp32|bf16  GPU compute type (default: the checkpoint's)\n"
            "  --tol F            largest rel_l2_err that passes (default 1e-4 on fp32 paths, 3e-2 on bf16;\n"
            "                     bf16 paths must also agree on >= 99%% of argmaxes)\n",
            gpt2_default_model_path());
}

int cmd_validate(int argc, char **argv) {
    const char *model_path = gpt2_default_model_path(), *dump_path = NULL;
    EngineOptions opt = {.backend = BACKEND_AUTO};
    int dtype = -1;  // -1: the checkpoint's own
    double tol = -1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(), 0;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--cpu")) opt.backend = BACKEND_CPU;
        else if (!strcmp(a, "--gpu")) opt.backend = BACKEND_GPU;
        else if (!strcmp(a, "--reference")) opt.backend = BACKEND_GPU_REFERENCE;
        else if (!strcmp(a, "--dtype")) dtype = cli_dtype(cli_value(argc, argv, &i), "--dtype");
        else if (!strcmp(a, "--tol")) tol = cli_double(cli_value(argc, argv, &i), "--tol", 0.0, 1e9);
        else if (a[0] == '-') cli_usage_error("validate: unknown option '%s'", a);
        else if (!dump_path) dump_path = a;
        else cli_usage_error("validate: more than one dump given ('%s')", a);
    }
    if (!dump_path) cli_usage_error("validate: no dump file given");

    Error err;
    GPT2Model model;
    if (gpt2_model_load(&model, model_path, &err)) die("%s", err.msg);
    opt.dtype = dtype < 0 ? model.dtype : (DType)dtype;
    LogitsDump dump;
    if (dump_load(&dump, dump_path, &model.config, &err)) die("%s", err.msg);
    opt.max_batch = dump.B;
    opt.max_seq = dump.T;
    Engine *engine = engine_create(&model, &opt, &err);
    if (!engine) die("%s", err.msg);

    size_t n = (size_t)dump.B * dump.T;
    int V = model.config.vocab_size;
    float *logits = xmalloc(n * V * sizeof(float));
    if (engine->forward(engine, dump.inputs, dump.B, dump.T, 0, logits, 1, &err)) die("%s", err.msg);

    double max_abs = 0.0, diff2 = 0.0, ref2 = 0.0;
    size_t agree = 0;
    int finite = 1;
    for (size_t r = 0; r < n; r++) {
        const float *got = logits + r * V, *want = dump.logits + r * V;
        for (int i = 0; i < V; i++) {
            double d = (double)got[i] - want[i];
            if (!isfinite(got[i])) finite = 0;
            max_abs = fabs(d) > max_abs ? fabs(d) : max_abs;
            diff2 += d * d;
            ref2 += (double)want[i] * want[i];
        }
        agree += argmax(got, V) == argmax(want, V);
    }
    double rel_l2 = sqrt(diff2 / (ref2 > 0 ? ref2 : 1.0));
    double agree_pct = 100.0 * agree / n;
    int bf16 = engine->dtype == DTYPE_BF16;
    if (tol < 0) tol = bf16 ? 3e-2 : 1e-4;
    int pass = finite && rel_l2 <= tol && (!bf16 || agree_pct >= 99.0);

    printf("path=%s dtype=%s B=%d T=%d V=%d\n", engine->name, dtype_name(engine->dtype), dump.B, dump.T, V);
    printf("max_abs_err=%.6g\n", max_abs);
    printf("rel_l2_err=%.6g (tolerance %.3g)\n", rel_l2, tol);
    printf("argmax_agree=%.2f%%%s\n", agree_pct, bf16 ? " (>= 99% required on bf16)" : "");
    printf("loss=%.6f dump_loss=%.6f\n", mean_loss(logits, dump.targets, n, V), dump.loss);
    if (!finite) printf("non-finite logits\n");
    printf("%s\n", pass ? "PASS" : "FAIL");

    free(logits);
    dump_free(&dump);
    engine_free(engine);
    gpt2_model_free(&model);
    return pass ? 0 : 1;
}
