// Embedding: x[b*T + t] = wte[token] + wpe[pos + t], the fp32 residual stream at the start of the
// forward, and where the op table asks, the first layer's LayerNorm of it into ln (the LayerNorm
// kernel's job otherwise: one kernel and one boundary less a step, docs/PERF.md "Session 29").
// Shared by every op table (it sits before the blocks). One block per row.
#include "kernel_util.h"
#include "pdl.cuh"
#include "reference_kernels.h"

// With the LayerNorm a thread holds its values of the row in registers: EMB_VALUES of them, so a
// block of up to 1024 threads takes C <= 8192 (wider rows: the LayerNorm kernel after this one).
constexpr int EMB_VALUES = 8;
constexpr int EMB_LN_MAX_C = EMB_VALUES * 1024;

// The sum of v over the block, in every thread; red: one float a warp.
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; w++) total += red[w];
    __syncthreads();  // red is used again
    return total;
}

// LN: also ln = (x - mean) / sqrt(var + 1e-5) * lnw + lnb, two passes over the registers (the
// LayerNorm kernel's form: mean, then the centred sum of squares).
template <typename T, bool LN>
__global__ void embedding_kernel(float *__restrict__ x, T *__restrict__ ln, const float *__restrict__ lnw,
                                 const float *__restrict__ lnb, const int *__restrict__ tokens,
                                 const T *__restrict__ wte, const T *__restrict__ wpe, int T_, int pos,
                                 const int *__restrict__ pos_device, int C) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // kernels/pdl.cuh: the first layer's weights start streaming now
    pdl_wait();               // x may still be read by the previous step's last kernel
    if (pos_device) pos = *pos_device;  // a decode graph's position, set before each replay
    const int row = blockIdx.x;
    const int t = row % T_;
    const T *we = wte + (size_t)tokens[row] * C;
    const T *pe = wpe + (size_t)(pos + t) * C;
    float *out = x + (size_t)row * C;
    if constexpr (!LN) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = to_f32(we[c]) + to_f32(pe[c]);
    } else {
        __shared__ float red[32];
        float v[EMB_VALUES], sum = 0.0f;
#pragma unroll
        for (int i = 0; i < EMB_VALUES; i++) {
            const int c = threadIdx.x + i * blockDim.x;
            v[i] = c < C ? to_f32(we[c]) + to_f32(pe[c]) : 0.0f;
            if (c < C) out[c] = v[i];
            sum += v[i];
        }
        const float mean = block_sum(sum, red) / C;
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < EMB_VALUES; i++)
            if (threadIdx.x + i * blockDim.x < C) sq += (v[i] - mean) * (v[i] - mean);
        const float rstd = rsqrtf(block_sum(sq, red) / C + 1e-5f);
        T *o = ln + (size_t)row * C;
#pragma unroll
        for (int i = 0; i < EMB_VALUES; i++) {
            const int c = threadIdx.x + i * blockDim.x;
            if (c < C) o[c] = from_f32<T>((v[i] - mean) * rstd * lnw[c] + lnb[c]);
        }
    }
}

cudaError_t embedding_forward(float *x, void *ln, const float *ln_w, const float *ln_b, const int *tokens,
                              const void *wte, const void *wpe, int M, int T, int pos, const int *pos_device, int C,
                              DType dt, cudaStream_t stream) {
    const int fused_ln = ln && C <= EMB_LN_MAX_C;
    int threads = C >= 256 ? 256 : ((C + 31) / 32) * 32;
    if (fused_ln && C > threads * EMB_VALUES) threads = ((C + EMB_VALUES - 1) / EMB_VALUES + 31) / 32 * 32;
    cudaError_t e = cudaSuccess;
    DISPATCH_DTYPE(dt, E, {
        if (fused_ln)
            e = launch_pdl(embedding_kernel<E, true>, dim3(M), dim3(threads), 0, stream, x, (E *)ln, ln_w, ln_b,
                           tokens, (const E *)wte, (const E *)wpe, T, pos, pos_device, C);
        else
            e = launch_pdl(embedding_kernel<E, false>, dim3(M), dim3(threads), 0, stream, x, (E *)NULL, ln_w, ln_b,
                           tokens, (const E *)wte, (const E *)wpe, T, pos, pos_device, C);
    });
    if (e == cudaSuccess && ln && !fused_ln) e = layernorm_forward(ln, x, ln_w, ln_b, M, C, dt, stream);
    return e;
}
