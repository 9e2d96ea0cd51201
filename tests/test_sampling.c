// The sampler: greedy, top-k, top-p and temperature do what they say, the seed reproduces, and the
// device sampler (kernels/sampling.cu) makes the host's choice for the same draw.
#include <math.h>
#include <string.h>

#include "sampler.h"
#include "test.h"
#ifdef GPT2_CUDA
#include <cuda_runtime.h>

#include "sampling.h"
#endif

static void host_tests(void) {
    enum { V = 6 };
    float logits[V] = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f};
    Sampler s;
    sampler_create(&s, V, 0.0f, 40, 0.9f, 1);
    CHECK(sampler_sample(&s, logits) == 1, "greedy_first_max", "ties must go to the lower id");
    sampler_free(&s);

    sampler_create(&s, V, 1.0f, 1, 1.0f, 7);
    int ok = 1;
    for (int i = 0; i < 100; i++) ok &= sampler_sample(&s, logits) == 1;
    CHECK(ok, "top_k_1_is_greedy", "top-k 1 picked something other than the argmax");
    sampler_free(&s);

    // top-k 3 keeps ids {1, 2, 4}; never anything else.
    sampler_create(&s, V, 1.0f, 3, 1.0f, 9);
    int counts[V] = {0};
    for (int i = 0; i < 30000; i++) counts[sampler_sample(&s, logits)]++;
    CHECK(counts[0] == 0 && counts[3] == 0 && counts[5] == 0 && counts[4] > 0, "top_k_restricts", "counts %d %d %d %d %d %d",
          counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]);
    // Frequencies follow softmax over the kept three: e^2 : e^2 : e^1.
    double z = 2 * exp(2.0) + exp(1.0), want4 = exp(1.0) / z, got4 = counts[4] / 30000.0;
    CHECK(fabs(got4 - want4) < 0.015, "top_k_frequencies", "P(id 4) = %.4f, want %.4f", got4, want4);
    sampler_free(&s);

    // top-p 0.5 over {1: e^2, 2: e^2, 4: e^1, ...}: ids 1 and 2 reach it; 4 never appears.
    sampler_create(&s, V, 1.0f, 0, 0.5f, 11);
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < 20000; i++) counts[sampler_sample(&s, logits)]++;
    CHECK(counts[1] + counts[2] == 20000 && counts[1] > 9000 && counts[2] > 9000, "top_p_nucleus",
          "counts[1]=%d counts[2]=%d", counts[1], counts[2]);
    sampler_free(&s);

    // A high temperature flattens: id 3 (the smallest logit) appears; a low one sharpens it away.
    sampler_create(&s, V, 50.0f, 0, 1.0f, 13);
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < 6000; i++) counts[sampler_sample(&s, logits)]++;
    CHECK(counts[3] > 800, "temperature_flattens", "id 3 drawn %d of 6000 at T=50", counts[3]);
    sampler_free(&s);

    Sampler a, b;
    sampler_create(&a, V, 1.0f, 0, 1.0f, 42);
    sampler_create(&b, V, 1.0f, 0, 1.0f, 42);
    ok = 1;
    for (int i = 0; i < 200; i++) ok &= sampler_sample(&a, logits) == sampler_sample(&b, logits);
    CHECK(ok, "seed_reproduces", "two samplers with seed 42 diverged");
    sampler_free(&a), sampler_free(&b);
}

#ifdef GPT2_CUDA
static float frand(uint64_t *state) {
    Sampler tmp = {.rng_state = *state};
    float u = sampler_draw(&tmp);
    *state = tmp.rng_state;
    return u;
}

// Random logits (with planted ties), random settings: the device must pick what the host picks.
static void device_tests(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        test_skip("device_sampling", "no GPU");
        return;
    }
    enum { B = 16, V = 50257, ROUNDS = 40 };
    float *logits = malloc((size_t)B * V * sizeof(float)), u[B];
    int next[B];
    float *d_logits, *d_u;
    int *d_next;
    cudaMalloc((void **)&d_logits, (size_t)B * V * sizeof(float));
    cudaMalloc((void **)&d_u, B * sizeof(float));
    cudaMalloc((void **)&d_next, B * sizeof(int));
    uint64_t rng = 12345;
    Sampler host;
    int total = 0, agree = 0, greedy_total = 0, greedy_agree = 0, launch_ok = 1;
    const int top_ks[] = {1, 2, 40, 256};
    for (int round = 0; round < ROUNDS; round++) {
        float temperature = round % 5 == 0 ? 0.0f : 0.3f + 2.0f * frand(&rng);
        int top_k = top_ks[round % 4];
        float top_p = round % 3 == 0 ? 1.0f : 0.2f + 0.8f * frand(&rng);
        float scale = round % 7 == 0 ? 300.0f : 4.0f;  // large magnitudes: no overflow allowed
        for (size_t i = 0; i < (size_t)B * V; i++) logits[i] = scale * (frand(&rng) - 0.5f);
        for (int b = 0; b < B; b++) {
            u[b] = frand(&rng);
            if (b % 4 == 1)  // ties at the top: many equal maxima
                for (int i = 0; i < V; i += 97) logits[(size_t)b * V + i] = scale;
        }
        cudaMemcpy(d_logits, logits, (size_t)B * V * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(d_u, u, sizeof(u), cudaMemcpyHostToDevice);
        cudaMemset(d_next, 0xff, sizeof(next));
        launch_ok &= sample_on_device(d_logits, V, V, B, temperature, top_k, top_p, d_u, d_next, 0) == cudaSuccess;
        launch_ok &= cudaMemcpy(next, d_next, sizeof(next), cudaMemcpyDeviceToHost) == cudaSuccess;
        sampler_create(&host, V, temperature, top_k, top_p, 1);
        for (int b = 0; b < B; b++) {
            int want = sampler_pick(&host, logits + (size_t)b * V, u[b]);
            if (temperature <= 0.0f) greedy_total++, greedy_agree += next[b] == want;
            total++, agree += next[b] == want;
        }
        sampler_free(&host);
    }
    CHECK(launch_ok, "device_sampling_runs", "a launch or copy failed");
    CHECK(greedy_agree == greedy_total, "device_greedy_matches_host", "%d of %d", greedy_agree, greedy_total);
    // expf may differ by an ulp between device and host: a draw landing exactly on a bucket edge
    // can flip. Anything beyond a rare flip is a bug.
    CHECK(agree >= total - 2, "device_sampling_matches_host", "%d of %d picks agree", agree, total);
    cudaFree(d_logits), cudaFree(d_u), cudaFree(d_next);
    free(logits);
}
#endif

int main(void) {
    host_tests();
#ifdef GPT2_CUDA
    device_tests();
#else
    test_skip("device_sampling", "no GPU (built without CUDA)");
#endif
    return test_exit_code();
}
