// Small device helpers shared by the op kernels: the compute dtype as a template parameter
// (float or __nv_bfloat16) with conversions to and from fp32, 16-byte loads as floats, warp reductions,
// launch sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu_engine.h"  // model.h, made C++-safe

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }

// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// The 16 bytes at p (16-byte aligned) as floats: 4 fp32 or 8 bf16.
__device__ __forceinline__ void unpack16(const float *p, float *f) {
    float4 v = *reinterpret_cast<const float4 *>(p);
    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
}
__device__ __forceinline__ void unpack16(const bf16 *p, float *f) {
    uint4 v = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Blocks for a grid-stride loop over n elements with `threads` per block.
static inline unsigned grid_for(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    if (g > 65536u * 16u) g = 65536u * 16u;
    return (unsigned)(g ? g : 1);
}

// An attribute of the current device, cached (launchers ask at every call); `fallback` when it
// cannot be read.
template <cudaDeviceAttr A> static inline int device_attr(int fallback) {
    static int cached[64];
    static bool known[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return fallback;
    if (!known[dev]) {
        int n = 0;
        cached[dev] = cudaDeviceGetAttribute(&n, A, dev) == cudaSuccess ? n : fallback;
        known[dev] = true;
    }
    return cached[dev];
}

// Whether the current device is compute capability 9.0 exactly: where a build's sm_90a code (wgmma,
// setmaxnreg; arch-specific, so not run by later GPUs) runs.
static inline bool device_is_sm90(void) {
    return device_attr<cudaDevAttrComputeCapabilityMajor>(0) == 9 &&
           device_attr<cudaDevAttrComputeCapabilityMinor>(-1) == 0;
}

// Whether the environment variable `name` is set to "0": the switches that turn a kernel route off
// to compare routes.
static inline bool env_off(const char *name) {
    const char *v = getenv(name);
    return v && v[0] == '0' && v[1] == '\0';
}

// Whether p is 16-byte aligned (vector loads, TMA).
static inline bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// Runs `body` with T bound to the element type of dtype.
#define DISPATCH_DTYPE(dtype, T, ...)    \
    do {                                 \
        if ((dtype) == DTYPE_BF16) {     \
            typedef bf16 T;              \
            __VA_ARGS__;                 \
        } else {                         \
            typedef float T;             \
            __VA_ARGS__;                 \
        }                                \
    } while (0)
