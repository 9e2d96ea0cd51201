// Choosing the next token from logits: greedy (temperature 0), or temperature, top-k and top-p
// (nucleus) sampling with a seeded generator, so the same seed gives the same text.
#pragma once

#include <stdint.h>

typedef struct {
    float prob;
    int id;
} Candidate;

typedef struct {
    int vocab_size;
    float temperature;  // 0: greedy (argmax)
    int top_k;          // keep the k most likely; 0 or >= vocab: all
    float top_p;        // then the smallest set whose probability reaches p; 1: all
    uint64_t rng_state;
    Candidate *candidates;  // [vocab_size] scratch
} Sampler;

void sampler_create(Sampler *s, int vocab_size, float temperature, int top_k, float top_p, uint64_t seed);
void sampler_free(Sampler *s);

// Picks a token from logits[vocab_size]; the logits are not modified.
int sampler_sample(Sampler *s, const float *logits);

// The generator behind the sampler (xorshift64*), exposed for tests.
float sampler_random_unit(uint64_t *state);  // uniform in [0, 1)
