// Safetensors loading: a random GPT-2 written both as llm.c's .bin and as Hugging Face tensors
// must load into the same bytes (F32, BF16, F16, mixed, with and without the "transformer."
// prefix, with and without config.json), and every malformed file must fail with its one-line
// message naming the file.
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "test.h"

// ----------------------------------------------------------------------------
// A tiny GPT-2 in llm.c's layout. Every value is k/256 with |k| < 256, exact in F32, BF16 and F16,
// so each dtype must reproduce the .bin bit for bit.

static const GPT2Config tiny = {
    .max_seq_len = 16, .vocab_size = 300, .padded_vocab_size = 384, .num_layers = 2, .num_heads = 4, .channels = 64};

static float *tiny_params(size_t counts[NUM_PARAMS], size_t *total) {
    gpt2_param_counts(&tiny, counts, total);
    float *p = malloc(*total * sizeof(float));
    uint32_t state = 12345;
    for (size_t i = 0; i < *total; i++) {
        state = state * 1664525u + 1013904223u;
        p[i] = (float)((int)(state >> 23) % 255) / 256.0f;  // (state >> 23) < 512: k in [0, 255)
        if (state & 1) p[i] = -p[i];
    }
    // llm.c's padded wte rows are zero.
    size_t used = (size_t)tiny.vocab_size * tiny.channels;
    memset(p + used, 0, (counts[PARAM_WTE] - used) * sizeof(float));
    return p;
}

static void write_bin(const char *path, const float *params, size_t total, int bf16) {
    int32_t header[256] = {20240326, bf16 ? 5 : 3, tiny.max_seq_len, tiny.vocab_size, tiny.num_layers,
                           tiny.num_heads, tiny.channels, tiny.padded_vocab_size};
    FILE *f = fopen(path, "wb");
    fwrite(header, sizeof(header), 1, f);
    for (size_t i = 0; i < total; i++) {
        if (bf16) {
            uint16_t h = float_to_bf16(params[i]);
            fwrite(&h, 2, 1, f);
        } else {
            fwrite(&params[i], 4, 1, f);
        }
    }
    fclose(f);
}

// ----------------------------------------------------------------------------
// Hugging Face tensors built from it, editable before writing

typedef struct {
    char name[96];
    char dtype[16];
    int ndim;
    size_t shape[4];
    uint8_t *data;
    size_t bytes;
} Tensor;

typedef struct {
    Tensor t[64];
    int n;
} TensorList;

static Tensor *find(TensorList *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0) return &l->t[i];
    return NULL;
}

static void drop(TensorList *l, const char *name) {
    Tensor *t = find(l, name);
    free(t->data);
    *t = l->t[--l->n];
}

static void list_free(TensorList *l) {
    for (int i = 0; i < l->n; i++) free(l->t[i].data);
    l->n = 0;
}

static uint16_t float_to_f16(float f) {  // exact for the normal values and zeros used here
    uint32_t b;
    memcpy(&b, &f, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    if ((b & 0x7fffffffu) == 0) return sign;
    return (uint16_t)(sign | ((((b >> 23) & 0xffu) - 127 + 15) << 10) | ((b >> 13) & 0x3ffu));
}

static size_t dtype_bytes(const char *dtype) { return strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0 ? 4 : 2; }

// Adds a tensor of floats stored in `dtype`, optionally transposed from (rows, cols) to (cols, rows).
static Tensor *add(TensorList *l, const char *name, const char *dtype, const float *v, size_t rows, size_t cols,
                   int ndim, int transpose) {
    Tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->dtype, sizeof(t->dtype), "%s", dtype);
    t->ndim = ndim;
    t->shape[0] = ndim == 1 ? rows * cols : transpose ? cols : rows;
    t->shape[1] = transpose ? rows : cols;
    size_t n = rows * cols, esz = dtype_bytes(dtype);
    t->bytes = n * esz;
    t->data = malloc(t->bytes);
    for (size_t i = 0; i < n; i++) {
        size_t src = transpose ? (i % rows) * cols + i / rows : i;  // element i of the stored (cols, rows)
        float x = v[src];
        if (strcmp(dtype, "F32") == 0) memcpy(t->data + 4 * i, &x, 4);
        else if (strcmp(dtype, "I32") == 0) memcpy(t->data + 4 * i, &(int32_t){(int32_t)x}, 4);
        else if (strcmp(dtype, "BF16") == 0) memcpy(t->data + 2 * i, &(uint16_t){float_to_bf16(x)}, 2);
        else memcpy(t->data + 2 * i, &(uint16_t){float_to_f16(x)}, 2);
    }
    return t;
}

// The llm.c tensors under Hugging Face's names and shapes: Conv1D weights (in, out), wte unpadded.
static void hf_from_llmc(TensorList *l, const float *p, const size_t counts[NUM_PARAMS], const char *dtype,
                         const char *prefix) {
    static const char *const layer_names[12] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias"};
    size_t C = (size_t)tiny.channels, L = (size_t)tiny.num_layers;
    size_t rows[12] = {1, 1, 3 * C, 1, C, 1, 1, 1, 4 * C, 1, C, 1};  // llm.c's (out, in) per layer
    const float *at[NUM_PARAMS];
    const float *q = p;
    for (int i = 0; i < NUM_PARAMS; i++) at[i] = q, q += counts[i];
    char name[96];
    snprintf(name, sizeof(name), "%swte.weight", prefix);
    add(l, name, dtype, at[PARAM_WTE], (size_t)tiny.vocab_size, C, 2, 0);
    snprintf(name, sizeof(name), "%swpe.weight", prefix);
    add(l, name, dtype, at[PARAM_WPE], (size_t)tiny.max_seq_len, C, 2, 0);
    for (size_t layer = 0; layer < L; layer++)
        for (int k = 0; k < 12; k++) {
            size_t per = counts[PARAM_LN1W + k] / L;
            snprintf(name, sizeof(name), "%sh.%zu.%s", prefix, layer, layer_names[k]);
            int matrix = k == 2 || k == 4 || k == 8 || k == 10;
            add(l, name, dtype, at[PARAM_LN1W + k] + layer * per, matrix ? rows[k] : 1, matrix ? per / rows[k] : per,
                matrix ? 2 : 1, matrix);
        }
    snprintf(name, sizeof(name), "%sln_f.weight", prefix);
    add(l, name, dtype, at[PARAM_LNFW], 1, C, 1, 0);
    snprintf(name, sizeof(name), "%sln_f.bias", prefix);
    add(l, name, dtype, at[PARAM_LNFB], 1, C, 1, 0);
}

// Writes the tensors back to back in list order, the header padded with spaces to 8 bytes as
// the reference writer does.
static void write_st(const char *path, const TensorList *l) {
    size_t cap = 1 << 16, k = 0, off = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < l->n; i++) {
        const Tensor *t = &l->t[i];
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) k += (size_t)snprintf(h + k, cap - k, d ? ",%zu" : "%zu", t->shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + t->bytes);
        off += t->bytes;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8) h[k++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t n = k;
    fwrite(&n, 8, 1, f);
    fwrite(h, 1, k, f);
    for (int i = 0; i < l->n; i++) fwrite(l->t[i].data, 1, l->t[i].bytes, f);
    fclose(f);
    free(h);
}

// A file from a header length, header text and data bytes, for the malformed cases.
static void write_raw(const char *path, uint64_t header_len, const char *header, const void *data, size_t bytes) {
    FILE *f = fopen(path, "wb");
    fwrite(&header_len, 8, 1, f);
    fwrite(header, 1, strlen(header), f);
    if (bytes) fwrite(data, 1, bytes, f);
    fclose(f);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static const char *tiny_config_json =
    "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 4, "
    "\"n_embd\": 64, \"n_positions\": 16, \"vocab_size\": 300, \"layer_norm_epsilon\": 1e-05}";

// Appends to dir a new subdirectory, a name of min(len, 200) - 1 'd's, and makes it.
static void deep_mkdir(char dir[PATH_MAX], int len) {
    if (len > 200) len = 200;
    size_t n = strlen(dir);
    dir[n++] = '/';
    memset(dir + n, 'd', (size_t)len - 1);
    dir[n + len - 1] = '\0';
    mkdir(dir, 0755);
}

// ----------------------------------------------------------------------------
// Checks

static char root[512];

// A fresh directory per case, since config.json is looked up beside the file.
static const char *case_dir(const char *name, int with_config) {
    static char dir[768];
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    mkdir(dir, 0755);
    char cfg[900];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (with_config) write_text(cfg, tiny_config_json);
    else unlink(cfg);
    return dir;
}

// Loading `path` must give ref's bytes; safetensors (want_heap) land on the heap, the file unmapped.
static void expect_same(const char *name, const char *path, const GPT2Model *ref, int want_heads, int want_heap) {
    GPT2Model m;
    Error err = {{0}};
    if (gpt2_model_load(&m, path, &err) != 0) {
        CHECK(0, name, "load failed: %s", err.msg);
        return;
    }
    GPT2Config want = ref->config;
    want.num_heads = want_heads;
    int same_config = memcmp(&m.config, &want, sizeof(want)) == 0;
    size_t bytes = ref->num_parameters * dtype_size(ref->dtype);
    int same = same_config && m.dtype == ref->dtype && m.num_parameters == ref->num_parameters &&
               (m.file.data == NULL) == want_heap && memcmp(m.param_memory, ref->param_memory, bytes) == 0;
    size_t first_diff = 0;
    while (same_config && m.dtype == ref->dtype && first_diff < bytes &&
           ((char *)m.param_memory)[first_diff] == ((char *)ref->param_memory)[first_diff])
        first_diff++;
    CHECK(same, name, "config %s, dtype %s vs %s, first differing byte %zu of %zu", same_config ? "same" : "differs",
          dtype_name(m.dtype), dtype_name(ref->dtype), first_diff, bytes);
    gpt2_model_free(&m);
}

// Loading `path` must fail with a message that names `file` (the file at fault) and contains `want`.
static void expect_error_in(const char *name, const char *path, const char *file, const char *want) {
    GPT2Model m;
    Error err = {{0}};
    int rc = gpt2_model_load(&m, path, &err);
    CHECK(rc != 0 && strstr(err.msg, want) && strstr(err.msg, file), name, "rc %d, message '%s', wanted '%s' and '%s'",
          rc, err.msg, want, file);
    if (rc == 0) gpt2_model_free(&m);
}

static void expect_error(const char *name, const char *path, const char *want) {
    expect_error_in(name, path, path, want);
}

int main(void) {
    const char *tmp = getenv("GPT2_TMP");
    if (tmp) mkdir(tmp, 0755);  // tests/run.sh makes it; a test run on its own may not have
    snprintf(root, sizeof(root), "%s/safetensors_XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        CHECK(0, "safetensors_tmpdir", "cannot create %s", root);
        return test_exit_code();
    }

    size_t counts[NUM_PARAMS], total;
    float *params = tiny_params(counts, &total);
    char path[1024], bin[1024];
    GPT2Model ref32, ref16;
    Error err = {{0}};
    snprintf(bin, sizeof(bin), "%s/tiny_f32.bin", root);
    write_bin(bin, params, total, 0);
    if (gpt2_model_load_llmc(&ref32, bin, &err) != 0) die("reference: %s", err.msg);
    snprintf(bin, sizeof(bin), "%s/tiny_bf16.bin", root);
    write_bin(bin, params, total, 1);
    if (gpt2_model_load_llmc(&ref16, bin, &err) != 0) die("reference: %s", err.msg);

    TensorList l = {.n = 0};
    const char *dir;

    // --- Well-formed files: the same bytes as the .bin

    dir = case_dir("f32", 1);
    hf_from_llmc(&l, params, counts, "F32", "");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_st(path, &l);
    expect_same("safetensors_f32_equals_llmc", path, &ref32, 4, 1);
    expect_same("safetensors_directory", dir, &ref32, 4, 1);

    // An llm.c export in a directory of its own: the one .bin in it is the model.
    dir = case_dir("onebin", 0);
    snprintf(path, sizeof(path), "%s/tiny.bin", dir);
    write_bin(path, params, total, 0);
    expect_same("model_directory_single_bin", dir, &ref32, 4, 0);
    snprintf(path, sizeof(path), "%s/second.bin", dir);
    write_bin(path, params, total, 0);
    expect_error("model_directory_two_bins", dir, "holds 2 .bin files");

    dir = case_dir("noconfig", 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_st(path, &l);
    expect_same("safetensors_no_config_head_size_64", path, &ref32, 1, 1);
    list_free(&l);

    // transformers' GPT2LMHeadModel names, with the tied head and the old mask buffers saved.
    dir = case_dir("prefix", 1);
    hf_from_llmc(&l, params, counts, "F32", "transformer.");
    Tensor *wte = find(&l, "transformer.wte.weight");
    Tensor *head = add(&l, "lm_head.weight", "F32", (const float *)wte->data, wte->shape[0], wte->shape[1], 2, 0);
    float mask[16 * 16] = {0};
    add(&l, "transformer.h.0.attn.bias", "F32", mask, 16, 16, 2, 0);
    add(&l, "transformer.h.1.attn.bias", "F32", mask, 16, 16, 2, 0);
    add(&l, "transformer.h.1.attn.masked_bias", "F32", mask, 1, 1, 1, 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_st(path, &l);
    expect_same("safetensors_transformer_prefix_and_buffers", path, &ref32, 4, 1);
    ((float *)head->data)[7] += 1.0f;
    write_st(path, &l);
    expect_error("safetensors_untied_lm_head", path, "lm_head.weight differs from wte.weight");
    list_free(&l);

    dir = case_dir("bf16", 1);
    hf_from_llmc(&l, params, counts, "BF16", "");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_st(path, &l);
    expect_same("safetensors_bf16_stays_bf16", path, &ref16, 4, 1);
    list_free(&l);

    dir = case_dir("f16", 1);
    hf_from_llmc(&l, params, counts, "F16", "");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_st(path, &l);
    expect_same("safetensors_f16_to_f32_exact", path, &ref32, 4, 1);
    list_free(&l);

    // Mixed F32/BF16/F16 tensors all become fp32.
    dir = case_dir("mixed", 1);
    hf_from_llmc(&l, params, counts, "BF16", "");
    size_t C = (size_t)tiny.channels;
    drop(&l, "wpe.weight");
    add(&l, "wpe.weight", "F32", params + counts[PARAM_WTE], (size_t)tiny.max_seq_len, C, 2, 0);
    drop(&l, "ln_f.weight");
    add(&l, "ln_f.weight", "F16", params + total - 2 * C, 1, C, 1, 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_st(path, &l);
    expect_same("safetensors_mixed_dtypes_to_f32", path, &ref32, 4, 1);
    list_free(&l);

    // F16's edge values: subnormals, signed zero, infinities, NaN, the largest finite.
    {
        dir = case_dir("f16special", 1);
        hf_from_llmc(&l, params, counts, "F32", "");
        Tensor *b = find(&l, "ln_f.bias");
        free(b->data);
        snprintf(b->dtype, sizeof(b->dtype), "F16");
        b->bytes = C * 2;
        b->data = calloc(C, 2);
        const uint16_t h[8] = {0x0001, 0x03ff, 0x8000, 0x7c00, 0xfc00, 0x7bff, 0x3555, 0x7e00};
        memcpy(b->data, h, sizeof(h));
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        write_st(path, &l);
        GPT2Model m;
        int ok = gpt2_model_load(&m, path, &err) == 0;
        const float *v = ok ? (const float *)m.params[PARAM_LNFB] : NULL;
        ok = ok && v[0] == 0x1p-24f && v[1] == 1023 * 0x1p-24f && v[2] == 0.0f && signbit(v[2]) &&
             isinf(v[3]) && v[3] > 0 && isinf(v[4]) && v[4] < 0 && v[5] == 65504.0f && v[6] == 0.333251953125f &&
             isnan(v[7]) && v[8] == 0.0f && !signbit(v[8]);
        CHECK(ok, "safetensors_f16_special_values", "%s", ok ? "" : err.msg);
        if (v) gpt2_model_free(&m);
        list_free(&l);
    }

    // --- Malformed GPT-2 files

    dir = case_dir("bad", 1);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    hf_from_llmc(&l, params, counts, "F32", "");
    drop(&l, "h.1.mlp.c_fc.bias");
    write_st(path, &l);
    expect_error("safetensors_missing_tensor", path, "missing tensor h.1.mlp.c_fc.bias");
    list_free(&l);

    // llm.c's (3C, C) where Hugging Face stores (C, 3C): a transposition mix-up.
    hf_from_llmc(&l, params, counts, "F32", "");
    Tensor *qkv = find(&l, "h.0.attn.c_attn.weight");
    qkv->shape[0] = 3 * C, qkv->shape[1] = C;
    write_st(path, &l);
    expect_error("safetensors_wrong_shape", path,
                 "h.0.attn.c_attn.weight has shape [192, 64], but config.json implies [64, 192]");
    list_free(&l);

    hf_from_llmc(&l, params, counts, "F32", "");
    Tensor *lnf = find(&l, "ln_f.bias");
    snprintf(lnf->dtype, sizeof(lnf->dtype), "I32");
    write_st(path, &l);
    expect_error("safetensors_unsupported_dtype", path, "ln_f.bias has dtype I32; supported are F32, F16 and BF16");
    list_free(&l);

    hf_from_llmc(&l, params, counts, "F32", "");
    add(&l, "transformer.wte.weight", "F32", params, (size_t)tiny.vocab_size, C, 2, 0);
    write_st(path, &l);
    expect_error("safetensors_prefix_duplicate", path, "are the same GPT-2 parameter");
    list_free(&l);

    hf_from_llmc(&l, params, counts, "F32", "");
    add(&l, "h.0.attn.rotary", "F32", params, 1, 4, 1, 0);
    write_st(path, &l);
    expect_error("safetensors_unexpected_tensor", path, "unexpected tensor 'h.0.attn.rotary'");
    list_free(&l);

    // --- config.json problems

    hf_from_llmc(&l, params, counts, "F32", "");
    write_st(path, &l);
    list_free(&l);
    char cfg[1024];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    write_text(cfg, "{\"n_layer\": 2, \"n_head\": 4,");
    expect_error_in("safetensors_config_bad_json", path, cfg, "config.json: not a well-formed JSON object");
    write_text(cfg, "{\"n_layer\": 2, \"n_embd\": 64, \"n_positions\": 16, \"vocab_size\": 300}");
    expect_error_in("safetensors_config_missing_key", path, cfg, "missing or invalid integer 'n_head'");
    char trailing[512];  // a second object after the first is not ignored
    snprintf(trailing, sizeof(trailing), "%s\n{\"n_head\": 1}", tiny_config_json);
    write_text(cfg, trailing);
    expect_error_in("safetensors_config_trailing_garbage", path, cfg, "config.json: not a well-formed JSON object");
    unlink(cfg);  // a FIFO with no writer: refused, not waited on
    CHECK(mkfifo(cfg, 0644) == 0, "safetensors_config_fifo_made", "mkfifo %s", cfg);
    expect_error_in("safetensors_config_fifo", path, cfg, "not a regular file");
    unlink(cfg);
    write_text(cfg, "{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 128, \"n_positions\": 16, \"vocab_size\": 300}");
    expect_error("safetensors_config_disagrees", path,
                 "wte.weight has shape [300, 64], but config.json implies [300, 128]");
    write_text(cfg, "{\"n_layer\": 3, \"n_head\": 4, \"n_embd\": 64, \"n_ctx\": 16, \"vocab_size\": 300}");
    expect_error("safetensors_config_more_layers", path, "missing tensor h.2.ln_1.weight");
    write_text(cfg, "{\"n_layer\": 1, \"n_head\": 4, \"n_embd\": 64, \"n_positions\": 16, \"vocab_size\": 300}");
    expect_error("safetensors_config_fewer_layers", path, "holds layer h.1, but config.json says n_layer=1");
    write_text(cfg, "{\"n_layer\": 2, \"n_head\": 5, \"n_embd\": 64, \"n_positions\": 16, \"vocab_size\": 300}");
    expect_error_in("safetensors_config_heads_divide", path, cfg, "not divisible by the number of heads 5");

    // Without config.json the number of heads comes from head size 64, so C must be a multiple.
    dir = case_dir("c48", 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    add(&l, "wte.weight", "F32", params, 10, 48, 2, 0);
    add(&l, "wpe.weight", "F32", params, 4, 48, 2, 0);
    write_st(path, &l);
    expect_error("safetensors_no_config_heads_unknown", path, "cannot tell the number of heads");
    list_free(&l);

    // A model path that is a FIFO with no writer: refused, not waited on.
    dir = case_dir("fifo", 1);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK(mkfifo(path, 0644) == 0, "safetensors_fifo_made", "mkfifo %s", path);
    expect_error("safetensors_fifo", path, "not a regular file");
    unlink(path);

    // Long paths: config.json beside a model 1,100 characters deep is still read (its n_head=4, where
    // head size 64 alone would give 1); a directory too deep for "/model.safetensors" to fit in
    // PATH_MAX is one clear error.
    char deep[PATH_MAX];
    snprintf(deep, sizeof(deep), "%s", root);
    while (strlen(deep) < 1100) deep_mkdir(deep, 200);
    char deep_file[PATH_MAX + 32];
    snprintf(deep_file, sizeof(deep_file), "%s/config.json", deep);
    write_text(deep_file, tiny_config_json);
    hf_from_llmc(&l, params, counts, "F32", "");
    snprintf(deep_file, sizeof(deep_file), "%s/model.safetensors", deep);
    write_st(deep_file, &l);
    list_free(&l);
    expect_same("safetensors_long_path_reads_config", deep, &ref32, 4, 1);
    while (strlen(deep) < PATH_MAX - 18) deep_mkdir(deep, PATH_MAX - 18 - (int)strlen(deep));
    expect_error_in("model_directory_path_too_long", deep, root, "path too long for the files in it");

    // --- Malformed containers (the header parser)

    dir = case_dir("raw", 0);
    static const uint8_t zeros[64] = {0};
    const char *a4 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    struct {
        const char *name;
        uint64_t len;        // 0: strlen(header)
        const char *header;
        size_t data_bytes;
        const char *want;
    } raw[] = {
        {"safetensors_truncated", 0, "", 5, "truncated: 5 bytes, shorter than the 8-byte header length"},
        {"safetensors_empty_file", 0, "", 0, "truncated: 0 bytes"},
        {"safetensors_header_beyond_file", 4096, a4, 4, "header length 4096 runs past the end of the file"},
        {"safetensors_header_length_2_63", 1ull << 63, a4, 4, "header length 9223372036854775808 runs past the end"},
        {"safetensors_header_not_object", 0, "[1, 2]", 0, "header is not a JSON object"},
        {"safetensors_bad_json", 0, "{\"a\":{\"dtype\":\"F32\",", 0, "header is not well-formed JSON"},
        {"safetensors_header_garbage_after_json", 0, "{}  x", 0, "header is not well-formed JSON"},
        {"safetensors_entry_not_object", 0, "{\"a\":3}", 0, "header entry 'a' is not an object"},
        {"safetensors_entry_missing_fields", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
         "tensor 'a' lacks a string dtype, a shape array or a data_offsets array"},
        {"safetensors_unknown_dtype", 0, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a' has unknown dtype 'Q4'"},
        {"safetensors_negative_dim", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
         "shape entry that is not a non-negative integer"},
        {"safetensors_fractional_offset", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 4,
         "data_offsets is not a pair"},
        {"safetensors_offsets_reversed", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
         "data_offsets is not a pair"},
        {"safetensors_size_mismatch", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
         "tensor 'a' has 8 bytes of data at [0, 8], but its dtype F32 and shape need 12"},
        {"safetensors_shape_overflow", 0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
         "shape too large to address"},
        {"safetensors_offsets_out_of_range", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
         "data_offsets [0, 8] run past the 4 bytes of data"},
        {"safetensors_offsets_overlap", 0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "tensor 'b' data_offsets [4, 12] overlap the previous tensor's data"},
        {"safetensors_offsets_hole", 0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, "bytes [4, 8) of the data belong to no tensor"},
        {"safetensors_trailing_data", 0, a4, 12, "trailing data: 8 bytes after the last tensor"},
        {"safetensors_duplicate_name", 0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "tensor 'a' appears twice in the header"},
        {"safetensors_metadata_not_strings", 0, "{\"__metadata__\":{\"format\":1}}", 0,
         "__metadata__ value 'format' is not a string"},
        {"safetensors_too_many_dims", 0,
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "has 9 dimensions"},
        {"safetensors_no_gpt2_tensors", 0, a4, 4, "unexpected tensor 'a': not part of GPT-2"},
    };
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s.safetensors", dir, raw[i].name);
        if (raw[i].header[0] == '\0') {  // a file shorter than the length field: raw bytes only
            FILE *f = fopen(path, "wb");
            fwrite(zeros, 1, raw[i].data_bytes, f);
            fclose(f);
        } else {
            write_raw(path, raw[i].len ? raw[i].len : strlen(raw[i].header), raw[i].header, zeros, raw[i].data_bytes);
        }
        expect_error(raw[i].name, path, raw[i].want);
    }
    snprintf(path, sizeof(path), "%s/absent.safetensors", dir);
    expect_error("safetensors_absent_file", path, "cannot open");

    // Padding after the JSON is the format's own: spaces are accepted.
    {
        const char *padded = "{\"__metadata__\":{\"format\":\"pt\"}}      ";
        SafetensorsIndex ix;
        uint8_t file[64];
        uint64_t n = strlen(padded);
        memcpy(file, &n, 8);
        memcpy(file + 8, padded, n);
        int rc = safetensors_parse_header(file, 8 + n, "memory", &ix, &err);
        CHECK(rc == 0 && ix.num_tensors == 0 && ix.data_bytes == 0, "safetensors_header_space_padding", "%s",
              rc ? err.msg : "wrong index");
        if (rc == 0) safetensors_index_free(&ix);
    }

    gpt2_model_free(&ref32);
    gpt2_model_free(&ref16);
    free(params);
    return test_exit_code();
}
