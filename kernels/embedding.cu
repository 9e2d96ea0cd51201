// Embedding: x[b*T + t] = wte[token] + wpe[pos + t], the fp32 residual stream at the start of the
// forward. Shared by every op table (it sits before the blocks). One block per row.
#include "kernel_util.h"
#include "pdl.cuh"
#include "reference_kernels.h"

template <typename T>
__global__ void embedding_kernel(float *__restrict__ x, const int *__restrict__ tokens, const T *__restrict__ wte,
                                 const T *__restrict__ wpe, int T_, int pos, const int *__restrict__ pos_device,
                                 int C) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // kernels/pdl.cuh: the first layer's weights start streaming now
    pdl_wait();               // x may still be read by the previous step's last kernel
    if (pos_device) pos = *pos_device;  // a decode graph's position, set before each replay
    int row = blockIdx.x;
    int t = row % T_;
    const T *we = wte + (size_t)tokens[row] * C;
    const T *pe = wpe + (size_t)(pos + t) * C;
    float *out = x + (size_t)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = to_f32(we[c]) + to_f32(pe[c]);
}

cudaError_t embedding_forward(float *x, const int *tokens, const void *wte, const void *wpe, int M, int T, int pos,
                              const int *pos_device, int C, DType dt, cudaStream_t stream) {
    int threads = C >= 256 ? 256 : ((C + 31) / 32) * 32;
    DISPATCH_DTYPE(dt, E, return launch_pdl(embedding_kernel<E>, dim3(M), dim3(threads), 0, stream, x, tokens,
                                            (const E *)wte, (const E *)wpe, T, pos, pos_device, C));
}
