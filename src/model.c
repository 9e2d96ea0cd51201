// Loading GPT-2 parameters. llm.c's flat checkpoint is memory-mapped and used in place after every
// number in its header has been checked against the file; nothing is read before the file is known
// to hold exactly the tensors the header promises.
#include "model.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

const char *const gpt2_param_names[NUM_PARAMS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

// ----------------------------------------------------------------------------
// Configuration and tensor sizes

// a * b into *out, or -1 when it does not fit in size_t.
static int mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

int gpt2_param_counts(const GPT2Config *c, size_t counts[NUM_PARAMS], size_t *total) {
    size_t C = (size_t)c->channels, L = (size_t)c->num_layers;
    size_t rows[NUM_PARAMS] = {
        (size_t)c->padded_vocab_size, (size_t)c->max_seq_len, L, L, L * 3 * C, L * 3, L * C, L,
        L, L, L * 4 * C, L * 4, L * C, L, 1, 1,
    };
    size_t cols[NUM_PARAMS] = {C, C, C, C, C, C, C, C, C, C, C, C, 4 * C, C, C, C};
    size_t sum = 0;
    for (int i = 0; i < NUM_PARAMS; i++) {
        if (mul_size(rows[i], cols[i], &counts[i]) || counts[i] > SIZE_MAX - sum) return -1;
        sum += counts[i];
    }
    *total = sum;
    return 0;
}

int gpt2_config_check(const GPT2Config *c, const char *what, Error *err) {
    // Limits far above any GPT-2 (1558M: L=48, C=1600, maxT=1024) that keep every product of two
    // sizes inside int64 and every index the kernels form inside int32 where they use one.
    if (c->num_layers <= 0 || c->num_layers > 1024)
        return fail(err, "%s: number of layers %d is outside 1..1024", what, c->num_layers);
    if (c->num_heads <= 0 || c->num_heads > 1024)
        return fail(err, "%s: number of heads %d is outside 1..1024", what, c->num_heads);
    if (c->channels <= 0 || c->channels > 65536)
        return fail(err, "%s: channels %d is outside 1..65536", what, c->channels);
    if (c->channels % c->num_heads != 0)
        return fail(err, "%s: channels %d is not divisible by the number of heads %d", what, c->channels,
                    c->num_heads);
    if (c->max_seq_len <= 0 || c->max_seq_len > 65536)
        return fail(err, "%s: max sequence length %d is outside 1..65536", what, c->max_seq_len);
    if (c->vocab_size <= 0 || c->vocab_size > (1 << 24))
        return fail(err, "%s: vocabulary size %d is outside 1..16777216", what, c->vocab_size);
    if (c->padded_vocab_size < c->vocab_size || c->padded_vocab_size > (1 << 24))
        return fail(err, "%s: padded vocabulary size %d is smaller than the vocabulary %d or too large", what,
                    c->padded_vocab_size, c->vocab_size);
    size_t counts[NUM_PARAMS], total;
    if (gpt2_param_counts(c, counts, &total) || total > ((size_t)1 << 40))
        return fail(err, "%s: the header's sizes make more than 2^40 parameters", what);
    return 0;
}

void gpt2_model_point_params(GPT2Model *m) {
    gpt2_param_counts(&m->config, m->param_counts, &m->num_parameters);
    char *p = (char *)m->param_memory;
    for (int i = 0; i < NUM_PARAMS; i++) {
        m->params[i] = p;
        p += m->param_counts[i] * dtype_size(m->dtype);
    }
}

// ----------------------------------------------------------------------------
// llm.c's flat checkpoint: 256 int32 header, then the 16 tensors back to back

enum { LLMC_HEADER_INTS = 256, LLMC_MAGIC = 20240326, LLMC_VERSION_F32 = 3, LLMC_VERSION_BF16 = 5 };

int gpt2_model_load_llmc(GPT2Model *m, const char *path, Error *err) {
    memset(m, 0, sizeof(*m));
    snprintf(m->path, sizeof(m->path), "%s", path);
    MappedFile file;
    if (mapped_file_open(&file, path, err)) return -1;
    size_t header_bytes = LLMC_HEADER_INTS * sizeof(int32_t);
    if (file.bytes < header_bytes) {
        fail(err, "%s: truncated: %zu bytes, shorter than the 1024-byte header", path, file.bytes);
        mapped_file_close(&file);
        return -1;
    }

    const int32_t *h = (const int32_t *)file.data;
    int rc = 0;
    if (h[0] != LLMC_MAGIC) {
        rc = fail(err, "%s: bad magic %d (want %d): not an llm.c GPT-2 checkpoint", path, h[0], LLMC_MAGIC);
    } else if (h[1] != LLMC_VERSION_F32 && h[1] != LLMC_VERSION_BF16) {
        rc = fail(err, "%s: unsupported version %d (want 3 for fp32 or 5 for bf16)", path, h[1]);
    } else {
        m->config = (GPT2Config){.max_seq_len = h[2], .vocab_size = h[3], .num_layers = h[4],
                                 .num_heads = h[5], .channels = h[6], .padded_vocab_size = h[7]};
        m->dtype = h[1] == LLMC_VERSION_BF16 ? DTYPE_BF16 : DTYPE_F32;
        rc = gpt2_config_check(&m->config, path, err);
    }
    if (rc == 0) {
        gpt2_param_counts(&m->config, m->param_counts, &m->num_parameters);
        size_t want = header_bytes + m->num_parameters * dtype_size(m->dtype);
        if (file.bytes != want)
            rc = fail(err, "%s: %s: %zu bytes, but the header's sizes need exactly %zu", path,
                      file.bytes < want ? "truncated" : "trailing data", file.bytes, want);
    }
    if (rc != 0) {
        mapped_file_close(&file);
        return rc;
    }
    m->file = file;
    m->param_memory = (char *)file.data + header_bytes;
    gpt2_model_point_params(m);
    return 0;
}

// ----------------------------------------------------------------------------
// Any supported file: choose the reader by what the path is

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int gpt2_model_load(GPT2Model *m, const char *path, Error *err) {
    struct stat st;
    if (stat(path, &st) != 0) return fail(err, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        // A downloaded Hugging Face directory holds model.safetensors; an llm.c export a .bin.
        char file[PATH_MAX];
        // The reason before the path, which the message may cut short.
        if (snprintf(file, sizeof(file), "%s/model.safetensors", path) >= (int)sizeof(file))
            return fail(err, "path too long for the files in it: %s", path);
        if (access(file, R_OK) == 0) return safetensors_load_gpt2(m, file, err);
        DIR *dir = opendir(path);
        if (!dir) return fail(err, "%s: cannot open: %s", path, strerror(errno));
        int bins = 0, too_long = 0;
        for (struct dirent *e; (e = readdir(dir));)
            if (ends_with(e->d_name, ".bin") && bins++ == 0)
                too_long = snprintf(file, sizeof(file), "%s/%s", path, e->d_name) >= (int)sizeof(file);
        closedir(dir);
        if (too_long) return fail(err, "path too long for the files in it: %s", path);
        if (bins == 1) return gpt2_model_load_llmc(m, file, err);
        if (bins > 1)
            return fail(err, "%s: directory holds %d .bin files and no model.safetensors: name one", path, bins);
        return fail(err, "%s: directory holds no model.safetensors and no .bin", path);
    }
    if (ends_with(path, ".safetensors")) return safetensors_load_gpt2(m, path, err);
    return gpt2_model_load_llmc(m, path, err);
}

void gpt2_model_free(GPT2Model *m) {
    if (m->file.data) mapped_file_close(&m->file);
    else free(m->param_memory);
    memset(m, 0, sizeof(*m));
}

const char *gpt2_default_model_path(void) {
    if (access("model/gpt2_124M.bin", R_OK) == 0) return "model/gpt2_124M.bin";
    if (access("model/gpt2/model.safetensors", R_OK) == 0) return "model/gpt2";
    return "model/gpt2_124M.bin";
}

void gpt2_model_describe(const GPT2Model *m, FILE *out) {
    const GPT2Config *c = &m->config;
    fprintf(out, "model: %s: %zu parameters (%s, %.1f MiB), L=%d C=%d NH=%d V=%d (padded %d) maxT=%d\n", m->path,
            m->num_parameters, dtype_name(m->dtype), m->num_parameters * dtype_size(m->dtype) / 1048576.0,
            c->num_layers, c->channels, c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len);
}
