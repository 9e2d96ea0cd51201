// The GPT-2 model as every engine sees it: a configuration and the 16 parameter tensors in
// llm.c's order and layout, whatever file they came from.
//
// llm.c's flat checkpoint (.bin) is memory-mapped and its tensors used in place. Other formats
// (Hugging Face safetensors) are converted once at load into the same layout, so the CPU and GPU
// engines read one format only.
#pragma once

#include "common.h"
#include "mapped_file.h"

// ----------------------------------------------------------------------------
// Configuration (llm.c header slots [2..7])

typedef struct {
    int max_seq_len;        // maxT: learned positions, so also the longest context
    int vocab_size;         // V: 50257 for GPT-2
    int padded_vocab_size;  // Vp >= V: wte rows, padded for aligned matmuls; rows >= V are never sampled
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C, divisible by NH
} GPT2Config;

static inline int gpt2_head_size(const GPT2Config *c) { return c->channels / c->num_heads; }

// ----------------------------------------------------------------------------
// Parameters

typedef enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 } DType;

static inline size_t dtype_size(DType t) { return t == DTYPE_BF16 ? 2 : 4; }
static inline const char *dtype_name(DType t) { return t == DTYPE_BF16 ? "bf16" : "fp32"; }

enum {
    PARAM_WTE,       // (Vp, C)     token embedding, tied to the logits
    PARAM_WPE,       // (maxT, C)   position embedding
    PARAM_LN1W,      // (L, C)
    PARAM_LN1B,      // (L, C)
    PARAM_QKVW,      // (L, 3C, C)  rows: q, k, v outputs; each row a dot product over C inputs
    PARAM_QKVB,      // (L, 3C)
    PARAM_ATTPROJW,  // (L, C, C)
    PARAM_ATTPROJB,  // (L, C)
    PARAM_LN2W,      // (L, C)
    PARAM_LN2B,      // (L, C)
    PARAM_FCW,       // (L, 4C, C)
    PARAM_FCB,       // (L, 4C)
    PARAM_FCPROJW,   // (L, C, 4C)
    PARAM_FCPROJB,   // (L, C)
    PARAM_LNFW,      // (C)
    PARAM_LNFB,      // (C)
    NUM_PARAMS
};

extern const char *const gpt2_param_names[NUM_PARAMS];

typedef struct {
    GPT2Config config;
    DType dtype;                   // storage type of every tensor
    size_t param_counts[NUM_PARAMS];  // elements per tensor
    size_t num_parameters;         // sum of param_counts
    void *params[NUM_PARAMS];      // into param_memory, in llm.c's order, contiguous
    void *param_memory;            // num_parameters * dtype_size(dtype) bytes
    MappedFile file;               // param_memory lives in this mapping (llm.c .bin), or on the heap
    char path[1024];
} GPT2Model;

// Element counts of the 16 tensors for a configuration; returns -1 if they overflow size_t.
int gpt2_param_counts(const GPT2Config *c, size_t counts[NUM_PARAMS], size_t *total);

// Checks a configuration's numbers on their own (positive, C % NH == 0, Vp >= V, sizes that fit).
// `what` names the source in the message.
int gpt2_config_check(const GPT2Config *c, const char *what, Error *err);

// Loads a model: llm.c .bin, .safetensors, or a directory holding model.safetensors or a .bin.
// Every failure is one line in err naming the file; nothing is left allocated.
int gpt2_model_load(GPT2Model *model, const char *path, Error *err);

// Loads llm.c's flat checkpoint (magic 20240326, version 3 fp32 or 5 bf16) by memory-mapping it.
int gpt2_model_load_llmc(GPT2Model *model, const char *path, Error *err);

// Lays the tensor pointers over param_memory once config, dtype and param_memory are set.
void gpt2_model_point_params(GPT2Model *model);

// One parameter element as fp32, whatever the storage type.
static inline float gpt2_param_get(const GPT2Model *m, int param, size_t i) {
    if (m->dtype == DTYPE_BF16) return bf16_to_float(((const uint16_t *)m->params[param])[i]);
    return ((const float *)m->params[param])[i];
}

void gpt2_model_free(GPT2Model *model);

// The model the CLI loads without -m: llm.c's model/gpt2_124M.bin when present, else the
// directory `make download` fills (model/gpt2).
const char *gpt2_default_model_path(void);

// One line for the load report: sizes and memory.
void gpt2_model_describe(const GPT2Model *model, FILE *out);
