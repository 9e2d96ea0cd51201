// LayerNorm over C channels: (x - mean) / sqrt(var + 1e-5) * w + b, biased variance, as GPT-2.
// fp32 residual in, compute dtype out (it feeds a matrix product). Two passes over the row (mean,
// then the centred sum of squares) rather than mean(x^2) - mean^2: this is the reference, so it
// takes the accurate form. One warp per row; in_stride/in_offset select which rows of x to read,
// so the logits can normalise only each sequence's last token without a gather.
#include "kernel_util.h"
#include "reference_kernels.h"

template <typename T>
__global__ void layernorm_kernel(T *__restrict__ out, const float *__restrict__ x, const float *__restrict__ w,
                                 const float *__restrict__ b, int rows, int C, int in_stride, int in_offset) {
    int warps = blockDim.x / 32;
    int r = blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float *xr = x + ((size_t)r * in_stride + in_offset) * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += xr[c];
    float mean = warp_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = xr[c] - mean;
        sq += d * d;
    }
    float rstd = rsqrtf(warp_sum(sq) / C + 1e-5f);
    T *o = out + (size_t)r * C;
    for (int c = lane; c < C; c += 32) o[c] = from_f32<T>((xr[c] - mean) * rstd * w[c] + b[c]);
}

cudaError_t layernorm_forward(void *out, const float *x, const float *w, const float *b, int rows, int C,
                              int in_stride, int in_offset, DType dt, cudaStream_t stream) {
    const int threads = 256, per_block = threads / 32;
    unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
    DISPATCH_DTYPE(dt, E, layernorm_kernel<E><<<blocks, threads, 0, stream>>>((E *)out, x, w, b, rows, C, in_stride,
                                                                                 in_offset));
    return cudaGetLastError();
}
