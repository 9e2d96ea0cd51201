// Micro-benchmark of the fused linear kernels (issue 5), not a test (make test does not run it):
//   make build/gpu/tests/bench_fused_linear && build/gpu/tests/bench_fused_linear [--quick | --decode | --rows
//                                                                                  | --fold | --tiles [M]
//                                                                                  | --logits [M]
//                                                                                  | --one K N dtype M
//                                                                                  | --one-res K N dtype M
//                                                                                  | --one-rows EPILOGUE K N M]
// (--decode: bf16 only, M in {1, 4, 8, 16, 32, 64}; --rows: gemm_rows against cuBLASLt; --fold: the
// LayerNorm fold against the LayerNorm kernel and gemm_rows_ln; --tiles: gemm_tiles against cuBLASLt
// at a prompt's rows; --logits: logits_rows against cuBLASLt, below)
//
// fused_ln_linear (LayerNorm + Linear + GELU, one kernel) against the unfused baseline:
// LayerNorm kernel -> cublasGemmEx (fp32: CUBLAS_COMPUTE_32F, no TF32; bf16: bf16 in/out, fp32
// accumulate) -> bias + GELU kernel (kernels/unfused_baseline.cu), at K=768 -> N=3072 (GPT-2 124M's
// fc) and K=1024 -> N=4096 (the seed post's), M in {1, 16, 64, 512, 4096}, fp32 and bf16. Also
// linear_residual against cuBLAS + a residual-add kernel at GPT-2's two projections.
//
// The engine's route for many rows beside them (kernels/matmul_lt.h): "LN + cuBLASLt epilogue" is the
// same LayerNorm kernel, then cuBLASLt's GEMM with the bias and GELU in its epilogue (bf16; fp32:
// the bias epilogue, then one GELU pass); for the projections, one cuBLASLt GEMM adding bias and product into the
// fp32 residual (beta = 1).
//
// Every variant is validated against the baseline before it is timed. Timing: CUDA events, 5
// warm-ups, then (a) "eager": one event pair per call, median of 30, host launches included as the
// GPU sees them; (b) "graph": 20 calls captured in a CUDA graph, median of 21 replays / 20. Input
// sets (x, W) rotate so that W is not in L2 from the previous call: enough sets to cover 3x the L2.
// Bandwidth: a 1 GiB device-to-device copy (bytes read + written over time) is the ceiling M=1
// is compared with.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#if GPT2_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "fused_ln_linear.h"
#include "gemm_rows.h"
#include "gemm_tiles.h"
#include "linear_residual.h"
#include "logits_rows.h"
#include "matmul_lt.h"
#include "sampling.h"
#include "unfused_baseline.h"

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (cudaError_t)(call);                                                         \
        if (e_ != cudaSuccess) die("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#define CB(call)                                                                                        \
    do {                                                                                                \
        cublasStatus_t s_ = (call);                                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS) die("%s:%d: %s: cuBLAS %d", __FILE__, __LINE__, #call, (int)s_); \
    } while (0)

static uint64_t rng = 0x1234567ull;
static float frand(void) {  // uniform in [-1, 1)
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 8388608.0) - 1.0);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static float median(float *v, int n) {
    qsort(v, n, sizeof(float), cmp_float);
    return v[n / 2];
}

static cudaStream_t stream;
static cublasHandle_t cublas;
static MatmulLt *lt;
static cudaEvent_t ev0, ev1;
static int l2_bytes;

// The cluster GEMV (LINEAR_PATH_CLUSTER) needs thread-block clusters: sm_90 and later.
static int has_clusters(void) {
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    return major >= 9;
}

// One variant: enqueue(set) runs it on input set `set`.
typedef void (*EnqueueFn)(void *ctx, int set);

typedef struct {
    float eager_us, graph_us;
} Timing;

static Timing time_it(EnqueueFn fn, void *ctx, int nsets) {
    Timing t;
    for (int i = 0; i < 5; i++) fn(ctx, i % nsets);
    CK(cudaStreamSynchronize(stream));
    float v[30];
    for (int i = 0; i < 30; i++) {
        CK(cudaEventRecord(ev0, stream));
        fn(ctx, (i + 5) % nsets);
        CK(cudaEventRecord(ev1, stream));
        CK(cudaEventSynchronize(ev1));
        CK(cudaEventElapsedTime(&v[i], ev0, ev1));
    }
    t.eager_us = median(v, 30) * 1000.0f;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; i++) fn(ctx, i % nsets);
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, stream));
    CK(cudaStreamSynchronize(stream));
    float r[21];
    for (int i = 0; i < 21; i++) {
        CK(cudaEventRecord(ev0, stream));
        CK(cudaGraphLaunch(ge, stream));
        CK(cudaEventRecord(ev1, stream));
        CK(cudaEventSynchronize(ev1));
        CK(cudaEventElapsedTime(&r[i], ev0, ev1));
    }
    t.graph_us = median(r, 21) * 1000.0f / 20.0f;
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t;
}

// ----------------------------------------------------------------------------
// LayerNorm + Linear + GELU

typedef struct {
    int M, N, K, nsets;
    DType dt;
    float **x;   // [nsets] fp32 [M, K]
    void **W;    // [nsets] dt [N, K]
    float *gamma, *beta, *bias, *s, *b2;
    void *bias_dt;  // bias in dt: the cuBLASLt epilogue's (matmul_lt.h)
    void *xn;    // baseline LayerNorm output, dt [M, K]
    void *y;     // dt [M, N]
    float *scratch;  // the cuBLASLt route's fp32 product + bias [M, N]
    LinearPath path;
    int gemm_only;
} LnBench;

static void enqueue_fused(void *p, int set) {
    LnBench *b = p;
    CK(fused_ln_linear_ex(b->x[set], b->K, b->gamma, b->W[set], b->dt, b->s, b->b2, b->y, b->N, b->dt, b->M, b->N,
                          b->K, ACT_GELU, NULL, NULL, b->path, stream));
}

static void enqueue_lt(void *p, int set) {
    LnBench *b = p;
    CK(baseline_layernorm(b->xn, b->x[set], b->gamma, b->beta, b->M, b->K, b->dt, stream));
    CB(matmul_lt(lt, MATMUL_LT_BIAS_GELU, b->y, b->N, b->xn, b->W[set], b->dt, b->bias_dt, b->M, b->N, b->K,
                 b->scratch, stream));
}

static void cublas_gemm(const void *W, const void *x, void *y, int M, int N, int K, DType dt) {
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t t = dt == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    // Row-major y[M, N] = x[M, K] W[N, K]^T is column-major y^T = W^T(op T of [K, N]) x^T.
    CB(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, t, K, x, t, K, &zero, y, t, N,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void enqueue_unfused(void *p, int set) {
    LnBench *b = p;
    if (!b->gemm_only) CK(baseline_layernorm(b->xn, b->x[set], b->gamma, b->beta, b->M, b->K, b->dt, stream));
    cublas_gemm(b->W[set], b->xn, b->y, b->M, b->N, b->K, b->dt);
    if (!b->gemm_only) CK(baseline_bias_act(b->y, b->bias, b->M, b->N, 1, b->dt, stream));
}

static float *fetch(const void *d, size_t n, DType dt) {
    float *h = xmalloc(n * sizeof(float));
    CK(cudaStreamSynchronize(stream));
    if (dt == DTYPE_F32) {
        CK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    } else {
        uint16_t *t = xmalloc(n * 2);
        CK(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(t[i]);
        free(t);
    }
    return h;
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int nsets_for(size_t bytes) {
    size_t n = (3 * (size_t)l2_bytes + bytes - 1) / bytes;
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

static void *upload_w(const float *w, size_t n, DType dt) {
    void *d;
    CK(cudaMalloc(&d, n * dtype_size(dt)));
    if (dt == DTYPE_F32) {
        CK(cudaMemcpy(d, w, n * 4, cudaMemcpyHostToDevice));
    } else {
        uint16_t *t = xmalloc(n * 2);
        for (size_t i = 0; i < n; i++) t[i] = float_to_bf16(w[i]);
        CK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
        free(t);
    }
    return d;
}

static double copy_gbps;

// Runs fn on set 0 over a poisoned output and compares with ref; says why when it is off.
static int validated(EnqueueFn fn, LnBench *b, const float *ref, double tol, const char *what) {
    const size_t n = (size_t)b->M * b->N;
    CK(cudaMemsetAsync(b->y, 0xff, n * dtype_size(b->dt), stream));
    fn(b, 0);
    float *out = fetch(b->y, n, b->dt);
    const double e = rel_l2(out, ref, n);
    free(out);
    if (!(e <= tol))
        printf("INVALID %s K=%d N=%d M=%d %s: rel_l2 %.3g vs baseline (tol %.0e): not timed\n", dtype_name(b->dt),
               b->K, b->N, b->M, what, e, tol);
    return e <= tol;
}

static void bench_ln(int K, int N, DType dt, int M, FILE *csv) {
    LnBench b = {0};
    b.M = M, b.N = N, b.K = K, b.dt = dt;
    const size_t wbytes = (size_t)N * K * dtype_size(dt), xbytes = (size_t)M * K * 4;
    b.nsets = nsets_for(wbytes + xbytes);
    float *hw = xmalloc((size_t)N * K * 4), *hx = xmalloc((size_t)M * K * 4);
    b.x = xmalloc(b.nsets * sizeof(float *));
    b.W = xmalloc(b.nsets * sizeof(void *));
    float *hg = xmalloc(K * 4), *hb = xmalloc(K * 4), *hbias = xmalloc(N * 4), *hs = xmalloc(N * 4), *hb2 = xmalloc(N * 4);
    for (int k = 0; k < K; k++) hg[k] = 1.0f + 0.2f * frand(), hb[k] = 0.1f * frand();
    for (int n = 0; n < N; n++) hbias[n] = 0.1f * frand();
    for (int i = 0; i < b.nsets; i++) {
        for (size_t j = 0; j < (size_t)N * K; j++) hw[j] = frand() * 0.06f;
        for (size_t j = 0; j < (size_t)M * K; j++) hx[j] = frand() * 2.0f + 0.3f;
        if (i == 0)  // folded vectors of set 0 (all sets share them: only set 0 is validated)
            for (int n = 0; n < N; n++) {
                double ss = 0, bb = 0;
                for (int k = 0; k < K; k++) {
                    float w = dt == DTYPE_BF16 ? bf16_to_float(float_to_bf16(hw[(size_t)n * K + k])) : hw[(size_t)n * K + k];
                    ss += (double)w * hg[k], bb += (double)w * hb[k];
                }
                hs[n] = (float)ss, hb2[n] = (float)(bb + hbias[n]);
            }
        b.W[i] = upload_w(hw, (size_t)N * K, dt);
        CK(cudaMalloc((void **)&b.x[i], xbytes));
        CK(cudaMemcpy(b.x[i], hx, xbytes, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc((void **)&b.gamma, K * 4));
    CK(cudaMalloc((void **)&b.beta, K * 4));
    CK(cudaMalloc((void **)&b.bias, N * 4));
    CK(cudaMalloc((void **)&b.s, N * 4));
    CK(cudaMalloc((void **)&b.b2, N * 4));
    CK(cudaMemcpy(b.gamma, hg, K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.beta, hb, K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.bias, hbias, N * 4, cudaMemcpyHostToDevice));
    b.bias_dt = upload_w(hbias, N, dt);
    CK(cudaMemcpy(b.s, hs, N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.b2, hb2, N * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&b.xn, (size_t)M * K * dtype_size(dt)));
    CK(cudaMalloc(&b.y, (size_t)M * N * dtype_size(dt)));
    CK(cudaMalloc((void **)&b.scratch, (size_t)M * N * sizeof(float)));

    // Baseline on set 0 is the reference.
    enqueue_unfused(&b, 0);
    float *ref = fetch(b.y, (size_t)M * N, dt);
    const double tol = dt == DTYPE_F32 ? 1e-5 : 2e-2;

    enum { NP = 9 };
    const LinearPath paths[NP] = {LINEAR_PATH_AUTO,    LINEAR_PATH_GEMV,    LINEAR_PATH_TILED_XS, LINEAR_PATH_TILED_S,
                                  LINEAR_PATH_TILED_L, LINEAR_PATH_GEMV_TC, LINEAR_PATH_CLUSTER,  LINEAR_PATH_ROWS,
                                  LINEAR_PATH_ROWS_F32};
    const char *pname[NP] = {"auto",    "gemv",    "tiled_xs", "tiled_s", "tiled_l",
                             "gemv_tc", "cluster", "rows",     "rows_f32"};
    Timing tf[NP];
    int ran[NP] = {0};
    for (int p = 0; p < NP; p++) {
        if (paths[p] == LINEAR_PATH_GEMV_TC && (dt != DTYPE_BF16 || M > 512)) continue;
        if (paths[p] == LINEAR_PATH_CLUSTER && (dt != DTYPE_BF16 || M > 64 || !has_clusters())) continue;
        if (paths[p] == LINEAR_PATH_ROWS && (dt != DTYPE_BF16 || !gemm_rows_ln_takes(M, N, K))) continue;
        if (paths[p] == LINEAR_PATH_ROWS_F32 && (dt != DTYPE_F32 || M > 512)) continue;
        if (paths[p] == LINEAR_PATH_GEMV && M > 64) continue;  // slices of 16 rows: pointless beyond
        if (paths[p] != LINEAR_PATH_GEMV && paths[p] != LINEAR_PATH_AUTO && paths[p] != LINEAR_PATH_CLUSTER &&
            paths[p] != LINEAR_PATH_ROWS && paths[p] != LINEAR_PATH_ROWS_F32 && M < 16)
            continue;
        if (paths[p] == LINEAR_PATH_TILED_XS && M > 512) continue;
        b.path = paths[p];
        if (!validated(enqueue_fused, &b, ref, tol, pname[p])) continue;
        tf[p] = time_it(enqueue_fused, &b, b.nsets);
        ran[p] = 1;
    }
    const int lt_ok = validated(enqueue_lt, &b, ref, tol, "cuBLASLt");
    const Timing tl = lt_ok ? time_it(enqueue_lt, &b, b.nsets) : (Timing){-1, -1};
    Timing tb = time_it(enqueue_unfused, &b, b.nsets);
    b.gemm_only = 1;
    Timing tg = time_it(enqueue_unfused, &b, b.nsets);
    b.gemm_only = 0;

    int best = -1;
    for (int p = 1; p < NP; p++)
        if (ran[p] && (best < 0 || tf[p].graph_us < tf[best].graph_us)) best = p;
    const double bytes = (double)wbytes + xbytes + (double)M * N * dtype_size(dt);
    const double flops = 2.0 * M * N * K;
    printf("%-4s %4d->%-4d M=%-5d | fused auto %8.2f us (eager %8.2f) | best %-8s %8.2f | unfused %8.2f (eager %8.2f, "
           "gemm alone %8.2f) | speedup %5.2fx | %6.0f GB/s %6.1f TFLOP/s\n",
           dtype_name(dt), K, N, M, ran[0] ? tf[0].graph_us : -1, ran[0] ? tf[0].eager_us : -1,
           best >= 0 ? pname[best] : "-", best >= 0 ? tf[best].graph_us : -1, tb.graph_us, tb.eager_us, tg.graph_us,
           ran[0] ? tb.graph_us / tf[0].graph_us : 0, ran[0] ? bytes / tf[0].graph_us / 1e3 : 0,
           ran[0] ? flops / tf[0].graph_us / 1e6 : 0);
    if (lt_ok)
        printf("%-4s %4d->%-4d M=%-5d | LN + cuBLASLt epilogue %8.2f us (eager %8.2f) | vs unfused %5.2fx | vs fused "
               "auto %5.2fx | %6.0f GB/s %6.1f TFLOP/s\n",
               dtype_name(dt), K, N, M, tl.graph_us, tl.eager_us, tb.graph_us / tl.graph_us,
               ran[0] ? tf[0].graph_us / tl.graph_us : 0, bytes / tl.graph_us / 1e3, flops / tl.graph_us / 1e6);
    if (csv) {
        fprintf(csv, "ln,%s,%d,%d,%d", dtype_name(dt), K, N, M);
        for (int p = 0; p < NP; p++)
            fprintf(csv, ",%s,%.3f,%.3f", pname[p], ran[p] ? tf[p].graph_us : -1, ran[p] ? tf[p].eager_us : -1);
        fprintf(csv, ",unfused,%.3f,%.3f,gemm,%.3f,%.3f,copy_gbps,%.0f,lt,%.3f,%.3f\n", tb.graph_us, tb.eager_us,
                tg.graph_us, tg.eager_us, copy_gbps, tl.graph_us, tl.eager_us);
        fflush(csv);
    }
    fflush(stdout);

    free(ref), free(hw), free(hx), free(hg), free(hb), free(hbias), free(hs), free(hb2);
    for (int i = 0; i < b.nsets; i++) cudaFree(b.W[i]), cudaFree(b.x[i]);
    free(b.W), free(b.x);
    cudaFree(b.gamma), cudaFree(b.beta), cudaFree(b.bias), cudaFree(b.bias_dt), cudaFree(b.s), cudaFree(b.b2), cudaFree(b.xn), cudaFree(b.y);
    cudaFree(b.scratch);
}

// ----------------------------------------------------------------------------
// Linear + residual

typedef struct {
    int M, N, K, nsets;
    DType dt;
    void **x, **W;
    float *bias, *res;
    void *tmp;  // baseline GEMM output, dt [M, N]
    LinearPath path;
} ResBench;

static void enqueue_res_fused(void *p, int set) {
    ResBench *b = p;
    CK(linear_residual_ex(b->x[set], b->W[set], b->dt, b->bias, b->res, b->M, b->N, b->K, b->path, stream));
}
static void enqueue_res_unfused(void *p, int set) {
    ResBench *b = p;
    cublas_gemm(b->W[set], b->x[set], b->tmp, b->M, b->N, b->K, b->dt);
    CK(baseline_residual_add(b->res, b->tmp, b->bias, b->M, b->N, b->dt, stream));
}
static void enqueue_res_lt(void *p, int set) {
    ResBench *b = p;
    CB(matmul_lt(lt, MATMUL_LT_BIAS_RESIDUAL, b->res, b->N, b->x[set], b->W[set], b->dt, b->bias, b->M, b->N, b->K,
                 NULL, stream));
}

// One call of fn on set 0 from residual = r0: what it added.
static float *res_delta(EnqueueFn fn, ResBench *b, const float *r0) {
    const size_t n = (size_t)b->M * b->N;
    CK(cudaMemcpyAsync(b->res, r0, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    fn(b, 0);
    float *d = fetch(b->res, n, DTYPE_F32);
    for (size_t j = 0; j < n; j++) d[j] -= r0[j];
    return d;
}

static void bench_res(int K, int N, DType dt, int M) {
    ResBench b = {0};
    b.M = M, b.N = N, b.K = K, b.dt = dt;
    const size_t es = dtype_size(dt), wbytes = (size_t)N * K * es, xbytes = (size_t)M * K * es;
    b.nsets = nsets_for(wbytes + xbytes);
    b.x = xmalloc(b.nsets * sizeof(void *));
    b.W = xmalloc(b.nsets * sizeof(void *));
    float *hw = xmalloc((size_t)N * K * 4), *hx = xmalloc((size_t)M * K * 4), *hbias = xmalloc(N * 4);
    float *hr = xmalloc((size_t)M * N * 4);
    for (int n = 0; n < N; n++) hbias[n] = 0.1f * frand();
    for (size_t j = 0; j < (size_t)M * N; j++) hr[j] = frand();
    for (int i = 0; i < b.nsets; i++) {
        for (size_t j = 0; j < (size_t)N * K; j++) hw[j] = frand() * 0.03f;
        for (size_t j = 0; j < (size_t)M * K; j++) hx[j] = frand();
        b.W[i] = upload_w(hw, (size_t)N * K, dt);
        b.x[i] = upload_w(hx, (size_t)M * K, dt);
    }
    CK(cudaMalloc((void **)&b.bias, N * 4));
    CK(cudaMemcpy(b.bias, hbias, N * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&b.res, (size_t)M * N * 4));
    CK(cudaMalloc(&b.tmp, (size_t)M * N * es));
    // Validate: one call from hr each way. The bf16 baseline rounds the GEMM output to bf16 before
    // the add: allow for that.
    const size_t n = (size_t)M * N;
    b.path = LINEAR_PATH_AUTO;
    float *ref = res_delta(enqueue_res_unfused, &b, hr), *out = res_delta(enqueue_res_fused, &b, hr);
    float *out_lt = res_delta(enqueue_res_lt, &b, hr);
    const double e = rel_l2(out, ref, n), e_lt = rel_l2(out_lt, ref, n), tol = dt == DTYPE_F32 ? 1e-5 : 1e-2;
    free(out), free(out_lt), free(ref);
    const double bytes = (double)wbytes + xbytes + 8.0 * M * N;
    const Timing tb = time_it(enqueue_res_unfused, &b, b.nsets);
    if (!(e <= tol)) {
        printf("INVALID linear_residual %s K=%d N=%d M=%d: rel_l2 %.3g: not timed\n", dtype_name(dt), K, N, M, e);
    } else {
        Timing tf = time_it(enqueue_res_fused, &b, b.nsets);
        printf("res  %-4s %4d->%-4d M=%-5d | fused %8.2f us (eager %8.2f) | cuBLAS + add %8.2f (eager %8.2f) | "
               "speedup %5.2fx | %6.0f GB/s\n",
               dtype_name(dt), K, N, M, tf.graph_us, tf.eager_us, tb.graph_us, tb.eager_us, tb.graph_us / tf.graph_us,
               bytes / tf.graph_us / 1e3);
    }
    if (!(e_lt <= tol)) {
        printf("INVALID cuBLASLt bias+residual %s K=%d N=%d M=%d: rel_l2 %.3g: not timed\n", dtype_name(dt), K, N, M,
               e_lt);
    } else {
        Timing tl = time_it(enqueue_res_lt, &b, b.nsets);
        printf("res  %-4s %4d->%-4d M=%-5d | cuBLASLt bias+residual epilogue %8.2f us (eager %8.2f) | vs cuBLAS + add "
               "%5.2fx | %6.0f GB/s\n",
               dtype_name(dt), K, N, M, tl.graph_us, tl.eager_us, tb.graph_us / tl.graph_us, bytes / tl.graph_us / 1e3);
    }
    fflush(stdout);
    free(hw), free(hx), free(hbias), free(hr);
    for (int i = 0; i < b.nsets; i++) cudaFree(b.W[i]), cudaFree(b.x[i]);
    free(b.W), free(b.x);
    cudaFree(b.bias), cudaFree(b.res), cudaFree(b.tmp);
}

// ----------------------------------------------------------------------------
// gemm_rows (kernels/gemm_rows.h) against cuBLASLt: the same product, epilogue and types, at
// batched-decode rows; its own pick, then each tile with K whole and split over 2, 4 and 8 blocks.

typedef struct {
    MatmulLtEpilogue epi;
    int M, N, K, nsets, rb, ks;  // rb, ks = 0: gemm_rows's own pick
    void **x, **W;               // [nsets] bf16
    void *bias;                  // y's type
    void *y;                     // [M, N] of y's type (the residual: fp32, added to on every call)
} RowsBench;

static void enqueue_rows(void *p, int set) {
    RowsBench *b = p;
    CK(gemm_rows_ex(b->epi, b->y, b->N, b->x[set], b->W[set], b->bias, b->M, b->N, b->K, b->rb, b->ks, stream));
}
static void enqueue_rows_lt(void *p, int set) {
    RowsBench *b = p;
    CB(matmul_lt(lt, b->epi, b->y, b->N, b->x[set], b->W[set], DTYPE_BF16, b->bias, b->M, b->N, b->K, NULL, stream));
}

// nsets input sets for the few-row benches: W [nw] uniform in +-0.03 and x [nx] in +-1, bf16 on the
// device; and their release.
static void random_sets(int nsets, size_t nw, size_t nx, void ***W, void ***x) {
    *W = xmalloc(nsets * sizeof(void *)), *x = xmalloc(nsets * sizeof(void *));
    float *hw = xmalloc(nw * 4), *hx = xmalloc(nx * 4);
    for (int i = 0; i < nsets; i++) {
        for (size_t j = 0; j < nw; j++) hw[j] = frand() * 0.03f;
        for (size_t j = 0; j < nx; j++) hx[j] = frand();
        (*W)[i] = upload_w(hw, nw, DTYPE_BF16);
        (*x)[i] = upload_w(hx, nx, DTYPE_BF16);
    }
    free(hw), free(hx);
}
static void free_sets(int nsets, void **W, void **x) {
    for (int i = 0; i < nsets; i++) cudaFree(W[i]), cudaFree(x[i]);
    free(W), free(x);
}

static void bench_rows(MatmulLtEpilogue epi, int K, int N, int M) {
    static const char *names[] = {"none", "bias", "bias+residual", "bias+gelu"};
    RowsBench b = {epi, M, N, K, 0, 0, 0, NULL, NULL, NULL, NULL};
    const DType yt = matmul_lt_ytype(epi, DTYPE_BF16);
    b.nsets = nsets_for((size_t)N * K * 2);
    random_sets(b.nsets, (size_t)N * K, (size_t)M * K, &b.W, &b.x);
    float *hb = xmalloc(N * 4);
    for (int n = 0; n < N; n++) hb[n] = 0.1f * frand();
    if (epi != MATMUL_LT_NONE) b.bias = upload_w(hb, N, yt);
    CK(cudaMalloc(&b.y, (size_t)M * N * dtype_size(yt)));
    // Each configuration validated on set 0 from y = 0 against cuBLASLt before it is timed.
    CK(cudaMemsetAsync(b.y, 0, (size_t)M * N * dtype_size(yt), stream));
    enqueue_rows_lt(&b, 0);
    float *ref = fetch(b.y, (size_t)M * N, yt);
    const Timing tl = time_it(enqueue_rows_lt, &b, b.nsets);
    printf("rows %-13s %4d->%-4d M=%-3d | cuBLASLt %6.2f us | gemm_rows, its pick, then rows a block x split:",
           names[epi], K, N, M, tl.graph_us);
    const int rbs[] = {0, 16, 32, 64}, kss[] = {1, 2, 4, 8};
    for (int ri = 0; ri < 4; ri++)
        for (int ki = 0; ki < 4; ki++) {
            if (!ri && ki) break;
            b.rb = rbs[ri], b.ks = ri ? kss[ki] : 0;
            if (ri) printf(" %dx%d", b.rb, b.ks);
            CK(cudaMemsetAsync(b.y, 0, (size_t)M * N * dtype_size(yt), stream));
            const cudaError_t fit = gemm_rows_ex(b.epi, b.y, b.N, b.x[0], b.W[0], b.bias, b.M, b.N, b.K, b.rb, b.ks,
                                                 stream);
            if (fit == cudaErrorNotSupported) {  // the part of K does not fit
                printf(" -");
                continue;
            }
            CK(fit);
            float *out = fetch(b.y, (size_t)M * N, yt);
            const double e = rel_l2(out, ref, (size_t)M * N);
            free(out);
            if (!(e <= 1e-2)) {
                printf(" INVALID (rel_l2 %.3g)", e);
                continue;
            }
            const Timing t = time_it(enqueue_rows, &b, b.nsets);
            if (ri) printf(" %.2f", t.graph_us);
            else printf(" %6.2f (%.2fx) |", t.graph_us, tl.graph_us / t.graph_us);
        }
    printf("\n");
    free(ref);
    fflush(stdout);
    free(hb);
    free_sets(b.nsets, b.W, b.x);
    cudaFree(b.bias), cudaFree(b.y);
}

// ----------------------------------------------------------------------------
// The LayerNorm fold (gemm_rows.h) at GPT-2 124M's qkv and fc, batched-decode rows: gemm_rows_fold
// (the residual product's copy, the statistics beside the MMAs) and gemm_rows_ln (the rows normalised
// inside the product) against gemm_rows alone on LayerNorm's output, the product the LayerNorm
// kernel route runs after that kernel (whose own cost, ~1.2 us on the path at 64 rows, only the
// engine's step shows: docs/PERF.md, "Session 49"); then what the copy costs the residual products
// that write it. Both validated against a LayerNorm kernel + gemm_rows (rel_l2 <= 1e-2) first.

typedef struct {
    MatmulLtEpilogue epi;
    int M, N, K, nsets;
    float **x;           // [nsets] fp32 [M, K]
    void **copy, **W;    // [nsets] bf16 gamma (x - c) [M, K], W [N, K]
    float *gamma, *beta, *s, *b2, *c, *mean;
    void *bias, *xn, *y;  // bias bf16 [N]; the LayerNorm's output bf16 [M, K]; y bf16 [M, N]
} FoldBench;

static void enqueue_fold_product(void *p, int set) {
    FoldBench *b = p;
    CK(gemm_rows(b->epi, b->y, b->N, b->xn, b->W[set], b->bias, b->M, b->N, b->K, stream));
}
static void enqueue_fold_ln(void *p, int set) {
    FoldBench *b = p;
    CK(gemm_rows_ln(b->epi, b->y, b->N, b->x[set], b->K, b->gamma, b->W[set], b->b2, b->M, b->N, b->K, stream));
}
static void enqueue_fold(void *p, int set) {
    FoldBench *b = p;
    const GemmRowsFold in = {b->x[set], b->K, b->copy[set], b->c, b->mean};
    CK(gemm_rows_fold(b->epi, b->y, b->N, &in, b->W[set], b->s, b->b2, b->M, b->N, b->K, stream));
}

// ln_fold.cu's vectors on the host: s = W gamma, b' = W beta + b (W [N, K]).
static void fold_vectors(float *s, float *b2, const float *W, const float *gamma, const float *beta, const float *b,
                         int N, int K) {
    for (int n = 0; n < N; n++) {
        double ss = 0, bb = b[n];
        for (int k = 0; k < K; k++)
            ss += (double)W[(size_t)n * K + k] * gamma[k], bb += (double)W[(size_t)n * K + k] * beta[k];
        s[n] = (float)ss, b2[n] = (float)bb;
    }
}

static void bench_fold(MatmulLtEpilogue epi, int K, int N, int M) {
    FoldBench b = {epi, M, N, K, nsets_for((size_t)N * K * 2), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL};
    float *hx = xmalloc((size_t)M * K * 4), *hw = xmalloc((size_t)N * K * 4), *hc = xmalloc(M * 4);
    float *g = xmalloc(K * 4), *be = xmalloc(K * 4), *hb = xmalloc(N * 4), *hs = xmalloc(N * 4), *hb2 = xmalloc(N * 4);
    for (int k = 0; k < K; k++) g[k] = 1.0f + 0.2f * frand(), be[k] = 0.1f * frand();
    for (int n = 0; n < N; n++) hb[n] = 0.1f * frand();
    b.x = xmalloc(b.nsets * sizeof(float *)), b.copy = xmalloc(b.nsets * sizeof(void *));
    b.W = xmalloc(b.nsets * sizeof(void *));
    for (int i = 0; i < b.nsets; i++) {
        for (size_t j = 0; j < (size_t)N * K; j++) hw[j] = bf16_to_float(float_to_bf16(frand() * 0.03f));
        for (int m = 0; m < M; m++) {  // rows of mean ~10, c their mean
            double sum = 0;
            for (int k = 0; k < K; k++) sum += hx[(size_t)m * K + k] = 10.0f + frand();
            hc[m] = (float)(sum / K);
        }
        float *hcopy = xmalloc((size_t)M * K * 4);
        for (size_t j = 0; j < (size_t)M * K; j++) hcopy[j] = (hx[j] - hc[j / K]) * g[j % K];
        b.x[i] = upload_w(hx, (size_t)M * K, DTYPE_F32);
        b.copy[i] = upload_w(hcopy, (size_t)M * K, DTYPE_BF16);
        b.W[i] = upload_w(hw, (size_t)N * K, DTYPE_BF16);
        free(hcopy);
    }
    fold_vectors(hs, hb2, hw, g, be, hb, N, K);  // from the last set's W (the timing does not care)
    b.gamma = upload_w(g, K, DTYPE_F32), b.beta = upload_w(be, K, DTYPE_F32), b.s = upload_w(hs, N, DTYPE_F32);
    b.b2 = upload_w(hb2, N, DTYPE_F32), b.c = upload_w(hc, M, DTYPE_F32), b.bias = upload_w(hb, N, DTYPE_BF16);
    CK(cudaMalloc((void **)&b.mean, M * 4));
    CK(cudaMalloc(&b.xn, (size_t)M * K * 2));
    CK(cudaMalloc(&b.y, (size_t)M * N * 2));
    const int last = b.nsets - 1;  // the set whose vectors s, b' are
    CK(baseline_layernorm(b.xn, b.x[last], b.gamma, b.beta, M, K, DTYPE_BF16, stream));
    enqueue_fold_product(&b, last);
    float *ref = fetch(b.y, (size_t)M * N, DTYPE_BF16);
    const Timing tk = time_it(enqueue_fold_product, &b, b.nsets);
    printf("fold %-9s %4d->%-4d M=%-3d | gemm_rows alone %6.2f us |", epi == MATMUL_LT_BIAS ? "bias" : "bias+gelu",
           K, N, M, tk.graph_us);
    const EnqueueFn fns[] = {enqueue_fold_ln, enqueue_fold};
    const char *names[] = {"gemm_rows_ln", "gemm_rows_fold"};
    for (int v = 0; v < 2; v++) {
        CK(cudaMemsetAsync(b.y, 0xff, (size_t)M * N * 2, stream));
        fns[v](&b, last);
        float *out = fetch(b.y, (size_t)M * N, DTYPE_BF16);
        const double e = rel_l2(out, ref, (size_t)M * N);
        free(out);
        if (!(e <= 1e-2)) {
            printf(" %s INVALID (rel_l2 %.3g) |", names[v], e);
            continue;
        }
        const Timing t = time_it(fns[v], &b, b.nsets);
        printf(" %s %6.2f (%.2fx) |", names[v], t.graph_us, tk.graph_us / t.graph_us);
    }
    printf("\n");
    fflush(stdout);
    for (int i = 0; i < b.nsets; i++) cudaFree(b.x[i]), cudaFree(b.copy[i]), cudaFree(b.W[i]);
    free(b.x), free(b.copy), free(b.W), free(ref);
    free(hx), free(hw), free(hc), free(g), free(be), free(hb), free(hs), free(hb2);
    cudaFree(b.gamma), cudaFree(b.beta), cudaFree(b.s), cudaFree(b.b2), cudaFree(b.c), cudaFree(b.bias);
    cudaFree(b.mean), cudaFree(b.xn), cudaFree(b.y);
}

// The residual product with and without the copy for the next LayerNorm (timed only: the copy's
// values are tests/test_fused_linear.c's).
typedef struct {
    RowsBench rows;
    GemmRowsCopy copy;
} CopyBench;

static void enqueue_copy(void *p, int set) {
    CopyBench *b = p;
    CK(gemm_rows_residual_copy(b->rows.y, b->rows.N, b->rows.x[set], b->rows.W[set], b->rows.bias, b->rows.M,
                               b->rows.N, b->rows.K, &b->copy, stream));
}

static void bench_copy(int K, int N, int M) {
    CopyBench b = {{MATMUL_LT_BIAS_RESIDUAL, M, N, K, nsets_for((size_t)N * K * 2), 0, 0, NULL, NULL, NULL, NULL},
                   {NULL, NULL, NULL}};
    random_sets(b.rows.nsets, (size_t)N * K, (size_t)M * K, &b.rows.W, &b.rows.x);
    float *h = xmalloc((N > M ? N : M) * 4);
    for (int n = 0; n < N; n++) h[n] = 0.1f * frand();
    b.rows.bias = upload_w(h, N, DTYPE_F32);
    for (int n = 0; n < N; n++) h[n] = 1.0f + 0.2f * frand();
    float *gamma = upload_w(h, N, DTYPE_F32);
    for (int m = 0; m < M; m++) h[m] = frand();
    float *shift = upload_w(h, M, DTYPE_F32);
    CK(cudaMalloc(&b.rows.y, (size_t)M * N * 4));
    CK(cudaMemset(b.rows.y, 0, (size_t)M * N * 4));
    CK(cudaMalloc(&b.copy.copy, (size_t)M * N * 2));
    b.copy.gamma = gamma, b.copy.shift = shift;
    const Timing t0 = time_it(enqueue_rows, &b.rows, b.rows.nsets), t1 = time_it(enqueue_copy, &b, b.rows.nsets);
    printf("copy bias+residual %4d->%-4d M=%-3d | gemm_rows %6.2f us | with the copy %6.2f us (+%.2f)\n", K, N, M,
           t0.graph_us, t1.graph_us, t1.graph_us - t0.graph_us);
    fflush(stdout);
    free(h);
    free_sets(b.rows.nsets, b.rows.W, b.rows.x);
    cudaFree(b.rows.bias), cudaFree(b.rows.y), cudaFree(b.copy.copy), cudaFree(gamma), cudaFree(shift);
}

// gemm_tiles (kernels/gemm_tiles.h) at a prompt's many rows: GPT-2 124M's four products against
// cuBLASLt; the residual products with the copy and its parts; the folded qkv and fc against a
// LayerNorm kernel + cuBLASLt (the pair they replace; the LayerNorm is unfused_baseline.h's), from rows
// of mean ~10 with c their mean and the parts made on the host. Each validated first (rel_l2 <= 1e-2:
// against cuBLASLt from y = 0, the fold against the LayerNorm kernel + cuBLASLt).
static void enqueue_tiles(void *p, int set) {
    RowsBench *b = p;
    CK(gemm_tiles(b->epi, b->y, b->N, b->x[set], b->W[set], b->bias, b->M, b->N, b->K, stream));
}

typedef struct {
    RowsBench rows;
    GemmTilesCopy copy;
} TilesCopyBench;
static void enqueue_tiles_copy(void *p, int set) {
    TilesCopyBench *b = p;
    CK(gemm_tiles_residual_copy(b->rows.y, b->rows.N, b->rows.x[set], b->rows.W[set], b->rows.bias, b->rows.M,
                                b->rows.N, b->rows.K, &b->copy, stream));
}

static void bench_tiles(MatmulLtEpilogue epi, int K, int N, int M) {
    static const char *names[] = {"none", "bias", "bias+residual", "bias+gelu"};
    const DType yt = matmul_lt_ytype(epi, DTYPE_BF16);
    TilesCopyBench b = {{epi, M, N, K, nsets_for((size_t)N * K * 2), 0, 0, NULL, NULL, NULL, NULL},
                        {NULL, NULL, NULL, NULL}};
    RowsBench *r = &b.rows;
    random_sets(r->nsets, (size_t)N * K, (size_t)M * K, &r->W, &r->x);
    float *h = xmalloc((N > M ? N : M) * 4);
    for (int n = 0; n < N; n++) h[n] = 0.1f * frand();
    r->bias = upload_w(h, N, yt);
    CK(cudaMalloc(&r->y, (size_t)M * N * dtype_size(yt)));
    CK(cudaMemsetAsync(r->y, 0, (size_t)M * N * dtype_size(yt), stream));
    enqueue_rows_lt(r, 0);
    float *ref = fetch(r->y, (size_t)M * N, yt);
    CK(cudaMemsetAsync(r->y, 0, (size_t)M * N * dtype_size(yt), stream));
    enqueue_tiles(r, 0);
    float *out = fetch(r->y, (size_t)M * N, yt);
    const double e = rel_l2(out, ref, (size_t)M * N);
    const Timing tl = time_it(enqueue_rows_lt, r, r->nsets);
    printf("tiles %-13s %4d->%-4d M=%-4d | cuBLASLt %6.2f us |", names[epi], K, N, M, tl.graph_us);
    if (!(e <= 1e-2)) {
        printf(" gemm_tiles INVALID (rel_l2 %.3g)\n", e);
    } else {
        const Timing t = time_it(enqueue_tiles, r, r->nsets);
        printf(" gemm_tiles %6.2f (%.2fx)", t.graph_us, tl.graph_us / t.graph_us);
        if (epi == MATMUL_LT_BIAS_RESIDUAL) {  // with the copy and parts (their values: test_fused_linear.c's)
            for (int n = 0; n < N; n++) h[n] = 1.0f + 0.2f * frand();
            float *gamma = upload_w(h, N, DTYPE_F32);
            CK(cudaMalloc(&b.copy.copy, (size_t)M * N * 2));
            CK(cudaMalloc((void **)&b.copy.parts, (size_t)M * GEMM_TILES_MAX_PARTS * 8));
            b.copy.gamma = gamma;
            const Timing tc = time_it(enqueue_tiles_copy, &b, r->nsets);
            printf(" | with the copy %6.2f (+%.2f)", tc.graph_us, tc.graph_us - t.graph_us);
            cudaFree(gamma), cudaFree(b.copy.copy), cudaFree(b.copy.parts);
        }
        printf("\n");
    }
    fflush(stdout);
    free(h), free(ref), free(out);
    free_sets(r->nsets, r->W, r->x);
    cudaFree(r->bias), cudaFree(r->y);
}

typedef struct {
    MatmulLtEpilogue epi;
    int M, N, K;
    float *x, *gamma, *beta, *s, *b2, *c, *parts, *mean;
    void *copy, *W, *bias, *xn, *y;  // bf16: gamma (x - c) [M, K], W [N, K], bias [N], LayerNorm(x) [M, K], y
} TilesFoldBench;
static void enqueue_tiles_ln_lt(void *p, int set) {
    TilesFoldBench *b = p;
    (void)set;
    CK(baseline_layernorm(b->xn, b->x, b->gamma, b->beta, b->M, b->K, DTYPE_BF16, stream));
    CB(matmul_lt(lt, b->epi, b->y, b->N, b->xn, b->W, DTYPE_BF16, b->bias, b->M, b->N, b->K, NULL, stream));
}
static void enqueue_tiles_fold(void *p, int set) {
    TilesFoldBench *b = p;
    (void)set;
    const GemmTilesFold in = {b->copy, b->parts, gemm_tiles_parts(b->K), b->c, b->mean};
    CK(gemm_tiles_fold(b->epi, b->y, b->N, &in, b->W, b->s, b->b2, b->M, b->N, b->K, stream));
}

static void bench_tiles_fold(MatmulLtEpilogue epi, int K, int N, int M) {
    const int np = gemm_tiles_parts(K), cnt = K / np;
    float *hx = xmalloc((size_t)M * K * 4), *hw = xmalloc((size_t)N * K * 4), *hc = xmalloc(M * 4);
    float *hcopy = xmalloc((size_t)M * K * 4), *hp = xmalloc((size_t)M * np * 8);
    float *g = xmalloc(K * 4), *be = xmalloc(K * 4), *hb = xmalloc(N * 4), *hs = xmalloc(N * 4), *hb2 = xmalloc(N * 4);
    for (int k = 0; k < K; k++) g[k] = 1.0f + 0.2f * frand(), be[k] = 0.1f * frand();
    for (int n = 0; n < N; n++) hb[n] = bf16_to_float(float_to_bf16(0.1f * frand()));
    for (size_t j = 0; j < (size_t)N * K; j++) hw[j] = bf16_to_float(float_to_bf16(frand() * 0.03f));
    for (int m = 0; m < M; m++) {  // rows of mean ~10, c their mean; each part's sum and M2
        double sum = 0;
        for (int k = 0; k < K; k++) sum += hx[(size_t)m * K + k] = 10.0f + frand();
        hc[m] = (float)(sum / K);
        for (int j = 0; j < np; j++) {
            const float *v = hx + (size_t)m * K + j * cnt;
            double ps = 0, m2 = 0;
            for (int k = 0; k < cnt; k++) ps += v[k];
            for (int k = 0; k < cnt; k++) m2 += (v[k] - ps / cnt) * (v[k] - ps / cnt);
            hp[((size_t)m * np + j) * 2] = (float)ps, hp[((size_t)m * np + j) * 2 + 1] = (float)m2;
        }
    }
    for (size_t j = 0; j < (size_t)M * K; j++) hcopy[j] = (hx[j] - hc[j / K]) * g[j % K];
    fold_vectors(hs, hb2, hw, g, be, hb, N, K);
    TilesFoldBench b = {epi, M, N, K, upload_w(hx, (size_t)M * K, DTYPE_F32), upload_w(g, K, DTYPE_F32),
                        upload_w(be, K, DTYPE_F32), upload_w(hs, N, DTYPE_F32), upload_w(hb2, N, DTYPE_F32),
                        upload_w(hc, M, DTYPE_F32), upload_w(hp, (size_t)M * np * 2, DTYPE_F32), NULL,
                        upload_w(hcopy, (size_t)M * K, DTYPE_BF16), upload_w(hw, (size_t)N * K, DTYPE_BF16),
                        upload_w(hb, N, DTYPE_BF16), NULL, NULL};
    CK(cudaMalloc((void **)&b.mean, M * 4));
    CK(cudaMalloc(&b.xn, (size_t)M * K * 2));
    CK(cudaMalloc(&b.y, (size_t)M * N * 2));
    enqueue_tiles_ln_lt(&b, 0);
    float *ref = fetch(b.y, (size_t)M * N, DTYPE_BF16);
    CK(cudaMemsetAsync(b.y, 0xff, (size_t)M * N * 2, stream));
    enqueue_tiles_fold(&b, 0);
    float *out = fetch(b.y, (size_t)M * N, DTYPE_BF16);
    const double e = rel_l2(out, ref, (size_t)M * N);
    const Timing tl = time_it(enqueue_tiles_ln_lt, &b, 1);  // W in L2 on both sides: 3.5-4.7 MB
    printf("tiles fold %-9s %4d->%-4d M=%-4d | LayerNorm + cuBLASLt %6.2f us |",
           epi == MATMUL_LT_BIAS ? "bias" : "bias+gelu", K, N, M, tl.graph_us);
    if (!(e <= 1e-2)) {
        printf(" gemm_tiles_fold INVALID (rel_l2 %.3g)\n", e);
    } else {
        const Timing t = time_it(enqueue_tiles_fold, &b, 1);
        printf(" gemm_tiles_fold %6.2f (%.2fx)\n", t.graph_us, tl.graph_us / t.graph_us);
    }
    fflush(stdout);
    free(hx), free(hw), free(hc), free(hcopy), free(hp), free(g), free(be), free(hb), free(hs), free(hb2);
    free(ref), free(out);
    cudaFree(b.x), cudaFree(b.gamma), cudaFree(b.beta), cudaFree(b.s), cudaFree(b.b2), cudaFree(b.c);
    cudaFree(b.parts), cudaFree(b.mean), cudaFree(b.copy), cudaFree(b.W), cudaFree(b.bias), cudaFree(b.xn);
    cudaFree(b.y);
}

// The logits of GPT-2 124M (768 -> 50257, y's rows 50304 apart): the engine's route past 4 rows
// before logits_rows (the LayerNorm kernel, then cuBLASLt over the padded width: wte's padding rows
// are zero) against the LayerNorm kernel + logits_rows (the engine's route); each product alone, and
// logits_rows's rate of reading W. Greedy decoding's pick: the LayerNorm kernel + logits_rows, then
// the device sampler's greedy kernel (sampling.h), against logits_rows taking the pick itself
// (LogitsGreedy), and taking only the ids, as a greedy decode step does (the logits' 4 x M x V bytes
// not written: 12.9 MB at 64 rows), alone and after the LayerNorm kernel; at 1-4 rows (the engine's
// GEMV rows before Hopper; one row on it) the same for the GEMV with lnf inside (fused_ln_linear.h,
// fp32 x0, lnf folded into s = W gamma and b' = W beta).
// Validated against the cuBLASLt route first (rel_l2 <= 1e-5 from the same LayerNorm output, 1e-2
// the GEMV), and the picks against each other (the same ids).
typedef struct {
    int M, C, V, ld, nsets;
    void **W, **unused;   // [nsets] bf16 W [ld, C], rows past V zero
    float *x0, *gamma, *beta, *y;
    void *ln;             // bf16 [M, C]: LayerNorm(x0)
    float *s, *b;         // [V] the GEMV's folded lnf: s = W gamma, b' = W beta
    int *next;            // [M] the picks
    LogitsGreedy greedy;  // its workspace zeroed
    void *sampling_ws;    // the device sampler's, zeroed
    size_t sampling_ws_bytes;
} LogitsBench;

static void enqueue_logits_lt_alone(void *p, int set) {
    LogitsBench *b = p;
    CB(matmul_lt(lt, MATMUL_LT_NONE, b->y, b->ld, b->ln, b->W[set], DTYPE_BF16, NULL, b->M, b->ld, b->C, NULL, stream));
}
static void enqueue_logits_lt(void *p, int set) {
    LogitsBench *b = p;
    CK(baseline_layernorm(b->ln, b->x0, b->gamma, b->beta, b->M, b->C, DTYPE_BF16, stream));
    enqueue_logits_lt_alone(p, set);
}
static void enqueue_logits_rows_alone(void *p, int set) {
    LogitsBench *b = p;
    CK(logits_rows(b->y, b->ld, b->ln, b->C, b->W[set], b->M, b->V, b->C, NULL, stream));
}
static void enqueue_logits_rows(void *p, int set) {
    LogitsBench *b = p;
    CK(baseline_layernorm(b->ln, b->x0, b->gamma, b->beta, b->M, b->C, DTYPE_BF16, stream));
    enqueue_logits_rows_alone(p, set);
}
// Greedy's pick by the device sampler's kernel, after the logits.
static void enqueue_sampler(const LogitsBench *b) {
    CK(sample_on_device(b->y, b->V, b->ld, b->M, 0.0f, 0, 1.0f, NULL, b->next, NULL, b->sampling_ws,
                        b->sampling_ws_bytes, stream));
}
static void enqueue_logits_rows_sampler(void *p, int set) {
    enqueue_logits_rows(p, set);
    enqueue_sampler(p);
}
static void enqueue_logits_rows_greedy(void *p, int set) {
    LogitsBench *b = p;
    CK(baseline_layernorm(b->ln, b->x0, b->gamma, b->beta, b->M, b->C, DTYPE_BF16, stream));
    CK(logits_rows(b->y, b->ld, b->ln, b->C, b->W[set], b->M, b->V, b->C, &b->greedy, stream));
}

// The pick as a decode step takes it: only the ids, the logits not written (ids_only).
static void enqueue_logits_rows_ids_alone(void *p, int set) {
    LogitsBench *b = p;
    LogitsGreedy ids = b->greedy;
    ids.ids_only = 1;
    CK(logits_rows(b->y, b->ld, b->ln, b->C, b->W[set], b->M, b->V, b->C, &ids, stream));
}
static void enqueue_logits_rows_ids(void *p, int set) {
    LogitsBench *b = p;
    CK(baseline_layernorm(b->ln, b->x0, b->gamma, b->beta, b->M, b->C, DTYPE_BF16, stream));
    enqueue_logits_rows_ids_alone(p, set);
}

static void logits_gemv(const LogitsBench *b, int set, const LogitsGreedy *greedy) {
    CK(fused_ln_linear_ex(b->x0, b->C, b->gamma, b->W[set], DTYPE_BF16, b->s, b->b, b->y, b->ld, DTYPE_F32, b->M,
                          b->V, b->C, ACT_NONE, NULL, greedy, LINEAR_PATH_GEMV, stream));
}
static void enqueue_logits_gemv(void *p, int set) { logits_gemv(p, set, NULL); }
static void enqueue_logits_gemv_sampler(void *p, int set) {
    logits_gemv(p, set, NULL);
    enqueue_sampler(p);
}
static void enqueue_logits_gemv_greedy(void *p, int set) {
    LogitsBench *b = p;
    logits_gemv(b, set, &b->greedy);
}

static void bench_logits(int M) {
    const int C = 768, V = 50257, ld = 50304;
    LogitsBench b = {.M = M, .C = C, .V = V, .ld = ld, .nsets = nsets_for((size_t)ld * C * 2)};
    random_sets(b.nsets, (size_t)ld * C, 1, &b.W, &b.unused);
    for (int i = 0; i < b.nsets; i++)
        CK(cudaMemsetAsync((uint16_t *)b.W[i] + (size_t)V * C, 0, (size_t)(ld - V) * C * 2, stream));
    float *hx = xmalloc((size_t)M * C * 4), *hg = xmalloc(C * 4), *hbeta = xmalloc(C * 4);
    float *hs = xmalloc(V * 4), *hb = xmalloc(V * 4);
    for (size_t i = 0; i < (size_t)M * C; i++) hx[i] = frand();
    for (int k = 0; k < C; k++) hg[k] = 1.0f + 0.2f * frand(), hbeta[k] = 0.1f * frand();
    float *w = fetch(b.W[0], (size_t)V * C, DTYPE_BF16);  // s = W gamma, b' = W beta from set 0's W
    for (int n = 0; n < V; n++) {
        double sg = 0, sb = 0;
        for (int k = 0; k < C; k++) {
            const double wk = w[(size_t)n * C + k];
            sg += wk * hg[k], sb += wk * hbeta[k];
        }
        hs[n] = (float)sg, hb[n] = (float)sb;
    }
    free(w);
    b.x0 = upload_w(hx, (size_t)M * C, DTYPE_F32);
    b.gamma = upload_w(hg, C, DTYPE_F32), b.beta = upload_w(hbeta, C, DTYPE_F32);
    b.s = upload_w(hs, V, DTYPE_F32), b.b = upload_w(hb, V, DTYPE_F32);
    CK(cudaMalloc(&b.ln, (size_t)M * C * 2));
    CK(cudaMalloc((void **)&b.y, (size_t)M * ld * 4));
    b.sampling_ws_bytes = sampling_workspace_size(M, V);
    CK(cudaMalloc(&b.sampling_ws, b.sampling_ws_bytes));
    CK(cudaMalloc((void **)&b.next, (size_t)M * 4 + (M + 1) * 8));
    CK(cudaMemsetAsync(b.sampling_ws, 0, b.sampling_ws_bytes, stream));
    CK(cudaMemsetAsync(b.next, 0, (size_t)M * 4 + (M + 1) * 8, stream));
    b.greedy = (LogitsGreedy){b.next, (unsigned long long *)(b.next + 2 * ((M + 1) / 2)), NULL, 0, NULL};
    b.greedy.ticket = (unsigned *)(b.greedy.best + M);
    const int gemv = M <= 4;
    const EnqueueFn routes[3] = {enqueue_logits_lt, enqueue_logits_rows, enqueue_logits_gemv};
    float *got[3] = {NULL};
    for (int r = 0; r < 2 + gemv; r++) {
        CK(cudaMemsetAsync(b.y, 0, (size_t)M * ld * 4, stream));
        routes[r](&b, 0);
        got[r] = fetch(b.y, (size_t)M * ld, DTYPE_F32);
    }
    const double e_rows = rel_l2(got[1], got[0], (size_t)M * ld);
    const double e_gemv = gemv ? rel_l2(got[2], got[0], (size_t)M * ld) : 0.0;
    // The picks of each route with the sampler, then taking them itself.
    const EnqueueFn pickers[4] = {enqueue_logits_rows_sampler, enqueue_logits_rows_greedy, enqueue_logits_gemv_sampler,
                                  enqueue_logits_gemv_greedy};
    int picks[4][64], same = 1;
    for (int r = 0; r < 2 + 2 * gemv; r++) {
        CK(cudaMemsetAsync(b.next, 0xff, (size_t)M * 4, stream));
        pickers[r](&b, 0);
        CK(cudaMemcpyAsync(picks[r], b.next, (size_t)M * 4, cudaMemcpyDeviceToHost, stream));
    }
    CK(cudaStreamSynchronize(stream));
    for (int t = 0; t < M; t++) same &= picks[0][t] == picks[1][t] && (!gemv || picks[2][t] == picks[3][t]);
    printf("logits 768->50257 M=%-3d |", M);
    if (!(e_rows <= 1e-5) || !(e_gemv <= 1e-2) || !same) {
        printf(" INVALID (rel_l2 %.3g logits_rows, %.3g GEMV against cuBLASLt; greedy picks %s): not timed\n", e_rows,
               e_gemv, same ? "agree" : "differ");
    } else {
        Timing t[8];
        const EnqueueFn fns[8] = {enqueue_logits_lt,          enqueue_logits_rows,         enqueue_logits_lt_alone,
                                  enqueue_logits_rows_alone,  enqueue_logits_rows_sampler, enqueue_logits_rows_greedy,
                                  enqueue_logits_rows_ids_alone, enqueue_logits_rows_ids};
        for (int i = 0; i < 8; i++) t[i] = time_it(fns[i], &b, b.nsets);
        printf(" LN + cuBLASLt %6.2f us | LN + logits_rows %6.2f (%.2fx) | alone: cuBLASLt %.2f, logits_rows %.2f"
               " (W at %.0f GB/s) | greedy: LN + logits_rows + sampler %.2f, LN + logits_rows taking it %.2f |"
               " ids only: logits_rows alone %.2f (W at %.0f GB/s), LN + logits_rows %.2f\n",
               t[0].graph_us, t[1].graph_us, t[0].graph_us / t[1].graph_us, t[2].graph_us, t[3].graph_us,
               (double)V * C * 2 / (t[3].graph_us * 1e3), t[4].graph_us, t[5].graph_us, t[6].graph_us,
               (double)V * C * 2 / (t[6].graph_us * 1e3), t[7].graph_us);
        if (gemv)
            printf("    GEMV with lnf inside %.2f us | greedy: GEMV + sampler %.2f, GEMV taking it %.2f\n",
                   time_it(enqueue_logits_gemv, &b, b.nsets).graph_us,
                   time_it(enqueue_logits_gemv_sampler, &b, b.nsets).graph_us,
                   time_it(enqueue_logits_gemv_greedy, &b, b.nsets).graph_us);
    }
    fflush(stdout);
    for (int r = 0; r < 3; r++) free(got[r]);
    free(hx), free(hg), free(hbeta), free(hs), free(hb);
    free_sets(b.nsets, b.W, b.unused);
    cudaFree(b.x0), cudaFree(b.gamma), cudaFree(b.beta), cudaFree(b.s), cudaFree(b.b), cudaFree(b.ln), cudaFree(b.y);
    cudaFree(b.sampling_ws), cudaFree(b.next);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP bench_fused_linear: no GPU\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    l2_bytes = prop.l2CacheSize;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    CB(cublasCreate(&cublas));
    CB(cublasSetStream(cublas, stream));
    void *ws;
    CK(cudaMalloc(&ws, 64 << 20));
    CB(cublasSetWorkspace(cublas, ws, 64 << 20));
    Error err;
    if (!(lt = matmul_lt_create((size_t)32 << 20, &err))) die("%s", err.msg);

    // Copy bandwidth ceiling.
    {
        const size_t n = (size_t)1 << 30;
        void *a, *c;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&c, n));
        CK(cudaMemset(a, 1, n));
        float v[10];
        for (int i = 0; i < 12; i++) {
            CK(cudaEventRecord(ev0, stream));
            CK(cudaMemcpyAsync(c, a, n, cudaMemcpyDeviceToDevice, stream));
            CK(cudaEventRecord(ev1, stream));
            CK(cudaEventSynchronize(ev1));
            if (i >= 2) CK(cudaEventElapsedTime(&v[i - 2], ev0, ev1));
        }
        copy_gbps = 2.0 * n / (median(v, 10) * 1e-3) / 1e9;
        cudaFree(a), cudaFree(c);
    }
    printf("# %s, %d SMs, L2 %d MB, cc %d.%d; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
           prop.multiProcessorCount, l2_bytes >> 20, prop.major, prop.minor, copy_gbps);
    printf("# times in us: graph = median of 21 replays of 20 calls / 20; eager = median of 30 single calls\n");
    FILE *csv = getenv("BENCH_CSV") ? fopen(getenv("BENCH_CSV"), "w") : NULL;

    if (argc == 6 && !strcmp(argv[1], "--one")) {  // --one K N fp32|bf16 M: one shape (for ncu)
        bench_ln(atoi(argv[2]), atoi(argv[3]), strcmp(argv[4], "bf16") ? DTYPE_F32 : DTYPE_BF16, atoi(argv[5]), csv);
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "--one-res")) {  // --one-res K N fp32|bf16 M: one projection (for ncu)
        bench_res(atoi(argv[2]), atoi(argv[3]), strcmp(argv[4], "bf16") ? DTYPE_F32 : DTYPE_BF16, atoi(argv[5]));
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "--one-rows")) {  // --one-rows EPILOGUE K N M: one gemm_rows product (for ncu)
        if (!gemm_rows_available()) {
            printf("SKIP --one-rows: gemm_rows needs an sm_90 device and an sm_90a build\n");
            return 0;
        }
        const int epi = atoi(argv[2]);  // matmul_lt.h's MatmulLtEpilogue: 0 none .. 3 bias + GELU
        if (epi < MATMUL_LT_NONE || epi > MATMUL_LT_BIAS_GELU) die("--one-rows: epilogue %s is not 0-3", argv[2]);
        bench_rows((MatmulLtEpilogue)epi, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
        return 0;
    }
    const int shapes[][2] = {{768, 3072}, {1024, 4096}};
    const int rshapes[][2] = {{768, 768}, {3072, 768}};
    if (argc == 2 && !strcmp(argv[1], "--decode")) {  // bf16 at batched-decode rows: the GEMVs' range
        const int Md[] = {1, 4, 8, 16, 32, 64};
        for (int si = 0; si < 2; si++)
            for (int mi = 0; mi < 6; mi++) bench_ln(shapes[si][0], shapes[si][1], DTYPE_BF16, Md[mi], csv);
        for (int si = 0; si < 2; si++)
            for (int mi = 0; mi < 6; mi++) bench_res(rshapes[si][0], rshapes[si][1], DTYPE_BF16, Md[mi]);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--rows")) {  // GPT-2 124M's decode products that gemm_rows takes
        if (!gemm_rows_available()) {
            printf("SKIP --rows: gemm_rows needs an sm_90 device and an sm_90a build\n");
            return 0;
        }
        const int Mr[] = {8, 16, 32, 48, 64};
        for (int mi = 0; mi < 5; mi++) {
            bench_rows(MATMUL_LT_BIAS, 768, 2304, Mr[mi]);
            bench_rows(MATMUL_LT_BIAS_RESIDUAL, 768, 768, Mr[mi]);
            bench_rows(MATMUL_LT_BIAS_GELU, 768, 3072, Mr[mi]);
            bench_rows(MATMUL_LT_BIAS_RESIDUAL, 3072, 768, Mr[mi]);
            bench_rows(MATMUL_LT_NONE, 768, 50304, Mr[mi]);  // the logits (wte padded to 64 rows)
        }
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--fold")) {  // GPT-2 124M's LayerNorms folded at batched-decode rows
        if (!gemm_rows_fold_takes(64, 3072, 768)) {
            printf("SKIP --fold: gemm_rows_fold needs an sm_90 device and an sm_90a build\n");
            return 0;
        }
        const int Mf[] = {24, 32, 48, 64};
        for (int mi = 0; mi < 4; mi++) {
            bench_fold(MATMUL_LT_BIAS, 768, 2304, Mf[mi]);
            bench_fold(MATMUL_LT_BIAS_GELU, 768, 3072, Mf[mi]);
            bench_copy(768, 768, Mf[mi]);
            bench_copy(3072, 768, Mf[mi]);
        }
        return 0;
    }
    if ((argc == 2 || argc == 3) && !strcmp(argv[1], "--tiles")) {  // GPT-2 124M's products at a prompt's rows [M]
        if (!gemm_tiles_available()) {
            printf("SKIP --tiles: gemm_tiles needs an sm_90 device and an sm_90a build\n");
            return 0;
        }
        int Mt[] = {769, 1024}, nm = 2;
        if (argc == 3) {
            Mt[0] = atoi(argv[2]), nm = 1;
            if (Mt[0] < 1 || Mt[0] > GEMM_TILES_MAX_ROWS)
                die("--tiles: rows %s are not 1-%d", argv[2], GEMM_TILES_MAX_ROWS);
        }
        for (int mi = 0; mi < nm; mi++) {
            bench_tiles(MATMUL_LT_BIAS, 768, 2304, Mt[mi]);
            bench_tiles(MATMUL_LT_BIAS_RESIDUAL, 768, 768, Mt[mi]);
            bench_tiles(MATMUL_LT_BIAS_GELU, 768, 3072, Mt[mi]);
            bench_tiles(MATMUL_LT_BIAS_RESIDUAL, 3072, 768, Mt[mi]);
            bench_tiles_fold(MATMUL_LT_BIAS, 768, 2304, Mt[mi]);
            bench_tiles_fold(MATMUL_LT_BIAS_GELU, 768, 3072, Mt[mi]);
        }
        return 0;
    }
    if ((argc == 2 || argc == 3) && !strcmp(argv[1], "--logits")) {  // GPT-2 124M's logits at decode rows [M]
        if (!logits_rows_takes(8, 768)) {
            printf("SKIP --logits: logits_rows needs an sm_90 device and an sm_90a build\n");
            return 0;
        }
        if (argc == 3) {  // one row count (for ncu)
            const int M = atoi(argv[2]);
            if (M < 1 || M > 64) die("--logits: rows %s are not 1-64", argv[2]);
            bench_logits(M);
            return 0;
        }
        const int Ml[] = {1, 2, 4, 5, 8, 16, 24, 32, 48, 64};
        for (int mi = 0; mi < 10; mi++) bench_logits(Ml[mi]);
        return 0;
    }
    const int Ms[] = {1, 16, 64, 512, 4096};
    for (int si = 0; si < 2; si++)
        for (int d = 1; d >= 0; d--)
            for (int mi = 0; mi < 5; mi++) {
                if (quick && Ms[mi] == 4096 && d == 0) continue;
                bench_ln(shapes[si][0], shapes[si][1], (DType)d, Ms[mi], csv);
            }
    for (int si = 0; si < 2; si++)
        for (int d = 1; d >= 0; d--)
            for (int mi = 0; mi < 5; mi++) bench_res(rshapes[si][0], rshapes[si][1], (DType)d, Ms[mi]);
    if (csv) fclose(csv);
    matmul_lt_free(lt);
    cublasDestroy(cublas);
    cudaFree(ws);
    return 0;
}

#else

int main(void) {
    printf("SKIP bench_fused_linear: built without CUDA\n");
    return 0;
}

#endif
