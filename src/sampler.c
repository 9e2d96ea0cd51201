// Sampling: softmax at a temperature, keep the top k, then the top-p nucleus, renormalise, draw.
#include "sampler.h"

#include <math.h>

#include "common.h"

void sampler_create(Sampler *s, int vocab_size, float temperature, int top_k, float top_p, uint64_t seed) {
    *s = (Sampler){.vocab_size = vocab_size, .temperature = temperature, .top_k = top_k, .top_p = top_p,
                   .rng_state = seed ? seed : 0x9E3779B97F4A7C15ull,  // xorshift must not start at zero
                   .candidates = xmalloc((size_t)vocab_size * sizeof(Candidate))};
}

void sampler_free(Sampler *s) { free(s->candidates); }

float sampler_draw(Sampler *s) {
    uint64_t *x = &s->rng_state;
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return (float)((*x * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;  // top 24 bits
}

int sampler_sample(Sampler *s, const float *logits) { return sampler_pick(s, logits, sampler_draw(s)); }

static int by_prob_desc(const void *a, const void *b) {
    float pa = ((const Candidate *)a)->prob, pb = ((const Candidate *)b)->prob;
    if (pa != pb) return pa < pb ? 1 : -1;
    return ((const Candidate *)a)->id - ((const Candidate *)b)->id;  // ties: lower id first, deterministic
}

// Weaker in the final order (prob desc, id asc): a lower prob, or the same prob and a higher id.
static int weaker(const Candidate *a, const Candidate *b) {
    return a->prob < b->prob || (a->prob == b->prob && a->id > b->id);
}

// Min-heap in that order over the first n candidates: the root is the weakest of the kept top k,
// so ties at the k-th value keep their lowest ids however the larger values are placed.
static void sift_down(Candidate *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && weaker(&h[l], &h[m])) m = l;
        if (r < n && weaker(&h[r], &h[m])) m = r;
        if (m == i) return;
        Candidate t = h[i];
        h[i] = h[m], h[m] = t;
        i = m;
    }
}

int sampler_pick(Sampler *s, const float *logits, float u) {
    int V = s->vocab_size;
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->temperature <= 0.0f) return best;

    // Probabilities at the temperature, relative to the largest logit (no overflow).
    Candidate *c = s->candidates;
    for (int i = 0; i < V; i++) c[i] = (Candidate){.prob = expf((logits[i] - logits[best]) / s->temperature), .id = i};
    // Top k in O(V log k): a min-heap of the k largest seen so far.
    int n = V;
    if (s->top_k > 0 && s->top_k < V) {
        n = s->top_k;
        for (int i = n / 2 - 1; i >= 0; i--) sift_down(c, n, i);
        for (int i = n; i < V; i++)
            if (c[i].prob > c[0].prob) c[0] = c[i], sift_down(c, n, 0);
    }
    qsort(c, n, sizeof(Candidate), by_prob_desc);
    // Nucleus: the smallest prefix whose share of the top-k distribution reaches top_p (as Hugging
    // Face and ggml apply them: top-k first, then top-p on what is left, renormalised).
    // Sums in float, in this order: the device sampler (kernels/sampling.cu) adds the same way.
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += c[i].prob;
    float kept = 0.0f;
    int m = 0;
    while (m < n) {
        kept += c[m++].prob;
        if (kept >= s->top_p * sum) break;
    }
    float r = u * kept;
    float acc = 0.0f;
    for (int i = 0; i < m; i++) {
        acc += c[i].prob;
        if (r < acc) return c[i].id;
    }
    return c[m - 1].id;  // rounding left r at the very top
}
