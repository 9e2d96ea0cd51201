// Bias: y[M, N] += b[N], fp32 in place, after a cuBLAS product (which has no bias of its own in the
// reference path). Kept apart from the activation so each reference kernel is one op.
#include "kernel_util.h"
#include "reference_kernels.h"

__global__ void bias_add_kernel(float *__restrict__ y, const float *__restrict__ b, size_t n, int N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % N];
}

cudaError_t bias_add(float *y, const float *b, int M, int N, cudaStream_t stream) {
    size_t n = (size_t)M * N;
    bias_add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, b, n, N);
    return cudaGetLastError();
}
