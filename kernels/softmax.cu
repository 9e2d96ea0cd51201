// Scale + causal mask + softmax over the attention scores. Row (b, h, t) holds q.k for the query at
// position pos + t against keys 0..Tk-1 (Tk = pos + T); keys after pos + t are masked (probability
// exactly 0, written, since the P.V product reads the whole row). softmax(scale * s) is taken as
// exp(scale * (s - max)) / sum, the max over the unmasked keys. One warp per row, fp32 throughout;
// the probabilities are stored in the compute dtype (P.V's operand). In place when fp32: each
// element is read and written by the same thread.
#include "kernel_util.h"
#include "reference_kernels.h"

template <typename T>
__global__ void softmax_causal_kernel(T *probs, const float *att, int rows, int T_, int Tk, int pos, float scale) {
    int warps = blockDim.x / 32;
    int r = blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    int t = r % T_;
    int valid = pos + t + 1;  // keys 0..pos+t
    const float *s = att + (size_t)r * Tk;
    T *p = probs + (size_t)r * Tk;
    float mx = -INFINITY;
    for (int j = lane; j < valid; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < valid; j += 32) sum += expf(scale * (s[j] - mx));
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < Tk; j += 32) p[j] = from_f32<T>(j < valid ? expf(scale * (s[j] - mx)) * inv : 0.0f);
}

cudaError_t softmax_causal(void *probs, const float *att, int BNH, int T, int Tk, int pos, float scale, DType dt,
                           cudaStream_t stream) {
    int rows = BNH * T;
    const int threads = 256, per_block = threads / 32;
    unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
    DISPATCH_DTYPE(dt, E, softmax_causal_kernel<E><<<blocks, threads, 0, stream>>>((E *)probs, att, rows, T, Tk, pos,
                                                                                      scale));
    return cudaGetLastError();
}
