// LayerNorm over C channels: (x - mean) / sqrt(var + 1e-5) * w + b, biased variance, as GPT-2.
// fp32 residual in, compute dtype out (it feeds a matrix product). Two passes over the row (mean,
// then the centred sum of squares) rather than mean(x^2) - mean^2: this is the reference, so it
// takes the accurate form. One warp per row.
//
// The fused table's many-row route runs this kernel too (before its cuBLASLt products), so it is
// written for speed where that costs no accuracy: with C % 4 == 0 and C <= 2048 (every GPT-2) each
// lane loads its share of the row once, as 16-byte vectors, into registers, and both passes and the
// output read them there (w and b come in before the wait for x); other widths take a plain strided
// loop. Small row counts get 2-warp blocks so that a decode step's 64 rows spread over 32 SMs, not 8.
#include <stdint.h>

#include "kernel_util.h"
#include "pdl.cuh"
#include "reference_kernels.h"

constexpr int kMaxVec = 16;  // float4s a lane holds at most: C <= 32 * 4 * 16 = 2048

__device__ __forceinline__ void store4(float *o, float a, float b, float c, float d) {
    *reinterpret_cast<float4 *>(o) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(bf16 *o, float a, float b, float c, float d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    uint2 v = {*reinterpret_cast<uint32_t *>(&lo), *reinterpret_cast<uint32_t *>(&hi)};
    *reinterpret_cast<uint2 *>(o) = v;
}

// NV > 0: the row in registers as float4s, at most NV a lane (C % 4 == 0, C <= 128 NV), and this
// lane's share of w and b in registers too, loaded before the wait for x: they are weights, so their
// L2 round trips overlap the previous kernel's tail. Against the kernel before (16 float4s a lane
// whatever C, w and b loaded beside the stores) a 1024-row LayerNorm is ~1.9 us shorter, time to the
// first token at 1024 tokens -6% (docs/PERF.md, "Session 32"; the two changes were not measured
// apart). NV = 0: a strided loop over x for other widths.
template <typename T, int NV>
__global__ void layernorm_kernel(T *__restrict__ out, const float *__restrict__ x, const float *__restrict__ w,
                                 const float *__restrict__ b, int rows, int C) {
    TRACE_KERNEL_EXIT;        // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // kernels/pdl.cuh: a hint only; cuBLASLt's kernels that follow are not PDL'd
    const int warps = blockDim.x / 32;
    const int r = blockIdx.x * warps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if constexpr (NV > 0) {
        const int C4 = C / 4;
        float4 g[NV], be[NV];
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int c4 = lane + 32 * i;
            if (c4 >= C4) break;
            g[i] = reinterpret_cast<const float4 *>(w)[c4];
            be[i] = reinterpret_cast<const float4 *>(b)[c4];
        }
        pdl_wait();  // x comes from the kernel before
        if (r >= rows) return;
        const float *xr = x + (size_t)r * C;
        T *o = out + (size_t)r * C;
        float4 v[NV];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int c4 = lane + 32 * i;
            v[i] = c4 < C4 ? reinterpret_cast<const float4 *>(xr)[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
            sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
        }
        const float mean = warp_sum(sum) / C;
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (lane + 32 * i >= C4) break;
            const float a = v[i].x - mean, bb = v[i].y - mean, c = v[i].z - mean, d = v[i].w - mean;
            sq += (a * a + bb * bb) + (c * c + d * d);
        }
        const float rstd = rsqrtf(warp_sum(sq) / C + 1e-5f);
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int c4 = lane + 32 * i;
            if (c4 >= C4) break;
            store4(o + 4 * c4, (v[i].x - mean) * rstd * g[i].x + be[i].x, (v[i].y - mean) * rstd * g[i].y + be[i].y,
                   (v[i].z - mean) * rstd * g[i].z + be[i].z, (v[i].w - mean) * rstd * g[i].w + be[i].w);
        }
    } else {
        pdl_wait();  // x comes from the kernel before
        if (r >= rows) return;
        const float *xr = x + (size_t)r * C;
        T *o = out + (size_t)r * C;
        float sum = 0.0f;
        for (int c = lane; c < C; c += 32) sum += xr[c];
        const float mean = warp_sum(sum) / C;
        float sq = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float d = xr[c] - mean;
            sq += d * d;
        }
        const float rstd = rsqrtf(warp_sum(sq) / C + 1e-5f);
        for (int c = lane; c < C; c += 32) o[c] = from_f32<T>((xr[c] - mean) * rstd * w[c] + b[c]);
    }
}

cudaError_t layernorm_forward(void *out, const float *x, const float *w, const float *b, int rows, int C,
                              DType dt, cudaStream_t stream) {
    const int threads = rows <= 256 ? 64 : 128, per_block = threads / 32;
    const unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
    // 16-byte loads need every row start (and w, b, out) 16-byte aligned: C % 4 == 0 and aligned bases.
    const bool vec = C % 4 == 0 && C <= 32 * 4 * kMaxVec &&
                     ((uintptr_t)x | (uintptr_t)w | (uintptr_t)b | (uintptr_t)out) % 16 == 0;
    // Launched with PDL: most of the time a cuBLASLt GEMM comes before, which never signals early, but
    // the launch can still overlap that grid's completion (its memory flush) instead of following it:
    // batch-64 decode 124.0k -> 126.2k tokens/s with the prefill attention launched the same way
    // (docs/PERF.md, "Session 6").
    cudaError_t e = cudaSuccess;
    DISPATCH_DTYPE(dt, E, {
        if (vec && C <= 32 * 4 * 8)  // 124M's 768 and 345M's 1024
            e = launch_pdl(layernorm_kernel<E, 8>, dim3(blocks), dim3(threads), 0, stream, (E *)out, x, w, b, rows, C);
        else if (vec)
            e = launch_pdl(layernorm_kernel<E, kMaxVec>, dim3(blocks), dim3(threads), 0, stream, (E *)out, x, w, b,
                           rows, C);
        else
            e = launch_pdl(layernorm_kernel<E, 0>, dim3(blocks), dim3(threads), 0, stream, (E *)out, x, w, b, rows, C);
    });
    return e;
}
