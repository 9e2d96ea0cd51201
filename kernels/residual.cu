// Residual add: x[M, N] += y[M, N] + b[N], fp32. y is a projection's cuBLAS output and b its bias:
// the residual stream stays fp32 in every dtype (docs/DESIGN.md).
#include "kernel_util.h"
#include "reference_kernels.h"

__global__ void residual_add_bias_kernel(float *__restrict__ x, const float *__restrict__ y,
                                         const float *__restrict__ b, size_t n, int N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i] + b[i % N];
}

cudaError_t residual_add_bias(float *x, const float *y, const float *b, int M, int N, cudaStream_t stream) {
    size_t n = (size_t)M * N;
    residual_add_bias_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, y, b, n, N);
    return cudaGetLastError();
}
