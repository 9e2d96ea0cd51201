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

// The next uniform draw in [0, 1) from the seeded generator (xorshift64*). Every pick consumes one,
// greedy ones too, so the host and the device samplers see the same draws for the same seed.
float sampler_draw(Sampler *s);

// Picks a token from logits[vocab_size] with the uniform draw u; the logits are not modified.
// kernels/sampling.cu makes the same choice on the device.
int sampler_pick(Sampler *s, const float *logits, float u);

// sampler_pick with the next draw.
int sampler_sample(Sampler *s, const float *logits);
