// LayerNorm's affine folded into the Linear that follows it (docs/DESIGN.md, fused path):
//   s_n = sum_k W_nk gamma_k,   b'_n = sum_k W_nk beta_k + b_n
// computed once at engine creation from W exactly as the fused kernels read it (bf16-rounded when
// the compute dtype is bf16), accumulated in fp32. One warp per output row n.
#include "kernel_util.h"
#include "reference_kernels.h"

template <typename T>
__global__ void ln_fold_kernel(float *__restrict__ s, float *__restrict__ b2, const T *__restrict__ W,
                               const float *__restrict__ gamma, const float *__restrict__ beta,
                               const float *__restrict__ bias, int N, int K) {
    int warps = blockDim.x / 32;
    int n = blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (n >= N) return;
    const T *w = W + (size_t)n * K;
    float ss = 0.0f, bb = 0.0f;
    for (int k = lane; k < K; k += 32) {
        float v = to_f32(w[k]);
        ss += v * gamma[k];
        bb += v * beta[k];
    }
    ss = warp_sum(ss);
    bb = warp_sum(bb);
    if (lane == 0) {
        s[n] = ss;
        b2[n] = bb + (bias ? bias[n] : 0.0f);
    }
}

cudaError_t ln_fold(float *s, float *b2, const void *W, const float *w, const float *beta, const float *bias, int N,
                    int K, DType dt, cudaStream_t stream) {
    const int threads = 256, per_block = threads / 32;
    unsigned blocks = (unsigned)((N + per_block - 1) / per_block);
    DISPATCH_DTYPE(dt, E, ln_fold_kernel<E><<<blocks, threads, 0, stream>>>(s, b2, (const E *)W, w, beta, bias, N, K));
    return cudaGetLastError();
}
