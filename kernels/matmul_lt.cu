// cuBLASLt products with their epilogue (kernels/matmul_lt.h says what each computes, why the bias
// has y's type and where GELU is a separate pass). Column-major, as cuBLASLt sees llm.c's row-major
// y[M, N] = x[M, K] W[N, K]^T: D (N x M, ld ldy) = op(A) B with A = W stored K x N (ld K, transposed)
// and B = x stored K x M (ld K); the bias runs along D's N rows, one value per output column of y.
#include <cublasLt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "matmul_lt.h"
#include "reference_kernels.h"

// A cuBLAS(Lt) call in a function that returns cuBLAS's status.
#define LT_TRY(call)                                                \
    do {                                                            \
        cublasStatus_t st_ = (call);                                \
        if (st_ != CUBLAS_STATUS_SUCCESS) return st_;               \
    } while (0)

// Teardown, where no status can travel: report on stderr and carry on.
static void warn_failed(cublasStatus_t st, const char *call) {
    if (st != CUBLAS_STATUS_SUCCESS) fprintf(stderr, "gpt2: matmul_lt: %s: %s\n", call, cublasGetStatusName(st));
}

// A kernel launch in terms of cuBLAS's statuses, which have no room for the CUDA error itself.
static cublasStatus_t launched(cudaError_t e) {
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// ----------------------------------------------------------------------------
// Plans: one call shape's descriptor, layouts and algorithm

// Everything the heuristic's choice depends on. The alignments are those of this call's buffers:
// the heuristic assumes 256-byte alignment unless told otherwise, and an algorithm picked for aligned
// buffers may not run on the weights of a layer that starts mid-allocation (odd model widths).
// Eleven 4-byte fields and no padding, so keys compare with memcmp.
typedef struct {
    int M, N, K, ldy, dtype;
    int epilogue;  // cuBLASLt's: fp32 BIAS_GELU runs BIAS's plan into its scratch
    int ytype;
    uint32_t align_w, align_x, align_y, align_bias;
} PlanKey;

typedef struct {
    PlanKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t w_layout, x_layout, y_layout;  // y_layout serves C and D (in place)
    cublasLtMatmulAlgo_t algo;
    int tuned;                    // algo was picked by timing the heuristic's candidates
    unsigned long long last_use;  // the context's clock at the plan's last call; 0: empty slot
} Plan;

struct MatmulLt {
    cublasLtHandle_t handle;
    cublasLtMatmulPreference_t pref;  // the workspace bound; alignments set per plan
    void *workspace;
    size_t workspace_bytes;
    int tune;  // unless GPT2_LT_TUNE=0 at creation: time the candidates of large products
    Plan plans[MATMUL_LT_PLANS];
    unsigned long long clock;  // calls so far
    long long heuristic_queries, tunings;
};

// One call's operands: what a plan is tuned on.
typedef struct {
    const void *W, *x, *bias;
    void *d;  // the product's C and D
    const float *beta;
    cudaStream_t stream;
} Call;

// The largest power of two up to 256 dividing the address.
static uint32_t alignment(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}

static void plan_destroy(Plan *p) {
    if (p->desc) warn_failed(cublasLtMatmulDescDestroy(p->desc), "cublasLtMatmulDescDestroy");
    if (p->w_layout) warn_failed(cublasLtMatrixLayoutDestroy(p->w_layout), "cublasLtMatrixLayoutDestroy");
    if (p->x_layout) warn_failed(cublasLtMatrixLayoutDestroy(p->x_layout), "cublasLtMatrixLayoutDestroy");
    if (p->y_layout) warn_failed(cublasLtMatrixLayoutDestroy(p->y_layout), "cublasLtMatrixLayoutDestroy");
    memset(p, 0, sizeof(*p));
}

// ----------------------------------------------------------------------------
// Tuning (on by default; GPT2_LT_TUNE=0 turns it off): the heuristic's first algorithm is not
// always its fastest. For 8192 rows on an H200 (docs/PERF.md, "Session 19") a later one of its
// first eight runs GPT-2's qkv and fc products 1.15x and the logits 1.2x faster, which takes the
// 8 x 1024 forward from 4.47 to 4.15-4.33 ms; for 64 and 1024 rows the gain is 0-6% and nothing in
// the engine. The first call of a product of at least LT_TUNE_FLOPS times each candidate on that
// call's own operands and keeps the fastest.
//
// How it times matters more than how often. Inside a forward a product meets its weights in
// device memory, not in L2; timed back to back on the same operands (sessions 5-18) the candidates
// ran from a warm L2, where their order differs: a 144 x 128 tile as fast as 128 x 128 alone was
// 0.01 ms slower a call inside the forward, and the picks, and the forward, varied from run to
// run (4.18-4.46 ms). So each sample is one call after a write of twice the L2's size has evicted
// everything: the picks then agree with the forward's own best and were the same in every run.
// Which candidate wins still depends on timings, so it is kept stable against noise: the earliest
// in the heuristic's order within LT_TUNE_MARGIN of the fastest.
//
// Only outside a stream capture (timing needs a synchronisation; a plan built while a graph is
// captured keeps the heuristic's first), and only where the output can be written freely: the
// residual epilogue reads and writes the residual stream, so its candidates write into a temporary
// buffer instead. Either buffer that cannot be allocated means no tuning. Different algorithms may
// sum in a different order, so results may differ in the last bits from an untuned run (and from a
// run whose timings picked another candidate), within the tests' tolerances; GPT2_LT_TUNE=0 keeps
// the heuristic's first, the same bits every run.

enum { LT_CANDIDATES = 8, LT_TIMED_RUNS = 5 };
static const double LT_TUNE_FLOPS = 8e9;  // ~12 us at the 700 TFLOP/s an H200 reaches
static const float LT_TUNE_MARGIN = 1.03f;

static int worth_tuning(const MatmulLt *lt, const PlanKey *key, cudaStream_t stream) {
    if (!lt->tune || 2.0 * key->M * key->N * key->K < LT_TUNE_FLOPS) return 0;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone;
}

// What the samples need besides the call's operands: two events and the buffer whose write evicts
// the L2 before each call.
typedef struct {
    cudaEvent_t ev[2];
    void *evict;
    size_t evict_bytes;
} Timer;

// Median time in ms of one call with algo from a cold L2, or -1 when the algorithm fails. The first
// call is a warm-up and not counted.
static float time_algo(MatmulLt *lt, const Plan *p, const cublasLtMatmulAlgo_t *algo, const Call *c, void *d,
                       const Timer *tm) {
    const float one = 1.0f;
    float ms[LT_TIMED_RUNS];
    for (int r = -1; r < LT_TIMED_RUNS; r++) {
        if (cudaMemsetAsync(tm->evict, r & 0xff, tm->evict_bytes, c->stream) != cudaSuccess ||
            cudaEventRecord(tm->ev[0], c->stream) != cudaSuccess)
            return -1;
        if (cublasLtMatmul(lt->handle, p->desc, &one, c->W, p->w_layout, c->x, p->x_layout, c->beta, d, p->y_layout, d,
                           p->y_layout, algo, lt->workspace, lt->workspace_bytes, c->stream) != CUBLAS_STATUS_SUCCESS)
            return -1;
        if (cudaEventRecord(tm->ev[1], c->stream) != cudaSuccess || cudaEventSynchronize(tm->ev[1]) != cudaSuccess ||
            (r >= 0 && cudaEventElapsedTime(&ms[r], tm->ev[0], tm->ev[1]) != cudaSuccess))
            return -1;
    }
    for (int i = 1; i < LT_TIMED_RUNS; i++)  // insertion sort: five values
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            const float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    return ms[LT_TIMED_RUNS / 2];
}

// The earliest candidate within LT_TUNE_MARGIN of the fastest, timed writing into d; -1 if none ran.
static int fastest(MatmulLt *lt, const Plan *p, const cublasLtMatmulHeuristicResult_t *found, int count, const Call *c,
                   void *d, const Timer *tm) {
    float ms[LT_CANDIDATES], best = -1;
    for (int i = 0; i < count; i++) {
        ms[i] = found[i].state == CUBLAS_STATUS_SUCCESS ? time_algo(lt, p, &found[i].algo, c, d, tm) : -1;
        if (ms[i] >= 0 && (best < 0 || ms[i] < best)) best = ms[i];
    }
    for (int i = 0; i < count; i++)
        if (ms[i] >= 0 && ms[i] <= best * LT_TUNE_MARGIN) return i;
    return -1;
}

// Sets p->algo to the fastest candidate for c's operands; on any failure it stays the heuristic's
// first. Out of memory is not sticky: the failed allocation's error is cleared and nothing is tuned.
static void tune(MatmulLt *lt, Plan *p, const cublasLtMatmulHeuristicResult_t *found, int count, const Call *c) {
    Timer tm = {{NULL, NULL}, NULL, 0};
    void *tmp = NULL;
    int device, l2_bytes = 0, pick = -1;
    const size_t residual_bytes = (size_t)p->key.M * p->key.ldy * sizeof(float);
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess)
        goto done;
    tm.evict_bytes = 2 * (size_t)(l2_bytes > 0 ? l2_bytes : 64 << 20);
    if (cudaMalloc(&tm.evict, tm.evict_bytes) != cudaSuccess || cudaEventCreate(&tm.ev[0]) != cudaSuccess ||
        cudaEventCreate(&tm.ev[1]) != cudaSuccess)
        goto done;
    // C = D is the residual stream: time elsewhere.
    if (p->key.epilogue == MATMUL_LT_BIAS_RESIDUAL &&
        (cudaMalloc(&tmp, residual_bytes) != cudaSuccess ||
         cudaMemsetAsync(tmp, 0, residual_bytes, c->stream) != cudaSuccess))
        goto done;
    pick = fastest(lt, p, found, count, c, tmp ? tmp : c->d, &tm);
done:
    if (pick < 0) (void)cudaGetLastError();
    if (tmp) CUDA_WARN(cudaFree(tmp));
    if (tm.evict) CUDA_WARN(cudaFree(tm.evict));
    for (int i = 0; i < 2; i++)
        if (tm.ev[i]) CUDA_WARN(cudaEventDestroy(tm.ev[i]));
    if (pick < 0) return;
    p->algo = found[pick].algo;
    p->tuned = 1;
    lt->tunings++;
}

// ----------------------------------------------------------------------------
// Building and finding plans

// Builds the descriptors for key, asks the heuristic for its candidates and takes the first, or
// the fastest (tune). call: the operands of the call that needs the plan (the heuristic reads the
// bias pointer's alignment from the descriptor; the timing runs on them).
static cublasStatus_t plan_create(MatmulLt *lt, Plan *p, const PlanKey *key, const Call *call) {
    const void *bias = call->bias;
    const cudaDataType_t operand = key->dtype == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t out = key->ytype == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t transpose = CUBLAS_OP_T, as_is = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = key->epilogue == MATMUL_LT_NONE   ? CUBLASLT_EPILOGUE_DEFAULT
                                        : key->epilogue == MATMUL_LT_BIAS_GELU ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                                               : CUBLASLT_EPILOGUE_BIAS;
    // CUBLAS_COMPUTE_32F: fp32 accumulation, and for fp32 operands no TF32 (that is _FAST_TF32).
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &as_is, sizeof(as_is)));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {  // D's type: the documented default, stated
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out, sizeof(out)));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p->w_layout, operand, key->K, key->N, key->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->x_layout, operand, key->K, key->M, key->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->y_layout, out, key->N, key->M, key->ldy));
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t bytes;
    } aligns[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key->align_w},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key->align_x},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key->align_y},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key->align_y}};
    for (size_t i = 0; i < sizeof(aligns) / sizeof(aligns[0]); i++)
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(lt->pref, aligns[i].attr, &aligns[i].bytes, sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t found[LT_CANDIDATES];
    int count = 0;
    lt->heuristic_queries++;
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt->handle, p->desc, p->w_layout, p->x_layout, p->y_layout, p->y_layout,
                                          lt->pref, LT_CANDIDATES, found, &count));
    if (count < 1 || found[0].state != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_NOT_SUPPORTED;
    p->key = *key;
    p->algo = found[0].algo;
    if (worth_tuning(lt, key, call->stream)) tune(lt, p, found, count, call);
    return CUBLAS_STATUS_SUCCESS;
}

// The plan for key: the cached one, or a new one in an empty slot or the least recently used.
static cublasStatus_t plan_for(MatmulLt *lt, const PlanKey *key, const Call *call, Plan **plan) {
    Plan *oldest = &lt->plans[0];
    for (int i = 0; i < MATMUL_LT_PLANS; i++) {
        Plan *p = &lt->plans[i];
        if (p->last_use && !memcmp(&p->key, key, sizeof(*key))) {
            *plan = p;
            return CUBLAS_STATUS_SUCCESS;
        }
        if (p->last_use < oldest->last_use) oldest = p;
    }
    plan_destroy(oldest);
    cublasStatus_t st = plan_create(lt, oldest, key, call);
    if (st != CUBLAS_STATUS_SUCCESS) {
        plan_destroy(oldest);
        return st;
    }
    *plan = oldest;
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// Context

static int lt_init(MatmulLt *lt, size_t workspace_bytes, Error *err) {
    const uint64_t max_workspace = workspace_bytes;
    CUBLAS_TRY(cublasLtCreate(&lt->handle));
    CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&lt->pref));
    CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &max_workspace, sizeof(max_workspace)));
    if (gpu_alloc(&lt->workspace, workspace_bytes, "the cuBLASLt workspace", err)) return -1;
    lt->workspace_bytes = workspace_bytes;
    const char *tune = getenv("GPT2_LT_TUNE");
    lt->tune = !(tune && !strcmp(tune, "0"));
    return 0;
}

extern "C" MatmulLt *matmul_lt_create(size_t workspace_bytes, Error *err) {
    MatmulLt *lt = (MatmulLt *)xcalloc(1, sizeof(MatmulLt));
    if (lt_init(lt, workspace_bytes, err)) {
        matmul_lt_free(lt);
        return NULL;
    }
    return lt;
}

extern "C" void matmul_lt_free(MatmulLt *lt) {
    if (!lt) return;
    for (int i = 0; i < MATMUL_LT_PLANS; i++) plan_destroy(&lt->plans[i]);
    if (lt->pref) warn_failed(cublasLtMatmulPreferenceDestroy(lt->pref), "cublasLtMatmulPreferenceDestroy");
    if (lt->workspace) CUDA_WARN(cudaFree(lt->workspace));
    if (lt->handle) warn_failed(cublasLtDestroy(lt->handle), "cublasLtDestroy");
    free(lt);
}

extern "C" void matmul_lt_stats(const MatmulLt *lt, MatmulLtStats *stats) {
    stats->calls = (long long)lt->clock;
    stats->heuristic_queries = lt->heuristic_queries;
    stats->tunings = lt->tunings;
    stats->plans = stats->tuned_plans = 0;
    for (int i = 0; i < MATMUL_LT_PLANS; i++) {
        stats->plans += lt->plans[i].last_use != 0;
        stats->tuned_plans += lt->plans[i].last_use != 0 && lt->plans[i].tuned;
    }
}

// ----------------------------------------------------------------------------
// Products

extern "C" DType matmul_lt_ytype(MatmulLtEpilogue epilogue, DType dtype) {
    return epilogue == MATMUL_LT_BIAS || epilogue == MATMUL_LT_BIAS_GELU ? dtype : DTYPE_F32;
}

// The arguments both routes share.
static int args_ok(MatmulLtEpilogue epilogue, const void *y, long long ldy, const void *x, const void *W, DType dtype,
                   const void *bias, int M, int N, int K) {
    if (epilogue < MATMUL_LT_NONE || epilogue > MATMUL_LT_BIAS_GELU) return 0;
    if (!y || !x || !W || M < 0 || N < 1 || K < 1 || ldy < N || ldy > INT32_MAX) return 0;
    return (dtype == DTYPE_F32 || dtype == DTYPE_BF16) && (bias == NULL) == (epilogue == MATMUL_LT_NONE);
}

// fp32 BIAS_GELU: the bias epilogue into scratch, then the GELU pass (matmul_lt.h says why).
static int gelu_pass(MatmulLtEpilogue epilogue, DType dtype) {
    return epilogue == MATMUL_LT_BIAS_GELU && dtype == DTYPE_F32;
}

extern "C" cublasStatus_t matmul_lt(MatmulLt *lt, MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x,
                                    const void *W, DType dtype, const void *bias, int M, int N, int K,
                                    float *scratch, cudaStream_t stream) {
    const int gelu = gelu_pass(epilogue, dtype);
    if (!lt || !args_ok(epilogue, y, ldy, x, W, dtype, bias, M, N, K) ||
        (gelu && (!scratch || scratch == y || ldy != N)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (M == 0) return CUBLAS_STATUS_SUCCESS;
    void *d = gelu ? scratch : y;  // the GEMM's C and D
    const PlanKey key = {M,
                         N,
                         K,
                         (int)ldy,
                         (int)dtype,
                         gelu ? (int)MATMUL_LT_BIAS : (int)epilogue,
                         (int)matmul_lt_ytype(epilogue, dtype),
                         alignment(W),
                         alignment(x),
                         alignment(d),
                         alignment(bias)};
    const float one = 1.0f, zero = 0.0f;
    const Call call = {W, x, bias, d, epilogue == MATMUL_LT_BIAS_RESIDUAL ? &one : &zero, stream};
    Plan *plan;
    LT_TRY(plan_for(lt, &key, &call, &plan));
    plan->last_use = ++lt->clock;
    // The plan may have been built for another layer's bias (same alignment): this call's goes in.
    if (bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    LT_TRY(cublasLtMatmul(lt->handle, plan->desc, &one, W, plan->w_layout, x, plan->x_layout, call.beta, d,
                          plan->y_layout, d, plan->y_layout, &plan->algo, lt->workspace, lt->workspace_bytes, stream));
    return gelu ? launched(gelu_forward(y, scratch, (size_t)M * N, DTYPE_F32, stream)) : CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t matmul_lt_unfused(cublasHandle_t cublas, MatmulLtEpilogue epilogue, void *y, const void *x,
                                            const void *W, DType dtype, const float *bias, int M, int N, int K,
                                            float *scratch, cudaStream_t stream) {
    const DType ytype = matmul_lt_ytype(epilogue, dtype);
    const int with_scratch = epilogue == MATMUL_LT_BIAS_GELU || epilogue == MATMUL_LT_BIAS_RESIDUAL ||
                             (epilogue == MATMUL_LT_BIAS && ytype != DTYPE_F32);
    if (!cublas || !args_ok(epilogue, y, N, x, W, dtype, bias, M, N, K) ||
        (with_scratch && (!scratch || scratch == y)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (M == 0) return CUBLAS_STATUS_SUCCESS;
    float *product = with_scratch ? scratch : (float *)y;
    LT_TRY(matmul_nt(cublas, product, N, x, W, M, N, K, dtype));
    const size_t n = (size_t)M * N;
    switch (epilogue) {
    case MATMUL_LT_NONE: return CUBLAS_STATUS_SUCCESS;
    case MATMUL_LT_BIAS:
        LT_TRY(launched(bias_add(product, bias, M, N, stream)));
        return with_scratch ? launched(convert_dtype(y, ytype, product, DTYPE_F32, n, stream)) : CUBLAS_STATUS_SUCCESS;
    case MATMUL_LT_BIAS_RESIDUAL: return launched(residual_add_bias((float *)y, scratch, bias, M, N, stream));
    case MATMUL_LT_BIAS_GELU:
        LT_TRY(launched(bias_add(product, bias, M, N, stream)));
        return launched(gelu_forward(y, scratch, n, ytype, stream));
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
