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

    // Ties at the k-th value keep their lowest ids even when larger values come after them (the
    // device sampler's order): 100 tied logits, then 10 larger; top-k 40 keeps the 10 and ids 0..29.
    enum { TV = 110 };
    float tied[TV];
    for (int i = 0; i < TV; i++) tied[i] = i < 100 ? 10.0f : 12.0f;
    Sampler t;
    sampler_create(&t, TV, 1.0f, 40, 1.0f, 1);
    ok = 1;
    for (int i = 0; i < 1000; i++) {
        int id = sampler_pick(&t, tied, (i + 0.5f) / 1000.0f);
        ok &= id < 30 || id >= 100;
    }
    CHECK(ok, "top_k_ties_keep_lowest_ids", "a tied id >= 30 was kept");
    sampler_free(&t);
}

#ifdef GPT2_CUDA
static float frand(uint64_t *state) {
    Sampler tmp = {.rng_state = *state};
    float u = sampler_draw(&tmp);
    *state = tmp.rng_state;
    return u;
}

// What needs no GPU: the settings the device sampler takes, its workspace size, and the calls it
// refuses before launching anything.
static void device_api_tests(void) {
    CHECK(device_sampling_supported(0.0f, 0, 50257) && device_sampling_supported(0.8f, 40, 50257) &&
              device_sampling_supported(1.0f, 256, 257) && !device_sampling_supported(1.0f, 0, 50257) &&
              !device_sampling_supported(1.0f, 257, 50257) && !device_sampling_supported(1.0f, 256, 256) &&
              !device_sampling_supported(0.0f, 0, DEVICE_SAMPLING_MAX_VOCAB + 1),
          "device_sampling_supported", "a setting was classified wrongly");
    size_t one = sampling_workspace_size(1, 50257), many = sampling_workspace_size(64, 50257);
    CHECK(one > 0 && many == 64 * one && sampling_workspace_size(1, DEVICE_SAMPLING_MAX_VOCAB + 1) == 0,
          "sampling_workspace_size", "1 row %zu bytes, 64 rows %zu", one, many);
    float f[4];  // never read: each call below is refused before it launches anything
    int n[4];
    CHECK(sample_on_device(f, 50257, 50257, 2, 1.0f, 40, 1.0f, f, n, NULL, f,
                           sampling_workspace_size(2, 50257) - 1, 0) == cudaErrorInvalidValue &&
              sample_on_device(f, 50257, 50257, 1, 1.0f, 257, 1.0f, f, n, NULL, f, one, 0) == cudaErrorInvalidValue &&
              sample_on_device(f, 50257, 50257, 1, 1.0f, 40, 1.0f, f, n, NULL, NULL, one, 0) == cudaErrorInvalidValue,
          "device_sampling_refuses", "a small workspace, top_k 257 or no workspace was accepted");
}

// Device buffers for up to MAX_B rows of MAX_V logits, and one workspace (zeroed once, as the
// header asks) that every call below shares: a counter left non-zero would show in the next call.
enum { MAX_B = 64, MAX_V = 50257 };
typedef struct {
    float *logits, *u;
    int *next, *copy;  // the picks, and the second copy the engine takes for its next step's tokens
    void *ws;
    size_t ws_bytes;
    cudaStream_t stream;
    int failed;  // a CUDA call failed
} Device;

static void device_open(Device *d) {
    *d = (Device){.ws_bytes = sampling_workspace_size(MAX_B, MAX_V)};
    d->failed |= cudaMalloc((void **)&d->logits, (size_t)MAX_B * MAX_V * sizeof(float)) != cudaSuccess;
    d->failed |= cudaMalloc((void **)&d->u, MAX_B * sizeof(float)) != cudaSuccess;
    d->failed |= cudaMalloc((void **)&d->next, MAX_B * sizeof(int)) != cudaSuccess;
    d->failed |= cudaMalloc((void **)&d->copy, MAX_B * sizeof(int)) != cudaSuccess;
    d->failed |= cudaMalloc(&d->ws, d->ws_bytes) != cudaSuccess;
    d->failed |= cudaMemset(d->ws, 0, d->ws_bytes) != cudaSuccess;
    d->failed |= cudaStreamCreate(&d->stream) != cudaSuccess;
}

static void device_close(Device *d) {
    cudaFree(d->logits), cudaFree(d->u), cudaFree(d->next), cudaFree(d->copy), cudaFree(d->ws);
    cudaStreamDestroy(d->stream);
}

static void upload(Device *d, const float *logits, const float *u, int B, int V) {
    d->failed |= cudaMemcpy(d->logits, logits, (size_t)B * V * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess;
    d->failed |= cudaMemcpy(d->u, u, B * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess;
    d->failed |= cudaMemset(d->next, 0xff, B * sizeof(int)) != cudaSuccess;
    d->failed |= cudaMemset(d->copy, 0xff, B * sizeof(int)) != cudaSuccess;
}

// The rows whose device pick (in d->next) differs from the host sampler's for the same draw, and
// with `copied` those whose second copy (d->copy) differs from it.
static int host_disagrees(Device *d, const float *logits, const float *u, int B, int V, float temperature, int top_k,
                          float top_p, int copied) {
    int next[MAX_B], copy[MAX_B];
    d->failed |= cudaStreamSynchronize(d->stream) != cudaSuccess;
    d->failed |= cudaMemcpy(next, d->next, B * sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess;
    d->failed |= cudaMemcpy(copy, d->copy, B * sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess;
    Sampler host;
    sampler_create(&host, V, temperature, top_k, top_p, 1);
    int bad = 0;
    for (int b = 0; b < B; b++)
        bad += next[b] != sampler_pick(&host, logits + (size_t)b * V, u[b]) || (copied && copy[b] != next[b]);
    sampler_free(&host);
    return bad;
}

// One device call on B rows of V logits, the picks copied too: the rows that disagree with the host.
static int disagreements(Device *d, const float *logits, const float *u, int B, int V, float temperature, int top_k,
                         float top_p) {
    upload(d, logits, u, B, V);
    d->failed |= sample_on_device(d->logits, V, V, B, temperature, top_k, top_p, d->u, d->next, d->copy, d->ws,
                                  d->ws_bytes, d->stream) != cudaSuccess;
    return host_disagrees(d, logits, u, B, V, temperature, top_k, top_p, 1);
}

static void random_rows(float *logits, int B, int V, float scale, uint64_t *rng) {
    for (size_t i = 0; i < (size_t)B * V; i++) logits[i] = scale * (frand(rng) - 0.5f);
}

// Draws spread evenly over [0, 1): each bucket of a short distribution gets some.
static void even_draws(float *u, int B) {
    for (int b = 0; b < B; b++) u[b] = (b + 0.5f) / B;
}

// Random logits (with planted ties), random settings: the device must pick what the host picks.
static void random_tests(Device *d, float *logits) {
    enum { B = 16, V = 50257, ROUNDS = 40 };
    float u[B];
    uint64_t rng = 12345;
    int total = 0, agree = 0, greedy_total = 0, greedy_agree = 0;
    const int top_ks[] = {1, 2, 40, 256};
    for (int round = 0; round < ROUNDS; round++) {
        float temperature = round % 5 == 0 ? 0.0f : 0.3f + 2.0f * frand(&rng);
        int top_k = top_ks[round % 4];
        float top_p = round % 3 == 0 ? 1.0f : 0.2f + 0.8f * frand(&rng);
        float scale = round % 7 == 0 ? 300.0f : 4.0f;  // large magnitudes: no overflow allowed
        random_rows(logits, B, V, scale, &rng);
        for (int b = 0; b < B; b++) {
            u[b] = frand(&rng);
            if (b % 4 == 1)  // ties at the top: many equal maxima
                for (int i = 0; i < V; i += 97) logits[(size_t)b * V + i] = scale;
        }
        int bad = disagreements(d, logits, u, B, V, temperature, top_k, top_p);
        if (temperature <= 0.0f) greedy_total += B, greedy_agree += B - bad;
        total += B, agree += B - bad;
    }
    CHECK(greedy_agree == greedy_total, "device_greedy_matches_host", "%d of %d", greedy_agree, greedy_total);
    // expf may differ by an ulp between device and host: a draw landing exactly on a bucket edge
    // can flip. Anything beyond a rare flip is a bug.
    CHECK(agree >= total - 2, "device_sampling_matches_host", "%d of %d picks agree", agree, total);
}

// The split over blocks: 64 rows, vocabularies that no chunk size divides (down to one block per
// row) and the largest, k from 1 to 256, and all of a row's top k inside one chunk.
static void split_tests(Device *d, float *logits) {
    float u[MAX_B];
    uint64_t rng = 777;
    struct {
        float temperature;
        int top_k;
        float top_p;
    } settings[] = {{0.0f, 0, 1.0f}, {1.0f, 1, 1.0f}, {0.8f, 40, 0.9f}, {1.3f, 256, 0.95f}, {1.0f, 256, 1.0f}};
    const int n_settings = (int)(sizeof(settings) / sizeof(settings[0]));
    int greedy_bad = 0, bad = 0, total = 0;
    for (int i = 0; i < n_settings; i++) {
        random_rows(logits, MAX_B, MAX_V, 8.0f, &rng);
        for (int b = 0; b < MAX_B; b++) u[b] = frand(&rng);
        int n = disagreements(d, logits, u, MAX_B, MAX_V, settings[i].temperature, settings[i].top_k,
                              settings[i].top_p);
        if (settings[i].temperature <= 0.0f) greedy_bad += n;
        bad += n, total += MAX_B;
    }
    CHECK(greedy_bad == 0 && bad <= 2, "device_batch_64", "%d of %d picks differ (%d greedy)", bad, total, greedy_bad);

    const int vocabs[] = {257, 777, 2049, 3001, 20011};
    const int top_ks[] = {0, 1, 40, 256};
    bad = 0, total = 0;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++) {
            const int V = vocabs[i], B = 8;
            if (top_ks[j] >= V) continue;
            random_rows(logits, B, V, 6.0f, &rng);
            for (int b = 0; b < B; b++) u[b] = frand(&rng);
            bad += disagreements(d, logits, u, B, V, top_ks[j] ? 1.0f : 0.0f, top_ks[j], 0.9f);
            total += B;
        }
    CHECK(bad <= 2, "device_odd_vocabularies", "%d of %d picks differ", bad, total);

    // The largest vocabulary the device takes: 32 chunks of 8,192 logits, 32 rank keys a thread.
    enum { BIG_V = DEVICE_SAMPLING_MAX_VOCAB, BIG_B = 8 };
    _Static_assert((long long)BIG_B * BIG_V <= (long long)MAX_B * MAX_V, "the test's buffers hold the rows");
    bad = 0, total = 0;
    for (int j = 0; j < 4; j++) {
        random_rows(logits, BIG_B, BIG_V, 8.0f, &rng);
        for (int b = 0; b < BIG_B; b++) u[b] = frand(&rng);
        bad += disagreements(d, logits, u, BIG_B, BIG_V, top_ks[j] ? 1.0f : 0.0f, top_ks[j], 0.9f);
        total += BIG_B;
    }
    CHECK(bad <= 2, "device_largest_vocabulary", "%d of %d picks differ", bad, total);

    // The row's 256 best all in 300 consecutive ids: one chunk supplies every candidate kept.
    random_rows(logits, MAX_B, MAX_V, 8.0f, &rng);
    for (int b = 0; b < MAX_B; b++)
        for (int i = 20000; i < 20300; i++) logits[(size_t)b * MAX_V + i] = 10.0f + 4.0f * frand(&rng);
    even_draws(u, MAX_B);
    bad = disagreements(d, logits, u, MAX_B, MAX_V, 1.0f, 256, 0.95f);
    CHECK(bad <= 2, "device_top_k_in_one_chunk", "%d of %d picks differ", bad, MAX_B);
}

// Row 0 of logits copied to every row: the same row under each draw.
static void same_rows(float *logits, int V) {
    for (int b = 1; b < MAX_B; b++) memcpy(logits + (size_t)b * V, logits, V * sizeof(float));
}

// Equal logits across chunks: where only some of them fit in the top k, the lowest ids win, on
// the host and on the device. All rows are the same; the draws walk every bucket.
static void tie_tests(Device *d, float *logits) {
    float u[MAX_B];
    uint64_t rng = 4242;
    const int V = MAX_V, B = MAX_B, top_ks[] = {1, 40, 256};
    int bad = 0, bad_max = 0, bad_equal = 0;
    even_draws(u, B);
    for (int j = 0; j < 3; j++) {
        const int k = top_ks[j], spacing = V / (k + 24);  // k + 24 tied values, over the whole row
        // Ties below the largest, spread over every chunk (host_tests checks the host's order
        // with the larger values after the ties).
        for (int i = 0; i < V; i++)
            logits[i] = i < 10 ? 12.0f : (i - 10) % spacing == 0 ? 10.0f : 12.0f * frand(&rng) - 4.0f;
        same_rows(logits, V);
        if (k > 10)
            bad += disagreements(d, logits, u, B, V, 4.0f, k, 1.0f) + disagreements(d, logits, u, B, V, 4.0f, k, 0.7f);
        // Ties at the largest: every kept candidate has probability exactly 1.
        for (int i = 0; i < V; i++) logits[i] = i % spacing == spacing / 2 ? 9.0f : 12.0f * frand(&rng) - 4.0f;
        same_rows(logits, V);
        bad_max += disagreements(d, logits, u, B, V, 1.0f, k, 1.0f) + disagreements(d, logits, u, B, V, 0.0f, k, 1.0f);
        // All equal.
        for (int i = 0; i < V; i++) logits[i] = 0.25f;
        same_rows(logits, V);
        bad_equal += disagreements(d, logits, u, B, V, 1.0f, k, 1.0f);
        bad_equal += disagreements(d, logits, u, B, V, 1.0f, k, 0.5f);
        bad_equal += disagreements(d, logits, u, B, V, 0.0f, k, 1.0f);
    }
    CHECK(bad == 0, "device_ties_below_max", "%d picks differ", bad);
    CHECK(bad_max == 0, "device_ties_at_max", "%d picks differ", bad_max);
    CHECK(bad_equal == 0, "device_all_equal", "%d picks differ", bad_equal);
}

// -inf and very negative logits: probabilities of zero among the kept, a row of -inf for greedy.
static void infinity_tests(Device *d, float *logits) {
    enum { B = 16 };
    float u[B];
    const int V = MAX_V;
    uint64_t rng = 99;
    for (int b = 0; b < B; b++) {
        float *row = logits + (size_t)b * V;
        for (int i = 0; i < V; i++) row[i] = -INFINITY;
        for (int i = 0; i < 30; i++) row[(i * 1597 + b * 31) % V] = -1e30f;
        for (int i = 0; i < 5 + b; i++) row[(i * 7919 + b * 101 + 13) % V] = 6.0f * frand(&rng);
    }
    even_draws(u, B);
    int bad = disagreements(d, logits, u, B, V, 0.0f, 0, 1.0f) + disagreements(d, logits, u, B, V, 1.0f, 40, 1.0f) +
              disagreements(d, logits, u, B, V, 0.7f, 256, 0.8f);
    for (int i = 0; i < V; i++) logits[i] = -INFINITY;  // row 0 all -inf: greedy takes id 0
    bad += disagreements(d, logits, u, B, V, 0.0f, 0, 1.0f);
    CHECK(bad == 0, "device_infinite_logits", "%d picks differ", bad);
}

// The per-row counters return to zero: calls back to back, and one call captured in a CUDA graph
// and replayed with new logits and draws each time.
static void repeat_tests(Device *d, float *logits) {
    enum { B = 8, REPLAYS = 6 };
    float u[B];
    const int V = MAX_V;
    uint64_t rng = 2024;
    random_rows(logits, B, V, 8.0f, &rng);
    for (int b = 0; b < B; b++) u[b] = frand(&rng);
    upload(d, logits, u, B, V);
    int bad = 0;
    for (int call = 0; call < 3; call++) {
        d->failed |= sample_on_device(d->logits, V, V, B, 0.9f, 40, 0.9f, d->u, d->next, NULL, d->ws, d->ws_bytes,
                                      d->stream) != cudaSuccess;
        d->failed |= sample_on_device(d->logits, V, V, B, 0.9f, 40, 0.9f, d->u, d->next, NULL, d->ws, d->ws_bytes,
                                      d->stream) != cudaSuccess;
        bad += host_disagrees(d, logits, u, B, V, 0.9f, 40, 0.9f, 0);
    }
    CHECK(bad <= 1, "device_sampling_back_to_back", "%d picks differ", bad);

    const float temperatures[] = {0.0f, 1.1f};
    bad = 0;
    for (int t = 0; t < 2; t++) {
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        d->failed |= cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
        d->failed |= sample_on_device(d->logits, V, V, B, temperatures[t], 40, 0.9f, d->u, d->next, NULL, d->ws,
                                      d->ws_bytes, d->stream) != cudaSuccess;
        d->failed |= cudaStreamEndCapture(d->stream, &graph) != cudaSuccess;
        d->failed |= cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess;
        for (int r = 0; r < REPLAYS && !d->failed; r++) {
            random_rows(logits, B, V, 8.0f, &rng);
            for (int b = 0; b < B; b++) u[b] = frand(&rng);
            upload(d, logits, u, B, V);
            d->failed |= cudaGraphLaunch(exec, d->stream) != cudaSuccess;
            bad += host_disagrees(d, logits, u, B, V, temperatures[t], 40, 0.9f, 0);
        }
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
    }
    CHECK(bad <= 1, "device_sampling_graph_replays", "%d picks differ", bad);
}

static void device_tests(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        test_skip("device_sampling", "no GPU");
        return;
    }
    Device d;
    device_open(&d);
    float *logits = malloc((size_t)MAX_B * MAX_V * sizeof(float));
    if (!d.failed) random_tests(&d, logits);
    if (!d.failed) split_tests(&d, logits);
    if (!d.failed) tie_tests(&d, logits);
    if (!d.failed) infinity_tests(&d, logits);
    if (!d.failed) repeat_tests(&d, logits);
    CHECK(!d.failed, "device_sampling_runs", "a CUDA call failed: %s", cudaGetErrorString(cudaGetLastError()));
    device_close(&d);
    free(logits);
}
#endif

int main(void) {
    host_tests();
#ifdef GPT2_CUDA
    device_api_tests();
    device_tests();
#else
    test_skip("device_sampling", "no GPU (built without CUDA)");
#endif
    return test_exit_code();
}
