// Linear layers through cuBLASLt with the epilogue inside the GEMM: the fused table's route for many
// rows (prefill, batched decode), where cuBLAS's tensor-core GEMMs beat our own tiles
// (kernels/ops_fused.cu says where the crossover is). The reference table runs the same product as
// cublasGemmEx into fp32 followed by separate bias, GELU and residual kernels; here the bias and
// the residual add happen in the GEMM's epilogue, so those passes over an fp32 [M, N] product and
// their launches disappear.
//
//   y[M, N] = x[M, K] W[N, K]^T     x, W row-major (llm.c's layout, as matmul_nt), compute dtype:
//                                   fp32 (true fp32: CUBLAS_COMPUTE_32F, no TF32) or bf16 with
//                                   fp32 accumulation; y's rows ldy elements apart
//   MATMUL_LT_NONE           y  = x W^T                   y fp32 (the logits)
//   MATMUL_LT_BIAS           y  = x W^T + b               y, b compute dtype (the qkv product, before
//                                                         its split)
//   MATMUL_LT_BIAS_RESIDUAL  y += x W^T + b               y, b fp32: the residual stream, in place
//                                                         (beta = 1, C = D = y)
//   MATMUL_LT_BIAS_GELU      y  = gelu(x W^T + b)         y, b compute dtype (the MLP's hidden layer)
//
// What the cuBLASLt documentation (cublasLt.h, CUDA 13.0) says, and does not say, shapes the API:
//   - "Bias vector elements are the same type as the elements of output matrix (Dtype) with the
//     following exceptions": int8 (IMMA) and fp8 kernels (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
//     So the bias always has y's type: a bf16 model keeps bf16 copies of the qkv and fc biases
//     for these epilogues (as PyTorch's bf16 GPT-2 holds its biases in bf16), and the residual
//     epilogue, whose y is the fp32 stream, takes the fp32 bias.
//   - CUBLASLT_EPILOGUE_GELU_BIAS: "apply GELU point-wise transform to the results (x:=GELU(x))",
//     nothing about which GELU (erf, or the tanh approximation GPT-2 uses) nor how exactly a tanh
//     is evaluated. The two differ by at most ~2e-4 absolute (near |x| = 2), under half a bf16 ulp
//     of the values there, so for bf16 the epilogue is used and the product is written once, in
//     bf16. fp32 must match the references to 1e-5, so there BIAS_GELU is the bias epilogue into an
//     fp32 scratch followed by kernels/gelu.cu's pass (the reference table's GELU).
//   - The heuristic picks by alignment: with N = V = 50257 (the logits) it runs an unvectorised
//     sm75 kernel ("align1"), 6.7 ms for 8192 rows on an H200. The engine computes whole rows of
//     a padded width instead (N = ldy = V rounded up to 64, over zero rows of wte), hence ldy.
//
// A context (MatmulLt) holds the cuBLASLt handle, one preallocated workspace and a cache of plans:
// the matmul descriptor, the three matrix layouts and the algorithm, per (M, N, K, dtype, epilogue,
// pointer alignments). A call looks its plan up; only the first call of a shape builds one (host
// work: descriptors and one heuristic query; no device allocation), so every call can be captured
// in a CUDA graph. The algorithm is the heuristic's first, except that large products (2MNK >= 8
// GFLOP: prefill of a few thousand rows) whose first call comes outside a stream capture time the
// heuristic's first eight candidates on that call's own operands, each from a cold L2, and keep the
// fastest (the 8 x 1024 forward 7% faster on an H200: matmul_lt.cu; ~10 ms once per shape, ~50 ms
// for the logits of 8192 rows, a buffer of twice the L2's size while it runs, and for the residual
// epilogue a temporary [M, ldy] fp32 buffer). GPT2_LT_TUNE=0 when the context is created turns
// tuning off. The cache keeps the MATMUL_LT_PLANS most recently used plans.
//
// Calls return CUBLAS_STATUS_SUCCESS or cuBLAS's status: CUBLAS_STATUS_INVALID_VALUE for a bad
// argument (nothing launched), CUBLAS_STATUS_NOT_SUPPORTED when the heuristic has no algorithm,
// CUBLAS_STATUS_EXECUTION_FAILED when a launch of the GELU pass (or of the unfused steps) failed.
// All pointers are device memory; M = 0 does nothing.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "model.h"  // DType, Error

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MATMUL_LT_NONE = 0,
    MATMUL_LT_BIAS = 1,
    MATMUL_LT_BIAS_RESIDUAL = 2,
    MATMUL_LT_BIAS_GELU = 3,
} MatmulLtEpilogue;

enum { MATMUL_LT_PLANS = 64 };  // plans the cache keeps (a prefill length or batch size takes ~5)

typedef struct MatmulLt MatmulLt;

// The cuBLASLt handle and a workspace of workspace_bytes (32 MiB is what NVIDIA advises for
// Hopper). NULL with a one-line err on failure.
MatmulLt *matmul_lt_create(size_t workspace_bytes, Error *err);
// Frees the plans, the workspace and the handle; no work using them may still be queued. NULL: nothing.
void matmul_lt_free(MatmulLt *lt);

// y = epilogue(x W^T + b) as listed above, enqueued on stream.
//   y        [M, N], row stride ldy >= N: fp32 (NONE, BIAS_RESIDUAL) or the compute dtype (BIAS,
//            BIAS_GELU); fp32 BIAS_GELU needs ldy == N
//   x        dtype [M, K];  W  dtype [N, K];  bias [N], y's type (NULL for NONE)
//   scratch  fp32 [M, N] for fp32 BIAS_GELU (not y), else unused (NULL)
cublasStatus_t matmul_lt(MatmulLt *lt, MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x,
                         const void *W, DType dtype, const void *bias, int M, int N, int K, float *scratch,
                         cudaStream_t stream);

// The same through the reference table's separate steps: cublasGemmEx into fp32 (matmul_nt), then
// bias_add, gelu_forward, residual_add_bias or a rounding to bf16 (kernels/reference_kernels.h):
// what tests/test_matmul_lt.c checks matmul_lt against. y as matmul_lt's with ldy = N; bias fp32
// always (the test passes the bf16 bias's values widened); scratch fp32 [M, N] wherever the
// product is not y itself (BIAS_RESIDUAL, BIAS_GELU, bf16 BIAS). cublas must be bound to stream.
cublasStatus_t matmul_lt_unfused(cublasHandle_t cublas, MatmulLtEpilogue epilogue, void *y, const void *x,
                                 const void *W, DType dtype, const float *bias, int M, int N, int K, float *scratch,
                                 cudaStream_t stream);

// y's type for an epilogue and compute dtype (the rule above).
DType matmul_lt_ytype(MatmulLtEpilogue epilogue, DType dtype);

// What the plan cache did, for tests: calls that ran a product, how many of them had to build a
// plan (a heuristic query) and how many of those picked by timing, and the plans held now (tuned
// ones among them).
typedef struct {
    long long calls, heuristic_queries, tunings;
    int plans, tuned_plans;
} MatmulLtStats;
void matmul_lt_stats(const MatmulLt *lt, MatmulLtStats *stats);

#ifdef __cplusplus
}
#endif
