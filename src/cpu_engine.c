// The CPU engine: GPT-2's forward pass in fp32, written out once, parallel across rows with OpenMP.
// It is the path that runs without a GPU and the readable statement of what every engine computes
// (docs/DESIGN.md). bf16 checkpoints are widened to fp32 once at creation.
#include <math.h>

#include "engine.h"

typedef struct {
    GPT2Config config;
    float *params[NUM_PARAMS];  // fp32 views: into the model (fp32) or into owned_params (bf16 widened)
    float *owned_params;
    int max_batch, max_seq;
    // KV cache, K and V each [L][B][NH][max_seq][HS]: a head's keys are contiguous.
    float *key_cache, *value_cache;
    // Activations for the rows of one call, grown on demand (a full-context prefill needs the most).
    size_t rows_capacity;
    float *residual;  // [rows, C]  the residual stream x
    float *normed;    // [rows, C]  LayerNorm output
    float *qkv;       // [rows, 3C]
    float *attended;  // [rows, C]  attention output, heads side by side
    float *hidden;    // [rows, 4C] MLP hidden layer after GELU
    float *scores;    // [rows * NH, max_seq] attention weights, one row per (row, head)
} CPUState;

// ----------------------------------------------------------------------------
// The ops

static void layernorm(float *out, const float *in, const float *weight, const float *bias, int rows, int C) {
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        const float *x = in + (size_t)r * C;
        float *y = out + (size_t)r * C;
        // Two passes over the row: the mean first, then the variance about it (no cancellation).
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < C; i++) mean += x[i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        var /= C;
        float rstd = (float)(1.0 / sqrt(var + 1e-5));
        for (int i = 0; i < C; i++) y[i] = ((float)(x[i] - mean) * rstd) * weight[i] + bias[i];
    }
}

// out[r, o] = (accumulate ? out[r, o] : 0) + in[r, :] . weight[o, :] + bias[o]
// Every output is one dot product over a contiguous weight row; the dot is vectorized.
static void matmul(float *out, const float *in, const float *weight, const float *bias, int rows, int in_dim,
                   int out_dim, int out_stride, int accumulate) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < rows; r++) {
        for (int o = 0; o < out_dim; o++) {
            const float *x = in + (size_t)r * in_dim;
            const float *w = weight + (size_t)o * in_dim;
            float sum = bias ? bias[o] : 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < in_dim; i++) sum += x[i] * w[i];
            float *y = out + (size_t)r * out_stride + o;
            *y = accumulate ? *y + sum : sum;
        }
    }
}

static void gelu_tanh(float *x, size_t n) {
    const float s = 0.7978845608028654f;  // sqrt(2 / pi)
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(s * (v + 0.044715f * v * v * v)));
    }
}

// Appends the new tokens' keys and values to the cache, then lets every query attend to the
// cache positions up to its own (causal). q, k, v come from qkv rows [B*T, 3C].
static void attention(CPUState *s, int layer, int B, int T, int pos) {
    const GPT2Config *c = &s->config;
    int C = c->channels, NH = c->num_heads, HS = C / NH, S = s->max_seq;
    size_t layer_offset = (size_t)layer * s->max_batch * NH * S * HS;
    float *kc = s->key_cache + layer_offset, *vc = s->value_cache + layer_offset;

#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *row = s->qkv + ((size_t)b * T + t) * 3 * C;
                size_t at = (((size_t)b * NH + h) * S + pos + t) * HS;
                memcpy(kc + at, row + C + h * HS, HS * sizeof(float));
                memcpy(vc + at, row + 2 * C + h * HS, HS * sizeof(float));
            }

    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                size_t r = (size_t)b * T + t;
                const float *q = s->qkv + r * 3 * C + h * HS;
                const float *keys = kc + ((size_t)b * NH + h) * S * HS;
                const float *values = vc + ((size_t)b * NH + h) * S * HS;
                float *w = s->scores + (r * NH + h) * S;
                int n = pos + t + 1;  // positions this query may see
                float maxv = -INFINITY;
                for (int j = 0; j < n; j++) {
                    float dot = 0.0f;
                    for (int i = 0; i < HS; i++) dot += q[i] * keys[(size_t)j * HS + i];
                    w[j] = dot * scale;
                    if (w[j] > maxv) maxv = w[j];
                }
                float sum = 0.0f;
                for (int j = 0; j < n; j++) {
                    w[j] = expf(w[j] - maxv);
                    sum += w[j];
                }
                float *out = s->attended + r * C + h * HS;
                for (int i = 0; i < HS; i++) out[i] = 0.0f;
                for (int j = 0; j < n; j++) {
                    float p = w[j] / sum;
                    for (int i = 0; i < HS; i++) out[i] += p * values[(size_t)j * HS + i];
                }
            }
}

// ----------------------------------------------------------------------------
// The forward pass

static void ensure_rows(CPUState *s, size_t rows) {
    if (rows <= s->rows_capacity) return;
    size_t C = (size_t)s->config.channels;
    free(s->residual), free(s->normed), free(s->qkv), free(s->attended), free(s->hidden), free(s->scores);
    s->residual = xmalloc(rows * C * sizeof(float));
    s->normed = xmalloc(rows * C * sizeof(float));
    s->qkv = xmalloc(rows * 3 * C * sizeof(float));
    s->attended = xmalloc(rows * C * sizeof(float));
    s->hidden = xmalloc(rows * 4 * C * sizeof(float));
    s->scores = xmalloc(rows * s->config.num_heads * (size_t)s->max_seq * sizeof(float));
    s->rows_capacity = rows;
}

static int cpu_forward(Engine *e, const int *tokens, int B, int T, int pos, float *logits, int all_positions,
                       Error *err) {
    CPUState *s = e->impl;
    const GPT2Config *c = &s->config;
    int C = c->channels, V = c->vocab_size;
    if (B < 1 || B > s->max_batch || T < 1 || pos < 0 || pos + T > s->max_seq)
        return fail(err, "forward: B=%d T=%d at position %d exceeds the engine's batch %d or context %d", B, T, pos,
                    s->max_batch, s->max_seq);
    if (!logits) return fail(err, "forward: the CPU engine needs a host buffer for the logits");
    for (int i = 0; i < B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return fail(err, "forward: token id %d outside 0..%d", tokens[i], V - 1);
    int rows = B * T;
    ensure_rows(s, rows);
    float **p = s->params;

    // Token embedding + position embedding.
    for (int r = 0; r < rows; r++) {
        const float *te = p[PARAM_WTE] + (size_t)tokens[r] * C;
        const float *pe = p[PARAM_WPE] + (size_t)(pos + r % T) * C;
        for (int i = 0; i < C; i++) s->residual[(size_t)r * C + i] = te[i] + pe[i];
    }

    for (int l = 0; l < c->num_layers; l++) {
        size_t lC = (size_t)l * C;
        // Attention sub-block: x = x + proj(attention(ln1(x))).
        layernorm(s->normed, s->residual, p[PARAM_LN1W] + lC, p[PARAM_LN1B] + lC, rows, C);
        matmul(s->qkv, s->normed, p[PARAM_QKVW] + lC * 3 * C, p[PARAM_QKVB] + lC * 3, rows, C, 3 * C, 3 * C, 0);
        attention(s, l, B, T, pos);
        matmul(s->residual, s->attended, p[PARAM_ATTPROJW] + lC * C, p[PARAM_ATTPROJB] + lC, rows, C, C, C, 1);
        // MLP sub-block: x = x + proj(gelu(fc(ln2(x)))).
        layernorm(s->normed, s->residual, p[PARAM_LN2W] + lC, p[PARAM_LN2B] + lC, rows, C);
        matmul(s->hidden, s->normed, p[PARAM_FCW] + lC * 4 * C, p[PARAM_FCB] + lC * 4, rows, C, 4 * C, 4 * C, 0);
        gelu_tanh(s->hidden, (size_t)rows * 4 * C);
        matmul(s->residual, s->hidden, p[PARAM_FCPROJW] + lC * 4 * C, p[PARAM_FCPROJB] + lC, rows, 4 * C, C, C, 1);
    }

    // Final LayerNorm and the logits against the tied token embedding, for the rows asked for.
    if (all_positions) {
        layernorm(s->normed, s->residual, p[PARAM_LNFW], p[PARAM_LNFB], rows, C);
        matmul(logits, s->normed, p[PARAM_WTE], NULL, rows, C, V, V, 0);
    } else {
        for (int b = 0; b < B; b++)
            memcpy(s->normed + (size_t)b * C, s->residual + ((size_t)b * T + T - 1) * C, C * sizeof(float));
        layernorm(s->normed, s->normed, p[PARAM_LNFW], p[PARAM_LNFB], B, C);
        matmul(logits, s->normed, p[PARAM_WTE], NULL, B, C, V, V, 0);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Creation

static void cpu_free(Engine *e) {
    CPUState *s = e->impl;
    free(s->owned_params), free(s->key_cache), free(s->value_cache);
    free(s->residual), free(s->normed), free(s->qkv), free(s->attended), free(s->hidden), free(s->scores);
    free(s);
    free(e);
}

Engine *cpu_engine_create(const GPT2Model *model, int max_batch, int max_seq, Error *err) {
    const GPT2Config *c = &model->config;
    if (max_batch < 1 || max_seq < 1 || max_seq > c->max_seq_len) {
        fail(err, "cpu engine: batch %d and context %d must be >= 1 and context <= %d", max_batch, max_seq,
             c->max_seq_len);
        return NULL;
    }
    CPUState *s = xcalloc(1, sizeof(CPUState));
    s->config = *c;
    s->max_batch = max_batch;
    s->max_seq = max_seq;
    if (model->dtype == DTYPE_F32) {
        for (int i = 0; i < NUM_PARAMS; i++) s->params[i] = model->params[i];
    } else {
        s->owned_params = xmalloc(model->num_parameters * sizeof(float));
        const uint16_t *src = model->param_memory;
#pragma omp parallel for
        for (size_t i = 0; i < model->num_parameters; i++) s->owned_params[i] = bf16_to_float(src[i]);
        float *p = s->owned_params;
        for (int i = 0; i < NUM_PARAMS; i++) {
            s->params[i] = p;
            p += model->param_counts[i];
        }
    }
    size_t cache = (size_t)c->num_layers * max_batch * max_seq * c->channels;
    s->key_cache = xmalloc(cache * sizeof(float));
    s->value_cache = xmalloc(cache * sizeof(float));

    Engine *e = xcalloc(1, sizeof(Engine));
    *e = (Engine){.name = "cpu", .config = *c, .dtype = DTYPE_F32, .max_batch = max_batch, .max_seq = max_seq,
                  .impl = s, .forward = cpu_forward, .free = cpu_free};
    return e;
}
