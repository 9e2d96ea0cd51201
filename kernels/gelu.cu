// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// fp32 in (the fc product with its bias), compute dtype out (it feeds the fcproj product).
#include "kernel_util.h"
#include "reference_kernels.h"

template <typename T>
__global__ void gelu_kernel(T *__restrict__ out, const float *__restrict__ y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(gelu_tanh(y[i]));
}

cudaError_t gelu_forward(void *out, const float *y, size_t n, DType dt, cudaStream_t stream) {
    DISPATCH_DTYPE(dt, E, gelu_kernel<E><<<grid_for(n, 256), 256, 0, stream>>>((E *)out, y, n));
    return cudaGetLastError();
}
