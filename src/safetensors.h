// Hugging Face safetensors, read in C: an 8-byte little-endian header length, a JSON header
// (dtype, shape, data_offsets per tensor), then the raw tensor bytes, memory-mapped.
// GPT-2's tensors are converted at load into llm.c's order and layout (model.h), so the engines
// never see the difference.
//
// Loading is two steps with no file access between them, so that tests/fuzz_safetensors.c can
// drive both on a memory buffer: parse the header into an index (every offset checked against
// the bytes), then build the GPT-2 model from the index.
#pragma once

#include "model.h"

// Loads a GPT-2 from a .safetensors file (config.json beside it, when present, gives the
// configuration; otherwise the shapes do). Every malformed case is one line in err naming the file.
int safetensors_load_gpt2(GPT2Model *model, const char *path, Error *err);

// ----------------------------------------------------------------------------
// The steps inside safetensors_load_gpt2, exposed for the tests and the fuzzer

enum { SAFETENSORS_MAX_DIMS = 8 };

typedef struct {
    char *name;
    char dtype[8];        // as the header spells it: "F32", "BF16", "F16", "I64", ...
    int dtype_bytes;
    int ndim;
    size_t shape[SAFETENSORS_MAX_DIMS];
    size_t begin, end;    // byte range inside the data section
} SafetensorsTensor;

typedef struct {
    SafetensorsTensor *tensors;  // in the header's order
    int num_tensors;
    const uint8_t *data;         // the data section: the bytes after the header, not owned
    size_t data_bytes;
} SafetensorsIndex;

// Parses and checks the header of a whole file held in memory: the length against the file,
// the JSON, every dtype, shape and offset, and that the tensors tile the data section exactly
// (no overlap, no hole, nothing after the last). `what` names the file in messages.
int safetensors_parse_header(const uint8_t *file, size_t file_bytes, const char *what, SafetensorsIndex *out,
                             Error *err);
void safetensors_index_free(SafetensorsIndex *index);

// Reads the GPT-2 configuration from a Hugging Face config.json (n_layer, n_head, n_embd,
// n_positions or n_ctx, vocab_size); the padded vocabulary is rounded up to 128 as llm.c does.
int safetensors_read_config(const char *json, size_t json_bytes, const char *what, GPT2Config *config,
                            Error *err);

// Builds the model in llm.c's layout on the heap from a parsed index. config is NULL when no
// config.json came with the file: the shapes then give everything but the number of heads.
int safetensors_gpt2_from_index(GPT2Model *model, const SafetensorsIndex *index, const GPT2Config *config,
                                const char *what, Error *err);
