// Embedding: x[b*T + t] = wte[token] + wpe[pos + t], the fp32 residual stream at the start of the
// forward, and where the op table asks, the first layer's LayerNorm of it into ln (the LayerNorm
// kernel's job otherwise: one kernel and one boundary less a step, docs/PERF.md "Session 29").
// Shared by every op table (it sits before the blocks). One warp per row, as the LayerNorm kernel.
#include <stdint.h>

#include "kernel_util.h"
#include "pdl.cuh"
#include "reference_kernels.h"

// A 16-byte vector of the tables' dtype: 8 bf16 or 4 fp32 values.
template <typename T> constexpr int kVec = 16 / sizeof(T);
constexpr int kLaneValues = 64;  // values a lane holds at most, in kLaneValues / kVec vectors: C <= 2048

template <typename T> __device__ __forceinline__ void store_vec(T *o, const float *f) {
    T v[kVec<T>];
#pragma unroll
    for (int i = 0; i < kVec<T>; i++) v[i] = from_f32<T>(f[i]);
    *reinterpret_cast<uint4 *>(o) = *reinterpret_cast<const uint4 *>(v);
}

// VEC: a lane loads its share of the token's and the position's rows once, as 16-byte vectors,
// and keeps their sum in registers for the LayerNorm's two passes (mean, then the centred sum of
// squares: the LayerNorm kernel's form). As a block a row of 2-byte loads this kernel took 7.6 us
// at 1024 tokens (docs/PERF.md, "Session 40"). Otherwise (a width that is not whole vectors, or
// wider than 2048) strided loops over the row, each pass reading the lane's own stores of x again.
template <typename T, bool LN, bool VEC>
__global__ void embedding_kernel(float *__restrict__ x, T *__restrict__ ln, const float *__restrict__ lnw,
                                 const float *__restrict__ lnb, const int *__restrict__ tokens,
                                 const T *__restrict__ wte, const T *__restrict__ wpe, int rows, int T_, int pos,
                                 const int *__restrict__ pos_device, int *__restrict__ next_pos, int C) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // kernels/pdl.cuh: the first layer's weights start streaming now
    pdl_wait();               // x may still be read by the previous step's last kernel
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (pos_device) pos = *pos_device;  // a decode graph's position, set before each replay
    if (next_pos && row == 0 && lane == 0) *next_pos = pos + T_;
    if (row >= rows) return;
    const T *we = wte + (size_t)tokens[row] * C;
    const T *pe = wpe + (size_t)(pos + row % T_) * C;
    float *out = x + (size_t)row * C;
    T *o = LN ? ln + (size_t)row * C : NULL;
    if constexpr (VEC) {
        // Every load before the first store: a load after a store waits the store out (the compiler
        // may not move it above a store it could alias, nor above the loop's exit between them), a
        // round trip to memory a vector (docs/PERF.md, "Session 65").
        constexpr int V = kVec<T>, NV = kLaneValues / V;
        float v[NV][V], sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int c = (lane + 32 * i) * V;
            if (c >= C) break;
            float e[V];
            unpack16(we + c, v[i]);
            unpack16(pe + c, e);
#pragma unroll
            for (int j = 0; j < V; j++) v[i][j] += e[j], sum += v[i][j];
        }
        T n[LN ? NV : 1][V];  // LN: the LayerNorm's values, stored beside x's
        if constexpr (LN) {
            const float mean = warp_sum(sum) / C;
            float sq = 0.0f;
#pragma unroll
            for (int i = 0; i < NV; i++) {
                if ((lane + 32 * i) * V >= C) break;
#pragma unroll
                for (int j = 0; j < V; j++) sq += (v[i][j] - mean) * (v[i][j] - mean);
            }
            const float rstd = rsqrtf(warp_sum(sq) / C + 1e-5f);
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int c = (lane + 32 * i) * V;
                if (c >= C) break;
                float g[V], b[V];
#pragma unroll
                for (int j = 0; j < V; j += 4) {
                    unpack16(lnw + c + j, g + j);
                    unpack16(lnb + c + j, b + j);
                }
#pragma unroll
                for (int j = 0; j < V; j++) n[i][j] = from_f32<T>((v[i][j] - mean) * rstd * g[j] + b[j]);
            }
        }
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int c = (lane + 32 * i) * V;
            if (c >= C) break;
#pragma unroll
            for (int j = 0; j < V; j += 4) store_vec(out + c + j, v[i] + j);
            if constexpr (LN) *reinterpret_cast<uint4 *>(o + c) = *reinterpret_cast<const uint4 *>(n[i]);
        }
    } else {
        float sum = 0.0f;
        for (int c = lane; c < C; c += 32) {
            out[c] = to_f32(we[c]) + to_f32(pe[c]);
            sum += out[c];
        }
        if constexpr (!LN) return;
        const float mean = warp_sum(sum) / C;
        float sq = 0.0f;
        for (int c = lane; c < C; c += 32) sq += (out[c] - mean) * (out[c] - mean);
        const float rstd = rsqrtf(warp_sum(sq) / C + 1e-5f);
        for (int c = lane; c < C; c += 32) o[c] = from_f32<T>((out[c] - mean) * rstd * lnw[c] + lnb[c]);
    }
}

cudaError_t embedding_forward(float *x, void *ln, const float *ln_w, const float *ln_b, const int *tokens,
                              const void *wte, const void *wpe, int M, int T, int pos, const int *pos_device,
                              int *next_pos, int C, DType dt, cudaStream_t stream) {
    // The LayerNorm kernel's blocks: 2 warps (rows) up to 256 rows, so that a decode step's rows
    // spread over more SMs, 4 above.
    const int threads = M <= 256 ? 64 : 128;
    const unsigned blocks = (unsigned)((M + threads / 32 - 1) / (threads / 32));
    const size_t es = dtype_size(dt);
    const uintptr_t bases = (uintptr_t)x | (uintptr_t)ln | (uintptr_t)ln_w | (uintptr_t)ln_b | (uintptr_t)wte |
                            (uintptr_t)wpe;
    const bool vec = C % (16 / es) == 0 && C <= kLaneValues * 32 && bases % 16 == 0;
    cudaError_t e = cudaSuccess;
    DISPATCH_DTYPE(dt, E, {
        if (ln && vec)
            e = launch_pdl(embedding_kernel<E, true, true>, dim3(blocks), dim3(threads), 0, stream, x, (E *)ln, ln_w,
                           ln_b, tokens, (const E *)wte, (const E *)wpe, M, T, pos, pos_device, next_pos, C);
        else if (ln)
            e = launch_pdl(embedding_kernel<E, true, false>, dim3(blocks), dim3(threads), 0, stream, x, (E *)ln, ln_w,
                           ln_b, tokens, (const E *)wte, (const E *)wpe, M, T, pos, pos_device, next_pos, C);
        else if (vec)
            e = launch_pdl(embedding_kernel<E, false, true>, dim3(blocks), dim3(threads), 0, stream, x, (E *)NULL,
                           ln_w, ln_b, tokens, (const E *)wte, (const E *)wpe, M, T, pos, pos_device, next_pos, C);
        else
            e = launch_pdl(embedding_kernel<E, false, false>, dim3(blocks), dim3(threads), 0, stream, x, (E *)NULL,
                           ln_w, ln_b, tokens, (const E *)wte, (const E *)wpe, M, T, pos, pos_device, next_pos, C);
    });
    return e;
}
