// Hugging Face safetensors -> GPT2Model. The file is memory-mapped, its header parsed and checked
// against the bytes before any tensor is touched, and GPT-2's tensors are copied into one heap
// buffer in llm.c's order: Conv1D weights transposed from (in, out) to (out, in), the vocabulary
// padded with zero rows, F16 widened to F32. The file is unmapped before returning, so a loaded
// model never depends on it.
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

// The format is little-endian; the tensor bytes are used as they are, so the host must be too.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads little-endian tensor data in place"
#endif

// ----------------------------------------------------------------------------
// Header: u64 length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets"}, ...,
// "__metadata__": {string: string}}, then the data section that the offsets index.

// The reference implementation's limit: a larger header is an attack, not a model.
enum { SAFETENSORS_MAX_HEADER = 100000000 };

static const struct {
    const char *name;
    int bytes;
} safetensors_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4},
    {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

// JSON numbers are doubles: an offset or a dimension is a whole number up to 2^53, where doubles
// are exact (no file that size exists).
static int json_size(const cJSON *item, size_t *out) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != floor(v)) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_tensor(const cJSON *entry, const char *what, SafetensorsTensor *t, Error *err) {
    if (!cJSON_IsObject(entry)) return fail(err, "%s: header entry '%s' is not an object", what, t->name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
        return fail(err, "%s: tensor '%s' lacks a string dtype, a shape array or a data_offsets array", what,
                    t->name);

    for (size_t i = 0; i < sizeof(safetensors_dtypes) / sizeof(safetensors_dtypes[0]); i++)
        if (strcmp(dtype->valuestring, safetensors_dtypes[i].name) == 0) {
            snprintf(t->dtype, sizeof(t->dtype), "%s", safetensors_dtypes[i].name);
            t->dtype_bytes = safetensors_dtypes[i].bytes;
        }
    if (t->dtype_bytes == 0)
        return fail(err, "%s: tensor '%s' has unknown dtype '%.32s'", what, t->name, dtype->valuestring);

    int ndim = cJSON_GetArraySize(shape);
    if (ndim > SAFETENSORS_MAX_DIMS)
        return fail(err, "%s: tensor '%s' has %d dimensions (at most %d supported)", what, t->name, ndim,
                    SAFETENSORS_MAX_DIMS);
    t->ndim = ndim;
    // prod(shape) * dtype size: the byte count must match the offsets exactly. A zero dimension
    // makes an empty tensor whatever the others say; otherwise the product must not overflow.
    size_t bytes = (size_t)t->dtype_bytes;
    int d = 0, empty = 0, overflow = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, d++) {
        if (json_size(dim, &t->shape[d]))
            return fail(err, "%s: tensor '%s' has a shape entry that is not a non-negative integer", what, t->name);
        if (t->shape[d] == 0) empty = 1;
        else if (bytes > SIZE_MAX / t->shape[d]) overflow = 1;
        else bytes *= t->shape[d];
    }
    if (empty) bytes = 0;
    else if (overflow) return fail(err, "%s: tensor '%s' has a shape too large to address", what, t->name);

    if (cJSON_GetArraySize(offsets) != 2 || json_size(offsets->child, &t->begin) ||
        json_size(offsets->child->next, &t->end) || t->begin > t->end)
        return fail(err, "%s: tensor '%s' data_offsets is not a pair [begin, end] of integers with begin <= end",
                    what, t->name);
    if (t->end - t->begin != bytes)
        return fail(err, "%s: tensor '%s' has %zu bytes of data at [%zu, %zu], but its dtype %s and shape need %zu",
                    what, t->name, t->end - t->begin, t->begin, t->end, t->dtype, bytes);
    return 0;
}

static int check_metadata(const cJSON *meta, const char *what, Error *err) {
    if (!cJSON_IsObject(meta)) return fail(err, "%s: __metadata__ is not an object", what);
    for (const cJSON *kv = meta->child; kv; kv = kv->next)
        if (!cJSON_IsString(kv)) return fail(err, "%s: __metadata__ value '%s' is not a string", what, kv->string);
    return 0;
}

static int compare_names(const void *a, const void *b) {
    return strcmp((*(const SafetensorsTensor *const *)a)->name, (*(const SafetensorsTensor *const *)b)->name);
}

static int compare_offsets(const void *a, const void *b) {
    const SafetensorsTensor *x = *(const SafetensorsTensor *const *)a, *y = *(const SafetensorsTensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// The format forbids holes and overlaps: the tensors, in offset order, tile [0, data_bytes).
static int check_tiling(const SafetensorsIndex *ix, const char *what, Error *err) {
    int n = ix->num_tensors;
    const SafetensorsTensor **by = xmalloc((size_t)n * sizeof(*by));
    for (int i = 0; i < n; i++) by[i] = &ix->tensors[i];
    int rc = 0;

    qsort(by, (size_t)n, sizeof(*by), compare_names);
    for (int i = 1; i < n && rc == 0; i++)
        if (strcmp(by[i - 1]->name, by[i]->name) == 0)
            rc = fail(err, "%s: tensor '%s' appears twice in the header", what, by[i]->name);

    qsort(by, (size_t)n, sizeof(*by), compare_offsets);
    size_t at = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const SafetensorsTensor *t = by[i];
        if (t->end > ix->data_bytes)
            rc = fail(err, "%s: tensor '%s' data_offsets [%zu, %zu] run past the %zu bytes of data", what, t->name,
                      t->begin, t->end, ix->data_bytes);
        else if (t->begin < at)
            rc = fail(err, "%s: tensor '%s' data_offsets [%zu, %zu] overlap the previous tensor's data (ending at %zu)",
                      what, t->name, t->begin, t->end, at);
        else if (t->begin > at)
            rc = fail(err, "%s: bytes [%zu, %zu) of the data belong to no tensor", what, at, t->begin);
        at = t->end;
    }
    if (rc == 0 && at != ix->data_bytes)
        rc = fail(err, "%s: trailing data: %zu bytes after the last tensor", what, ix->data_bytes - at);
    free(by);
    return rc;
}

// A JSON object in text[0, n) with nothing but whitespace after it (safetensors' header and
// config.json alike); NULL otherwise, with *stopped the byte where reading it failed.
static cJSON *parse_json_object(const char *text, size_t n, size_t *stopped) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        *stopped = at && at >= text && at <= text + n ? (size_t)(at - text) : 0;
        return NULL;
    }
    size_t parsed = end ? (size_t)(end - text) : 0;
    while (parsed < n && text[parsed] != '\0' && strchr(" \t\r\n", text[parsed])) parsed++;
    *stopped = parsed;
    if (cJSON_IsObject(root) && parsed == n) return root;
    cJSON_Delete(root);
    return NULL;
}

int safetensors_parse_header(const uint8_t *file, size_t file_bytes, const char *what, SafetensorsIndex *out,
                             Error *err) {
    memset(out, 0, sizeof(*out));
    if (file_bytes < 8)
        return fail(err, "%s: truncated: %zu bytes, shorter than the 8-byte header length", what, file_bytes);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)file[i] << (8 * i);
    if (n > file_bytes - 8)
        return fail(err, "%s: header length %llu runs past the end of the file (%zu bytes)", what,
                    (unsigned long long)n, file_bytes);
    if (n > SAFETENSORS_MAX_HEADER)
        return fail(err, "%s: header length %llu exceeds the format's limit of %d bytes", what,
                    (unsigned long long)n, SAFETENSORS_MAX_HEADER);
    if (n < 2 || file[8] != '{') return fail(err, "%s: header is not a JSON object", what);

    // cJSON wants a terminated string; the copy also keeps a NUL inside the header from hiding the rest.
    char *text = xmalloc((size_t)n + 1);
    memcpy(text, file + 8, (size_t)n);
    text[n] = '\0';
    // Writers pad the header with spaces so the data starts aligned.
    size_t stopped;
    cJSON *root = parse_json_object(text, (size_t)n, &stopped);
    int rc = 0;
    if (!root) {
        rc = fail(err, "%s: header is not well-formed JSON (error near byte %zu of %llu)", what, stopped,
                  (unsigned long long)n);
    } else {
        out->data = file + 8 + n;
        out->data_bytes = file_bytes - 8 - (size_t)n;
        out->tensors = xcalloc((size_t)cJSON_GetArraySize(root), sizeof(SafetensorsTensor));
        for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
            if (strcmp(e->string, "__metadata__") == 0) {
                rc = check_metadata(e, what, err);
                continue;
            }
            SafetensorsTensor *t = &out->tensors[out->num_tensors++];
            t->name = strdup(e->string);
            if (!t->name) die("out of host memory copying a tensor name");
            rc = parse_tensor(e, what, t, err);
        }
        if (rc == 0) rc = check_tiling(out, what, err);
    }
    cJSON_Delete(root);
    free(text);
    if (rc != 0) safetensors_index_free(out);
    return rc;
}

void safetensors_index_free(SafetensorsIndex *ix) {
    for (int i = 0; i < ix->num_tensors; i++) free(ix->tensors[i].name);
    free(ix->tensors);
    memset(ix, 0, sizeof(*ix));
}

// ----------------------------------------------------------------------------
// config.json: Hugging Face's GPT2Config names for llm.c's header slots

static int round_up_vocab(int v) { return v > (1 << 24) ? v : (v + 127) / 128 * 128; }

static int json_int_field(const cJSON *root, const char *key, int *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    size_t v;
    if (!item || json_size(item, &v) || v > (1u << 30)) return -1;
    *out = (int)v;
    return 0;
}

int safetensors_read_config(const char *json, size_t json_bytes, const char *what, GPT2Config *c, Error *err) {
    memset(c, 0, sizeof(*c));
    size_t stopped;
    cJSON *root = parse_json_object(json, json_bytes, &stopped);
    if (!root) return fail(err, "%s: not a well-formed JSON object", what);
    static const char *const keys[] = {"n_layer", "n_head", "n_embd", "vocab_size"};
    int *slots[] = {&c->num_layers, &c->num_heads, &c->channels, &c->vocab_size};
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        if (json_int_field(root, keys[i], slots[i]))
            rc = fail(err, "%s: missing or invalid integer '%s'", what, keys[i]);
    // n_positions is the current name; configs from before transformers 4 call it n_ctx.
    if (rc == 0 && json_int_field(root, "n_positions", &c->max_seq_len) &&
        json_int_field(root, "n_ctx", &c->max_seq_len))
        rc = fail(err, "%s: missing or invalid integer 'n_positions' (or 'n_ctx')", what);
    cJSON_Delete(root);
    if (rc != 0) return rc;
    c->padded_vocab_size = round_up_vocab(c->vocab_size);
    return gpt2_config_check(c, what, err);
}

// ----------------------------------------------------------------------------
// GPT-2's tensor names, in llm.c's parameter order

// Hugging Face's GPT-2 uses Conv1D layers, whose weight is stored (in, out); llm.c stores every
// matmul weight (out, in), one row per output, so those four are transposed on the way in.
static const struct {
    const char *name;  // without "transformer." and, per layer, without "h.{i}."
    int per_layer;
    int transpose;
} hf_tensors[NUM_PARAMS] = {
    [PARAM_WTE] = {"wte.weight", 0, 0},
    [PARAM_WPE] = {"wpe.weight", 0, 0},
    [PARAM_LN1W] = {"ln_1.weight", 1, 0},
    [PARAM_LN1B] = {"ln_1.bias", 1, 0},
    [PARAM_QKVW] = {"attn.c_attn.weight", 1, 1},
    [PARAM_QKVB] = {"attn.c_attn.bias", 1, 0},
    [PARAM_ATTPROJW] = {"attn.c_proj.weight", 1, 1},
    [PARAM_ATTPROJB] = {"attn.c_proj.bias", 1, 0},
    [PARAM_LN2W] = {"ln_2.weight", 1, 0},
    [PARAM_LN2B] = {"ln_2.bias", 1, 0},
    [PARAM_FCW] = {"mlp.c_fc.weight", 1, 1},
    [PARAM_FCB] = {"mlp.c_fc.bias", 1, 0},
    [PARAM_FCPROJW] = {"mlp.c_proj.weight", 1, 1},
    [PARAM_FCPROJB] = {"mlp.c_proj.bias", 1, 0},
    [PARAM_LNFW] = {"ln_f.weight", 0, 0},
    [PARAM_LNFB] = {"ln_f.bias", 0, 0},
};

enum { MAX_LAYERS = 1024 };  // gpt2_config_check's bound

// The shape Hugging Face stores a tensor in, for a configuration; returns the number of dimensions.
static int hf_shape(int param, const GPT2Config *c, size_t shape[2]) {
    size_t C = (size_t)c->channels;
    switch (param) {
    case PARAM_WTE: shape[0] = (size_t)c->vocab_size, shape[1] = C; return 2;
    case PARAM_WPE: shape[0] = (size_t)c->max_seq_len, shape[1] = C; return 2;
    case PARAM_QKVW: shape[0] = C, shape[1] = 3 * C; return 2;
    case PARAM_ATTPROJW: shape[0] = C, shape[1] = C; return 2;
    case PARAM_FCW: shape[0] = C, shape[1] = 4 * C; return 2;
    case PARAM_FCPROJW: shape[0] = 4 * C, shape[1] = C; return 2;
    case PARAM_QKVB: shape[0] = 3 * C; return 1;
    case PARAM_FCB: shape[0] = 4 * C; return 1;
    default: shape[0] = C; return 1;
    }
}

// Decimal layer number at *s (no sign, no leading zeros), advancing past it; -1 if there is none.
static int parse_layer(const char **s) {
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    int v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v >= MAX_LAYERS) return -1;
    }
    *s = p;
    return v;
}

typedef enum { NAME_PARAM, NAME_IGNORED, NAME_LM_HEAD, NAME_UNKNOWN } NameKind;

// Classifies a tensor name: which parameter and layer, or a buffer to skip.
static NameKind classify(const char *name, int *param, int *layer) {
    if (strcmp(name, "lm_head.weight") == 0) return NAME_LM_HEAD;
    if (strncmp(name, "transformer.", 12) == 0) name += 12;
    *layer = 0;
    const char *rest = name;
    if (strncmp(name, "h.", 2) == 0) {
        rest = name + 2;
        *layer = parse_layer(&rest);
        if (*layer < 0 || *rest != '.') return NAME_UNKNOWN;
        rest++;
        // The causal mask and its fill value, saved as buffers by older transformers versions.
        if (strcmp(rest, "attn.bias") == 0 || strcmp(rest, "attn.masked_bias") == 0) return NAME_IGNORED;
    }
    for (int p = 0; p < NUM_PARAMS; p++)
        if (hf_tensors[p].per_layer == (rest != name) && strcmp(rest, hf_tensors[p].name) == 0) {
            *param = p;
            return NAME_PARAM;
        }
    return NAME_UNKNOWN;
}

static void format_shape(char *buf, size_t cap, const size_t *shape, int ndim) {
    int k = snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k > 0 && (size_t)k < cap; d++)
        k += snprintf(buf + k, cap - (size_t)k, d ? ", %zu" : "%zu", shape[d]);
    if (k > 0 && (size_t)k < cap) snprintf(buf + k, cap - (size_t)k, "]");
}

// ----------------------------------------------------------------------------
// Conversion into llm.c's layout

typedef enum { SRC_F32, SRC_F16, SRC_BF16 } SrcType;

// IEEE half -> float, exactly: every half value, subnormals, infinities and NaN included, is a float.
static inline float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    } else {
        float f = (float)mant * 0x1p-24f;  // subnormal (or zero): mant * 2^-24, exact in float
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Element i of src into element j of dst. The data section has no alignment promise, hence memcpy.
// A bf16 destination only ever receives bf16, copied bit for bit; so does fp32 from fp32.
static inline void copy_elem(void *dst, DType dt, size_t j, const uint8_t *src, SrcType st, size_t i) {
    if (dt == DTYPE_BF16) {
        memcpy((uint16_t *)dst + j, src + 2 * i, 2);
        return;
    }
    float v;
    uint16_t h;
    if (st == SRC_F32) {
        memcpy(&v, src + 4 * i, 4);
    } else {
        memcpy(&h, src + 2 * i, 2);
        v = st == SRC_F16 ? f16_to_float(h) : bf16_to_float(h);
    }
    ((float *)dst)[j] = v;
}

enum { TILE = 64 };

// One TILE x TILE block of a transpose: (rows, cols) source, (cols, rows) destination. Always
// inlined, so each call below with constant types compiles to a loop without per-element branches.
static inline __attribute__((always_inline)) void transpose_tile(void *dst, DType dt, const uint8_t *src,
                                                                 SrcType st, size_t rows, size_t cols, size_t r0,
                                                                 size_t c0) {
    size_t r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
    for (size_t c = c0; c < c1; c++)
        for (size_t r = r0; r < r1; r++) copy_elem(dst, dt, c * rows + r, src, st, r * cols + c);
}

// Copies a (rows, cols) source tensor into dst, as (cols, rows) when transposing. Threads take
// whole row blocks or tiles, which also spreads the page faults of the mapping over the cores
// (1558M is 6 GB). Tiles keep both the reads and the writes of a transpose within cache lines.
static void copy_tensor(void *dst, DType dt, const uint8_t *src, SrcType st, size_t rows, size_t cols,
                        int transpose) {
    int parallel = rows * cols > 65536;
    if (!transpose) {
#pragma omp parallel for schedule(static) if (parallel)
        for (size_t r0 = 0; r0 < rows; r0 += TILE) {
            size_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
            if (dt == DTYPE_BF16 || st == SRC_F32)  // same type: the bytes as they are
                memcpy((char *)dst + r0 * cols * dtype_size(dt), src + r0 * cols * dtype_size(dt),
                       (r1 - r0) * cols * dtype_size(dt));
            else
                for (size_t i = r0 * cols; i < r1 * cols; i++) copy_elem(dst, dt, i, src, st, i);
        }
        return;
    }
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
    for (size_t r0 = 0; r0 < rows; r0 += TILE)
        for (size_t c0 = 0; c0 < cols; c0 += TILE) {
            if (dt == DTYPE_BF16) transpose_tile(dst, DTYPE_BF16, src, SRC_BF16, rows, cols, r0, c0);
            else if (st == SRC_F32) transpose_tile(dst, DTYPE_F32, src, SRC_F32, rows, cols, r0, c0);
            else if (st == SRC_BF16) transpose_tile(dst, DTYPE_F32, src, SRC_BF16, rows, cols, r0, c0);
            else transpose_tile(dst, DTYPE_F32, src, SRC_F16, rows, cols, r0, c0);
        }
}

// ----------------------------------------------------------------------------
// Index -> GPT2Model

int safetensors_gpt2_from_index(GPT2Model *m, const SafetensorsIndex *ix, const GPT2Config *config,
                                const char *what, Error *err) {
    // Which tensor fills each (parameter, layer): slots[param * MAX_LAYERS + layer].
    const SafetensorsTensor **slots = xcalloc((size_t)NUM_PARAMS * MAX_LAYERS, sizeof(*slots));
    const SafetensorsTensor *lm_head = NULL;
    int layers_seen = 0, rc = 0;
    for (int i = 0; i < ix->num_tensors && rc == 0; i++) {
        const SafetensorsTensor *t = &ix->tensors[i];
        int param = 0, layer = 0;
        switch (classify(t->name, &param, &layer)) {
        case NAME_IGNORED: break;
        case NAME_LM_HEAD: lm_head = t; break;
        case NAME_UNKNOWN: rc = fail(err, "%s: unexpected tensor '%s': not part of GPT-2", what, t->name); break;
        case NAME_PARAM:
            if (slots[param * MAX_LAYERS + layer])
                rc = fail(err, "%s: tensors '%s' and '%s' are the same GPT-2 parameter", what,
                          slots[param * MAX_LAYERS + layer]->name, t->name);
            slots[param * MAX_LAYERS + layer] = t;
            if (hf_tensors[param].per_layer && layer + 1 > layers_seen) layers_seen = layer + 1;
        }
    }

    GPT2Config c = {0};
    const char *source = "config.json";
    if (rc == 0 && config) {
        c = *config;
        if (layers_seen > c.num_layers)
            rc = fail(err, "%s: holds layer h.%d, but config.json says n_layer=%d", what, layers_seen - 1,
                      c.num_layers);
    } else if (rc == 0) {
        // No config.json: wte is (V, C), wpe (maxT, C), the layers are counted. The number of heads
        // is not in any shape; every GPT-2 size uses head size 64, so NH = C / 64.
        source = "the tensor shapes";
        const SafetensorsTensor *wte = slots[PARAM_WTE * MAX_LAYERS], *wpe = slots[PARAM_WPE * MAX_LAYERS];
        if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
            rc = fail(err, "%s: without config.json, needs 2-D tensors wte.weight and wpe.weight to read the sizes",
                      what);
        else if (wte->shape[1] == 0 || wte->shape[1] % 64 != 0 || wte->shape[1] > 65536)
            rc = fail(err, "%s: no config.json beside the file, and channels %zu is not a multiple of GPT-2's "
                      "head size 64: cannot tell the number of heads", what, wte->shape[1]);
        else if (wte->shape[0] > (1 << 24) || wpe->shape[0] > 65536)
            rc = fail(err, "%s: wte.weight %zu rows or wpe.weight %zu rows exceed the supported sizes", what,
                      wte->shape[0], wpe->shape[0]);
        else {
            c = (GPT2Config){.vocab_size = (int)wte->shape[0], .channels = (int)wte->shape[1],
                             .max_seq_len = (int)wpe->shape[0], .num_layers = layers_seen,
                             .num_heads = (int)wte->shape[1] / 64};
            c.padded_vocab_size = round_up_vocab(c.vocab_size);
            rc = gpt2_config_check(&c, what, err);
        }
    }

    // Every tensor present, in the shape the configuration implies, in a type we convert.
    int any_f32 = 0, any_f16 = 0, any_bf16 = 0;
    for (int p = 0; p < NUM_PARAMS && rc == 0; p++)
        for (int l = 0; l < (hf_tensors[p].per_layer ? c.num_layers : 1) && rc == 0; l++) {
            const SafetensorsTensor *t = slots[p * MAX_LAYERS + l];
            char name[64];
            if (hf_tensors[p].per_layer) snprintf(name, sizeof(name), "h.%d.%s", l, hf_tensors[p].name);
            else snprintf(name, sizeof(name), "%s", hf_tensors[p].name);
            size_t want[2];
            int ndim = hf_shape(p, &c, want);
            if (!t) {
                rc = fail(err, "%s: missing tensor %s", what, name);
            } else if (t->ndim != ndim || t->shape[0] != want[0] || (ndim == 2 && t->shape[1] != want[1])) {
                char have_s[128], want_s[64];
                format_shape(have_s, sizeof(have_s), t->shape, t->ndim);
                format_shape(want_s, sizeof(want_s), want, ndim);
                rc = fail(err, "%s: tensor %s has shape %s, but %s implies %s", what, t->name, have_s, source,
                          want_s);
            } else if (strcmp(t->dtype, "F32") == 0) any_f32 = 1;
            else if (strcmp(t->dtype, "F16") == 0) any_f16 = 1;
            else if (strcmp(t->dtype, "BF16") == 0) any_bf16 = 1;
            else rc = fail(err, "%s: tensor %s has dtype %s; supported are F32, F16 and BF16", what, t->name, t->dtype);
        }

    // GPT-2 ties the output projection to wte; a differing lm_head would be silently ignored below.
    const SafetensorsTensor *wte = slots[PARAM_WTE * MAX_LAYERS];
    if (rc == 0 && lm_head &&
        (lm_head->end - lm_head->begin != wte->end - wte->begin || strcmp(lm_head->dtype, wte->dtype) != 0 ||
         memcmp(ix->data + lm_head->begin, ix->data + wte->begin, wte->end - wte->begin) != 0))
        rc = fail(err, "%s: lm_head.weight differs from wte.weight: GPT-2 ties them, an untied head is not supported",
                  what);

    if (rc == 0) {
        // All bf16 stays bf16; fp16 has no engine of its own, so it and any mix become fp32 (exact).
        memset(m, 0, sizeof(*m));
        snprintf(m->path, sizeof(m->path), "%s", what);
        m->config = c;
        m->dtype = any_bf16 && !any_f32 && !any_f16 ? DTYPE_BF16 : DTYPE_F32;
        gpt2_param_counts(&c, m->param_counts, &m->num_parameters);
        size_t bytes = m->num_parameters * dtype_size(m->dtype);
        m->param_memory = malloc(bytes);
        if (!m->param_memory) rc = fail(err, "%s: out of host memory for %zu bytes of parameters", what, bytes);
    }
    if (rc == 0) {
        gpt2_model_point_params(m);
        size_t esz = dtype_size(m->dtype);
        for (int p = 0; p < NUM_PARAMS; p++) {
            int layers = hf_tensors[p].per_layer ? c.num_layers : 1;
            size_t per_layer = m->param_counts[p] / (size_t)layers;
            for (int l = 0; l < layers; l++) {
                const SafetensorsTensor *t = slots[p * MAX_LAYERS + l];
                SrcType st = strcmp(t->dtype, "F32") == 0 ? SRC_F32 : strcmp(t->dtype, "F16") == 0 ? SRC_F16 : SRC_BF16;
                size_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 1;
                char *dst = (char *)m->params[p] + (size_t)l * per_layer * esz;
                copy_tensor(dst, m->dtype, ix->data + t->begin, st, rows, cols, hf_tensors[p].transpose);
            }
        }
        // llm.c pads wte to a multiple of 128 rows for aligned matmuls; the extra rows are zero.
        size_t used = (size_t)c.vocab_size * (size_t)c.channels;
        memset((char *)m->params[PARAM_WTE] + used * esz, 0, (m->param_counts[PARAM_WTE] - used) * esz);
    }
    free(slots);
    return rc;
}

// ----------------------------------------------------------------------------
// Files: the .safetensors memory-mapped for the copy, config.json beside it

// Reads config.json from the directory of `path`; returns 1 when there is none, 0 when read, -1 on error.
static int read_config_beside(const char *path, GPT2Config *c, Error *err) {
    char cfg[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash) {
        if (snprintf(cfg, sizeof(cfg), "%.*s/config.json", (int)(slash - path), path) >= (int)sizeof(cfg))
            return fail(err, "path too long for config.json beside it: %s", path);
    } else {
        snprintf(cfg, sizeof(cfg), "config.json");
    }
    struct stat st;
    if (stat(cfg, &st) != 0 && errno == ENOENT) return 1;
    MappedFile f;  // refuses what is not a regular file (a FIFO without waiting for a writer)
    if (mapped_file_open(&f, cfg, err)) return -1;
    // A GPT-2 config.json is about 1 KB; a megabyte is room for any annotations.
    enum { MAX_CONFIG = 1 << 20 };
    const int rc = f.bytes > MAX_CONFIG
                       ? fail(err, "%s: larger than %d bytes: not a GPT-2 config", cfg, MAX_CONFIG)
                       : safetensors_read_config(f.data ? f.data : "", f.bytes, cfg, c, err);
    mapped_file_close(&f);
    return rc;
}

int safetensors_load_gpt2(GPT2Model *m, const char *path, Error *err) {
    memset(m, 0, sizeof(*m));
    MappedFile file;
    if (mapped_file_open(&file, path, err)) return -1;
    if (file.bytes < 8) {
        fail(err, "%s: truncated: %zu bytes, shorter than the 8-byte header length", path, file.bytes);
        mapped_file_close(&file);
        return -1;
    }
    GPT2Config config;
    int have_config = read_config_beside(path, &config, err), rc = have_config < 0 ? -1 : 0;
    SafetensorsIndex ix;
    if (rc == 0) rc = safetensors_parse_header(file.data, file.bytes, path, &ix, err);
    if (rc == 0) {
        rc = safetensors_gpt2_from_index(m, &ix, have_config == 0 ? &config : NULL, path, err);
        safetensors_index_free(&ix);
    }
    mapped_file_close(&file);
    return rc;
}
