// Micro-benchmark: fused_attention against the unfused baseline at GPT-2 124M shapes (NH=12, HS=64,
// max_seq=1024): prefill B=1/8 x T=1024 (or the T given), and decode T=1 at cache lengths 16, 272, 1024
// for B=1/8/64 (or the B and cache length given);
// fp32 and bf16. Build: make build/gpu/tests/bench_fused_attention (not run by make test).
//
// Baseline (what an engine without fused attention runs): cuBLAS batched Q K^T into fp32 scores
// [B*NH][T][L], a masked scale+softmax kernel writing P in the compute dtype, cuBLAS batched P V
// straight into the [B*T, C] output. One batched call per product (pointer arrays over B*NH).
//
// Each case is validated (fused vs baseline, rel_l2) before it is timed. Timing: each sample is one
// CUDA-graph launch of 20 back-to-back calls between two events (so host launch gaps stay out);
// 5 warm-up launches, median of 25 samples. Inputs are not rotated: small cases sit in L2 (50 MB),
// as one layer's cache does during generation.
//
// Printed per case: the time of each, the speedup, and for the fused one the useful FLOP rate
// (4*HS per query-key pair that the causal mask keeps) and the byte rate over the least traffic
// (q, out, and each head's K and V rows 0..L-1 read once), next to the copy bandwidth measured here.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if GPT2_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "fused_attention.h"

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (cudaError_t)(x);                                                        \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define CB(x)                                                                                          \
    do {                                                                                               \
        cublasStatus_t s_ = (x);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_));     \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

enum { NH = 12, HS = 64, C = NH * HS, MAXSEQ = 1024, NREP = 20, NSAMPLE = 25, NWARM = 5 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float urand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct {
    DType dt;
    int B, T, pos;
    void *q, *k, *v, *out, *out_ref, *ws, *probs;
    float *scores;
    size_t ws_bytes;
    const void **dA1, **dB1, **dA2, **dB2;  // device pointer arrays for the batched products
    void **dC1, **dC2;
    cublasHandle_t h;
    cudaStream_t st;
} Case;

static void fill(void *d, size_t n, DType dt) {
    size_t es = dtype_size(dt);
    void *hbuf = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        float x = urand();
        if (dt == DTYPE_BF16) ((uint16_t *)hbuf)[i] = float_to_bf16(x);
        else ((float *)hbuf)[i] = x;
    }
    CK(cudaMemcpy(d, hbuf, n * es, cudaMemcpyHostToDevice));
    free(hbuf);
}

static void run_fused(Case *c) {
    CK(fused_attention(c->q, c->k, c->v, c->out, c->dt, c->B, c->T, c->pos, NULL, NH, HS, MAXSEQ, c->ws, c->ws_bytes,
                       c->st));
}

static void run_baseline(Case *c) {
    const int L = c->pos + c->T, nb = c->B * NH;
    const float one = 1.f, zero = 0.f;
    const cudaDataType_t et = c->dt == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    // scores^cm (L x T) = K^T Q per head: S[t][j] = q_t . k_j
    CB(cublasGemmBatchedEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, L, c->T, HS, &one, (const void *const *)c->dA1, et, HS,
                           (const void *const *)c->dB1, et, C, &zero, c->dC1, CUDA_R_32F, L, nb,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CK(attention_softmax_baseline(c->probs, c->scores, nb * c->T, c->T, L, c->pos, 1.f / 8.f, c->dt, c->st));
    // out^cm (HS x T, ld C) = V^cm (HS x L) P^cm (L x T)
    CB(cublasGemmBatchedEx(c->h, CUBLAS_OP_N, CUBLAS_OP_N, HS, c->T, L, &one, (const void *const *)c->dA2, et, HS,
                           (const void *const *)c->dB2, et, L, &zero, c->dC2, et, C, nb, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
}

// Median milliseconds of one call: graph of NREP calls, NSAMPLE event-timed launches.
static double time_op(Case *c, void (*op)(Case *)) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < NREP; i++) op(c);
    CK(cudaStreamEndCapture(c->st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < NWARM; i++) CK(cudaGraphLaunch(ge, c->st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[NSAMPLE];
    for (int s = 0; s < NSAMPLE; s++) {
        CK(cudaEventRecord(e0, c->st));
        CK(cudaGraphLaunch(ge, c->st));
        CK(cudaEventRecord(e1, c->st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[s] = ms / NREP;
    }
    for (int i = 1; i < NSAMPLE; i++)  // insertion sort, then the middle
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[NSAMPLE / 2];
}

static double rel_l2(const void *a, const void *b, size_t n, DType dt) {
    size_t es = dtype_size(dt);
    void *ha = malloc(n * es), *hb = malloc(n * es);
    CK(cudaMemcpy(ha, a, n * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, b, n * es, cudaMemcpyDeviceToHost));
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double x = dt == DTYPE_BF16 ? bf16_to_float(((uint16_t *)ha)[i]) : ((float *)ha)[i];
        double y = dt == DTYPE_BF16 ? bf16_to_float(((uint16_t *)hb)[i]) : ((float *)hb)[i];
        e2 += (x - y) * (x - y);
        r2 += y * y;
        if (x != x) e2 = INFINITY;
    }
    free(ha);
    free(hb);
    return sqrt(e2 / r2);
}

static double copy_bandwidth(void) {  // GB/s of a 1 GiB device-to-device copy, bytes read + written
    size_t n = 1ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < 5; i++) CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * n * 5 / (ms * 1e-3) / 1e9;
}

static void bench_case(cublasHandle_t h, cudaStream_t st, DType dt, int B, int T, int pos, double bw) {
    Case c = {0};
    c.dt = dt; c.B = B; c.T = T; c.pos = pos; c.h = h; c.st = st;
    const int L = pos + T, nb = B * NH;
    const size_t es = dtype_size(dt), nq = (size_t)B * T * C, nkv = (size_t)nb * MAXSEQ * HS;
    CK(cudaMalloc(&c.q, nq * es));
    CK(cudaMalloc(&c.k, nkv * es));
    CK(cudaMalloc(&c.v, nkv * es));
    CK(cudaMalloc(&c.out, nq * es));
    CK(cudaMalloc(&c.out_ref, nq * es));
    CK(cudaMalloc((void **)&c.scores, (size_t)nb * T * L * sizeof(float)));
    CK(cudaMalloc(&c.probs, (size_t)nb * T * L * es));
    c.ws_bytes = fused_attention_workspace_size(B, NH, HS, MAXSEQ);
    CK(cudaMalloc(&c.ws, c.ws_bytes));
    CK(cudaMemset(c.ws, 0, c.ws_bytes));  // once, as the header asks
    fill(c.q, nq, dt);
    fill(c.k, nkv, dt);
    fill(c.v, nkv, dt);
    CK(cudaMemset(c.out, 0xff, nq * es));
    CK(cudaMemset(c.out_ref, 0xff, nq * es));

    // Pointer arrays: batch i = (b, h).
    const void **hA1 = malloc(nb * sizeof(void *)), **hB1 = malloc(nb * sizeof(void *));
    const void **hA2 = malloc(nb * sizeof(void *)), **hB2 = malloc(nb * sizeof(void *));
    void **hC1 = malloc(nb * sizeof(void *)), **hC2 = malloc(nb * sizeof(void *));
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < NH; hh++) {
            int i = b * NH + hh;
            size_t kv_off = ((size_t)i * MAXSEQ * HS) * es, q_off = ((size_t)b * T * C + hh * HS) * es;
            hA1[i] = (const char *)c.k + kv_off;
            hB1[i] = (const char *)c.q + q_off;
            hC1[i] = c.scores + (size_t)i * T * L;
            hA2[i] = (const char *)c.v + kv_off;
            hB2[i] = (const char *)c.probs + (size_t)i * T * L * es;
            hC2[i] = (char *)c.out_ref + q_off;
        }
    const void ***dsts[4] = {&c.dA1, &c.dB1, &c.dA2, &c.dB2};
    const void **srcs[4] = {hA1, hB1, hA2, hB2};
    for (int i = 0; i < 4; i++) {
        CK(cudaMalloc((void **)dsts[i], nb * sizeof(void *)));
        CK(cudaMemcpy((void *)*dsts[i], srcs[i], nb * sizeof(void *), cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc((void **)&c.dC1, nb * sizeof(void *)));
    CK(cudaMemcpy(c.dC1, hC1, nb * sizeof(void *), cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&c.dC2, nb * sizeof(void *)));
    CK(cudaMemcpy(c.dC2, hC2, nb * sizeof(void *), cudaMemcpyHostToDevice));

    run_fused(&c);
    run_baseline(&c);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    double err = rel_l2(c.out, c.out_ref, nq, dt);
    double tol = dt == DTYPE_BF16 ? 1e-2 : 1e-5;
    const char *verdict = err <= tol ? "ok" : "MISMATCH";

    double tf = time_op(&c, run_fused), tb = time_op(&c, run_baseline);
    double pairs = 0;  // query-key pairs the mask keeps
    for (int t = 0; t < T; t++) pairs += (double)(pos + t + 1);
    pairs *= nb;
    double flops = 4.0 * HS * pairs;
    double bytes = (2.0 * nq + 2.0 * nb * L * HS) * es;
    const double gbs = bytes / (tf * 1e-3) / 1e9;
    printf("%-7s %-4s B=%-3d T=%-5d L=%-5d  fused %9.2f us  unfused %9.2f us  x%5.2f  | "
           "fused %7.1f GB/s (%3.0f%% of copy) %6.1f TFLOP/s | rel_l2 %.2e %s\n",
           T > 1 ? "prefill" : "decode", dtype_name(dt), B, T, L, tf * 1e3, tb * 1e3, tb / tf, gbs,
           100.0 * gbs / bw, flops / (tf * 1e-3) / 1e12, err, verdict);
    fflush(stdout);

    for (int i = 0; i < 4; i++) CK(cudaFree((void *)*dsts[i]));
    CK(cudaFree(c.dC1)); CK(cudaFree(c.dC2));
    free(hA1); free(hB1); free(hA2); free(hB2); free(hC1); free(hC2);
    CK(cudaFree(c.q)); CK(cudaFree(c.k)); CK(cudaFree(c.v)); CK(cudaFree(c.out)); CK(cudaFree(c.out_ref));
    CK(cudaFree(c.scores)); CK(cudaFree(c.probs)); CK(cudaFree(c.ws));
}
#endif

int main(int argc, char **argv) {
#if !GPT2_CUDA
    (void)argc; (void)argv;
    printf("bench_fused_attention: needs a GPU build (GPU=1)\n");
    return 0;
#else
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_fused_attention: no GPU\n");
        return 0;
    }
    // Optional filters: bench_fused_attention [fp32|bf16 [prefill|decode [B [L]]]]; a prefill's L is its T
    const char *only = argc > 1 ? argv[1] : NULL;
    const char *kind = argc > 2 ? argv[2] : NULL;
    const int onlyB = argc > 3 ? atoi(argv[3]) : 0, onlyL = argc > 4 ? atoi(argv[4]) : 0;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cublasHandle_t h;
    cudaStream_t st;
    CB(cublasCreate(&h));
    CK(cudaStreamCreate(&st));
    CB(cublasSetStream(h, st));
    double bw = copy_bandwidth();
    printf("device %s, %d SMs, copy bandwidth %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount, bw);
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DTYPE_BF16 : DTYPE_F32;
        if (only && strcmp(only, dtype_name(dt))) continue;
        for (int B = 1; B <= 8; B += 7)
            if ((!kind || !strcmp(kind, "prefill")) && (!onlyB || onlyB == B))
                bench_case(h, st, dt, B, onlyL ? onlyL : 1024, 0, bw);
        const int Ls[3] = {16, 272, 1024}, Bs[3] = {1, 8, 64};
        if (kind && !strcmp(kind, "decode") && onlyB && onlyL) {  // any batch and cache length
            bench_case(h, st, dt, onlyB, 1, onlyL - 1, bw);
            continue;
        }
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                if ((!kind || !strcmp(kind, "decode")) && (!onlyB || onlyB == Bs[j]) && (!onlyL || onlyL == Ls[i]))
                    bench_case(h, st, dt, Bs[j], 1, Ls[i] - 1, bw);
    }
    cublasDestroy(h);
    cudaStreamDestroy(st);
    return 0;
#endif
}
