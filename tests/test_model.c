// llm.c checkpoint loader: every malformed header or size gives its one-line message and no model;
// a well-formed file loads with its tensors where llm.c puts them.
#include <sys/stat.h>

#include "model.h"
#include "test.h"

static char dir[512];

// A tiny valid configuration: L=2, C=8, NH=2, V=10 (Vp=16), maxT=4.
static void tiny_header(int32_t h[256], int version) {
    memset(h, 0, 256 * sizeof(int32_t));
    h[0] = 20240326, h[1] = version, h[2] = 4, h[3] = 10, h[4] = 2, h[5] = 2, h[6] = 8, h[7] = 16;
}

static size_t tiny_param_count(const int32_t h[256]) {
    GPT2Config c = {.max_seq_len = h[2], .vocab_size = h[3], .num_layers = h[4], .num_heads = h[5],
                    .channels = h[6], .padded_vocab_size = h[7]};
    size_t counts[NUM_PARAMS], total;
    gpt2_param_counts(&c, counts, &total);
    return total;
}

// Writes a header and `payload_bytes` of data (element i of fp32 data = i, bf16 = i as bf16).
static const char *write_file(const char *name, const int32_t h[256], size_t header_bytes, size_t payload_bytes) {
    static char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "test_model: cannot write %s\n", path);
        exit(1);
    }
    fwrite(h, 1, header_bytes, f);
    int bf16 = h[1] == 5;
    for (size_t i = 0; i < payload_bytes / (bf16 ? 2 : 4); i++) {
        float v = (float)(i % 1000);
        if (bf16) {
            uint16_t b = float_to_bf16(v);
            fwrite(&b, 2, 1, f);
        } else {
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
    return path;
}

static void expect_error(const char *name, const char *path, const char *want) {
    GPT2Model m;
    Error err = {{0}};
    int rc = gpt2_model_load(&m, path, &err);
    CHECK(rc == -1 && strstr(err.msg, want) && strstr(err.msg, path), name, "rc=%d msg='%s' (want '%s' and the path)",
          rc, err.msg, want);
}

static void expect_bad_header(const char *name, int index, int value, const char *want) {
    int32_t h[256];
    tiny_header(h, 3);
    size_t bytes = tiny_param_count(h) * 4;
    h[index] = value;
    expect_error(name, write_file(name, h, sizeof(h), bytes), want);
}

int main(void) {
    snprintf(dir, sizeof(dir), "%s/model_tests", getenv("GPT2_TMP") ? getenv("GPT2_TMP") : "/tmp");
    mkdir(dir, 0755);
    int32_t h[256];
    tiny_header(h, 3);
    size_t n = tiny_param_count(h);

    // --- well-formed files
    GPT2Model m;
    Error err = {{0}};
    const char *ok = write_file("ok.bin", h, sizeof(h), n * 4);
    int rc = gpt2_model_load(&m, ok, &err);
    CHECK(rc == 0 && m.dtype == DTYPE_F32 && m.num_parameters == n, "loads_fp32", "rc=%d %s", rc, err.msg);
    if (rc == 0) {
        // wte starts right after the header; lnfb is the last C floats of the file.
        CHECK(gpt2_param_get(&m, PARAM_WTE, 1) == 1.0f && m.param_counts[PARAM_QKVW] == 2 * 3 * 8 * 8 &&
                  gpt2_param_get(&m, PARAM_LNFB, 7) == (float)((n - 1) % 1000),
              "tensor_layout", "wte[1]=%g lnfb[7]=%g", gpt2_param_get(&m, PARAM_WTE, 1),
              gpt2_param_get(&m, PARAM_LNFB, 7));
        gpt2_model_free(&m);
    }
    tiny_header(h, 5);
    rc = gpt2_model_load(&m, write_file("ok_bf16.bin", h, sizeof(h), n * 2), &err);
    CHECK(rc == 0 && m.dtype == DTYPE_BF16 && gpt2_param_get(&m, PARAM_WPE, 3) == (float)(16 * 8 + 3), "loads_bf16",
          "rc=%d %s", rc, err.msg);
    if (rc == 0) gpt2_model_free(&m);

    // --- malformed files: one message each, naming the file
    tiny_header(h, 3);
    expect_error("missing_file", "/nonexistent/gpt2.bin", "cannot open");
    expect_error("shorter_than_header", write_file("short.bin", h, 100, 0), "truncated");
    expect_error("truncated_tensors", write_file("trunc.bin", h, sizeof(h), n * 4 - 4), "truncated");
    expect_error("trailing_data", write_file("long.bin", h, sizeof(h), n * 4 + 4), "trailing data");
    expect_error("directory_without_model", dir, "no model.safetensors");
    expect_bad_header("bad_magic", 0, 12345, "bad magic");
    expect_bad_header("bad_version", 1, 4, "unsupported version");
    expect_bad_header("zero_layers", 4, 0, "number of layers");
    expect_bad_header("negative_heads", 5, -2, "number of heads");
    expect_bad_header("negative_channels", 6, -8, "channels");
    expect_bad_header("channels_not_divisible", 5, 3, "not divisible");
    expect_bad_header("zero_context", 2, 0, "max sequence length");
    expect_bad_header("zero_vocab", 3, 0, "vocabulary size");
    expect_bad_header("padded_vocab_too_small", 7, 9, "padded vocabulary");
    // Sizes whose products overflow 64 bits must be refused before any arithmetic on them.
    tiny_header(h, 3);
    h[4] = 1024, h[6] = 65536, h[5] = 1;
    expect_error("absurd_sizes", write_file("absurd.bin", h, sizeof(h), 0), "2^40");

    return test_exit_code();
}
