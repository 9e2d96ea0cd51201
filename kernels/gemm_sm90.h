// The many-row linear layers on Hopper (sm_90a): our own GEMM, so that prefill, the forward and
// batched decode past the GEMVs' rows run kernels that join the PDL chain (pdl.cuh), which
// cuBLASLt's cannot (docs/PERF.md, "Session 14").
//
//   y[M, N] = epilogue(x[M, K] W[N, K]^T + b)     x, W bf16 row-major; fp32 accumulation
//
// with matmul_lt's epilogues, types and row stride (matmul_lt.h): NONE (fp32 y: the logits), BIAS
// (bf16 y and bias: the qkv product), BIAS_RESIDUAL (fp32 y += ..., fp32 bias: the projections),
// BIAS_GELU (bf16 y and bias, GELU's tanh form: the MLP's hidden layer). So the fused table can
// send either kernel the same call (kernels/ops_fused.cu picks).
//
// How (gemm_sm90.cu): each block computes a BM x BN tile of y (BM 64 or 128, BN 128 to 256, picked
// per shape for the device's SM count) in three warpgroups: one producer thread issues TMA loads of
// x's and W's 64-wide K slices into a ring of shared-memory stages (128-byte swizzle, mbarriers
// counting the bytes in), and two consumer warpgroups run wgmma on each stage straight from shared
// memory and hand it back. W's first stages are requested before the PDL wait, since no kernel
// writes the weights; x's after it. The epilogue runs from the accumulators.
//
// Needs compute capability 9.0 and a build with sm_90a code (GPT2_SM90A): gemm_sm90_available().
// K must be a multiple of 8 and x, W 16-byte aligned (TMA's row strides and addresses); y and the
// bias need only their type's alignment.
#pragma once

#include <cuda_runtime_api.h>

#include "matmul_lt.h"  // MatmulLtEpilogue

#ifdef __cplusplus
extern "C" {
#endif

// 1 when gemm_sm90 can run on the current device and GPT2_GEMM is not "cublaslt" (read at every
// call, so that a test or a benchmark can compare the two routes in one process).
int gemm_sm90_available(void);

// y = epilogue(x W^T + b) as above, enqueued on stream with PDL. Returns cudaSuccess,
// cudaErrorInvalidValue for a bad argument or a shape it does not take (K % 8, alignment; nothing
// launched), cudaErrorNotSupported where gemm_sm90_available() is 0, else the launch's error.
// M = 0 does nothing. GPT2_GEMM_TILE=BMxBN (e.g. 128x256) forces a tile shape, for measuring.
cudaError_t gemm_sm90(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                      const void *bias, int M, int N, int K, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
