// Unfused LayerNorm and bias + GELU kernels for the benchmark's baseline (unfused_baseline.h).
#include "unfused_baseline.h"

#include <cuda_bf16.h>

namespace {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }

// One warp per row; the row stays in registers between the two passes (K <= 32 * 64).
template <typename T>
__global__ void layernorm_kernel(T *__restrict__ out, const float *__restrict__ x, const float *__restrict__ g,
                                 const float *__restrict__ b, int M, int K) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= M) return;
    const float *xr = x + (size_t)row * K;
    float v[64];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int k = lane + 32 * i;
        v[i] = k < K ? xr[k] : 0.0f;
        s += v[i];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float mean = s / K;
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int k = lane + 32 * i;
        const float d = k < K ? v[i] - mean : 0.0f;
        q += d * d;
    }
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    const float rstd = 1.0f / sqrtf(q / K + 1e-5f);
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int k = lane + 32 * i;
        if (k < K) st(out + (size_t)row * K + k, (v[i] - mean) * rstd * g[k] + b[k]);
    }
}

// Rows on blockIdx.y, columns on x: no division per element.
template <typename T>
__global__ void bias_act_kernel(T *__restrict__ y, const float *__restrict__ b, int M, int N, int act) {
    for (int row = blockIdx.y; row < M; row += gridDim.y) {
        T *yr = y + (size_t)row * N;
        for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
            float v = ld(yr + n) + b[n];
            if (act) v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
            st(yr + n, v);
        }
    }
}

template <typename T>
__global__ void residual_add_kernel(float *__restrict__ res, const T *__restrict__ y, const float *__restrict__ b,
                                    int M, int N) {
    for (int row = blockIdx.y; row < M; row += gridDim.y)
        for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x)
            res[(size_t)row * N + n] += ld(y + (size_t)row * N + n) + b[n];
}

}  // namespace

extern "C" int baseline_layernorm(void *out, const float *x, const float *gamma, const float *beta, int M, int K,
                                  DType dt, cudaStream_t stream) {
    if (K > 32 * 64 || M <= 0) return cudaErrorInvalidValue;
    const int rows_per_block = 8;
    const unsigned grid = (unsigned)((M + rows_per_block - 1) / rows_per_block);
    if (dt == DTYPE_BF16)
        layernorm_kernel<bf16><<<grid, 32 * rows_per_block, 0, stream>>>((bf16 *)out, x, gamma, beta, M, K);
    else
        layernorm_kernel<float><<<grid, 32 * rows_per_block, 0, stream>>>((float *)out, x, gamma, beta, M, K);
    return cudaGetLastError();
}

static dim3 grid2d(int M, int N) {
    return dim3((unsigned)((N + 255) / 256), (unsigned)(M < 65535 ? M : 65535));
}

extern "C" int baseline_bias_act(void *y, const float *b, int M, int N, int act, DType dt, cudaStream_t stream) {
    if (dt == DTYPE_BF16)
        bias_act_kernel<bf16><<<grid2d(M, N), 256, 0, stream>>>((bf16 *)y, b, M, N, act);
    else
        bias_act_kernel<float><<<grid2d(M, N), 256, 0, stream>>>((float *)y, b, M, N, act);
    return cudaGetLastError();
}

extern "C" int baseline_residual_add(float *res, const void *y, const float *b, int M, int N, DType dt,
                                     cudaStream_t stream) {
    if (dt == DTYPE_BF16)
        residual_add_kernel<bf16><<<grid2d(M, N), 256, 0, stream>>>(res, (const bf16 *)y, b, M, N);
    else
        residual_add_kernel<float><<<grid2d(M, N), 256, 0, stream>>>(res, (const float *)y, b, M, N);
    return cudaGetLastError();
}
