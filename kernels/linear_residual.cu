// Plain linear ops in one kernel each, the bias and the residual add or GELU in the epilogue: the
// launchers (what and why: linear_residual.h; the kernels: linear_kernels.cuh).
#include "linear_residual.h"

#include "linear_kernels.cuh"

namespace {

// The checks and the launch both ops share; e holds the op's output.
int launch_plain(const void *x, const void *W, DType dtype, int M, int N, int K, const lin::Epilogue &e,
                 LinearPath path, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || !x || !W) return cudaErrorInvalidValue;
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16) return cudaErrorInvalidValue;
    if (path < LINEAR_PATH_AUTO || path > LINEAR_PATH_SKINNY) return cudaErrorInvalidValue;
    if (M == 0) return cudaSuccess;
    return (int)lin::launch_linear<false>(x, K, nullptr, W, dtype == DTYPE_BF16, M, N, K, e, (int)path, stream);
}

}  // namespace

extern "C" int linear_residual_ex(const void *x, const void *W, DType dtype, const float *b, float *residual, int M,
                                  int N, int K, LinearPath path, cudaStream_t stream) {
    if (!residual) return cudaErrorInvalidValue;
    lin::Epilogue e = {};
    e.mode = lin::OUT_RESIDUAL;
    e.residual = residual;
    e.bias = b;
    e.N = N;
    return launch_plain(x, W, dtype, M, N, K, e, path, stream);
}

extern "C" int linear_residual(const void *x, const void *W, DType dtype, const float *b, float *residual, int M,
                               int N, int K, cudaStream_t stream) {
    return linear_residual_ex(x, W, dtype, b, residual, M, N, K, LINEAR_PATH_AUTO, stream);
}

extern "C" int linear_bias_act(const void *x, const void *W, DType dtype, const float *b, void *y, long long ldy, int M,
                               int N, int K, Activation act, LinearPath path, cudaStream_t stream) {
    if (!y || ldy < N || (act != ACT_NONE && act != ACT_GELU)) return cudaErrorInvalidValue;
    lin::Epilogue e = {};
    e.mode = lin::OUT_PLAIN;
    e.gelu = act == ACT_GELU;
    e.y_bf16 = dtype == DTYPE_BF16;
    e.y = y;
    e.ldy = ldy;
    e.bias = b;
    e.N = N;
    return launch_plain(x, W, dtype, M, N, K, e, path, stream);
}
