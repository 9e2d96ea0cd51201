// The unfused baseline that tests/bench_fused_linear.c times the fused kernels against: a plain
// LayerNorm kernel and a bias + GELU kernel around cuBLAS (the bench calls cublasGemmEx itself).
// Written to be fair rather than naive: one warp per LayerNorm row, vectorised elementwise GELU.
// Not used by the engine.
#pragma once

#include <cuda_runtime_api.h>

#include "model.h"  // DType

#ifdef __cplusplus
extern "C" {
#endif

// out[M, K] (dt) = (x - mean) * rstd * gamma + beta, eps 1e-5, x fp32 [M, K].
int baseline_layernorm(void *out, const float *x, const float *gamma, const float *beta, int M, int K, DType dt,
                       cudaStream_t stream);

// y[M, N] (dt) = gelu_tanh(y + b[n]) in place (act = 0: y + b only).
int baseline_bias_act(void *y, const float *b, int M, int N, int act, DType dt, cudaStream_t stream);

// res[M, N] += y (dt) + b[n], fp32 residual.
int baseline_residual_add(float *res, const void *y, const float *b, int M, int N, DType dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
