// Linear + bias + residual add in one kernel: the launcher (what and why: linear_residual.h;
// the kernels: linear_kernels.cuh).
#include "linear_residual.h"

#include "linear_kernels.cuh"

extern "C" int linear_residual_ex(const void *x, const void *W, DType dtype, const float *b, float *residual, int M,
                                  int N, int K, LinearPath path, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || !x || !W || !residual) return cudaErrorInvalidValue;
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16) return cudaErrorInvalidValue;
    if (path < LINEAR_PATH_AUTO || path > LINEAR_PATH_SKINNY) return cudaErrorInvalidValue;  // no ROWS: LN only
    if (M == 0) return cudaSuccess;
    lin::Epilogue e = {};
    e.mode = lin::OUT_RESIDUAL;
    e.residual = residual;
    e.bias = b;
    e.N = N;
    return (int)lin::launch_linear<false>(x, K, nullptr, W, dtype == DTYPE_BF16, M, N, K, e, (int)path, stream);
}

extern "C" int linear_residual(const void *x, const void *W, DType dtype, const float *b, float *residual, int M,
                               int N, int K, cudaStream_t stream) {
    return linear_residual_ex(x, W, dtype, b, residual, M, N, K, LINEAR_PATH_AUTO, stream);
}
