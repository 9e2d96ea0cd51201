// Linear with the residual add as its epilogue (issue 5): residual[M, N] (fp32, in place)
// += x[M, K] W^T + b, for the attention projection (K = C) and the MLP projection (K = 4C), so the
// fused path keeps no separate residual kernel.
//
// x and W in the compute dtype (fp32, or bf16 with fp32 accumulation), W [N, K] row-major, b fp32
// [N] or NULL. Same kernels as fused_ln_linear (kernels/linear_kernels.cuh) without the LayerNorm:
// M <= 4 a GEMV streaming W with 16-byte loads over all SMs (x staged whole in shared memory,
// so K up to ~100k bf16 / 50k fp32 per row on an H100; more rows than fit run in slices; fp32 to
// 16 rows); bf16 from 5 to 64 rows on sm_90 and later the skinny kernel (W in shared memory before
// the PDL wait, K split over a cluster), else the GEMV to 16 rows; larger M bf16 tensor cores
// (mma.sync, W and x tiles by cp.async) or fp32 FFMA tiles (no TF32).
//
// Each element of residual is read and written by one thread once; residual must not alias x.
// Returns cudaSuccess (0) or the error (cudaErrorInvalidValue for a bad argument).
#pragma once

#include "fused_ln_linear.h"  // DType, LinearPath

#ifdef __cplusplus
extern "C" {
#endif

int linear_residual(const void *x, const void *W, DType dtype, const float *b, float *residual, int M, int N, int K,
                    cudaStream_t stream);

// With a forced kernel (tests, benchmarks).
int linear_residual_ex(const void *x, const void *W, DType dtype, const float *b, float *residual, int M, int N,
                       int K, LinearPath path, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
