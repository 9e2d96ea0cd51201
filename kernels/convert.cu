// Storage-type conversion on the device, used at upload: an fp32 checkpoint run as bf16 (round to
// nearest even), a bf16 checkpoint's LayerNorm parameters and biases widened to fp32.
#include "kernel_util.h"
#include "reference_kernels.h"

template <typename D, typename S>
__global__ void convert_kernel(D *__restrict__ dst, const S *__restrict__ src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<D>(to_f32(src[i]));
}

cudaError_t convert_dtype(void *dst, DType dst_t, const void *src, DType src_t, size_t n, cudaStream_t stream) {
    if (dst_t == src_t) return cudaMemcpyAsync(dst, src, n * dtype_size(dst_t), cudaMemcpyDeviceToDevice, stream);
    unsigned g = grid_for(n, 256);
    if (dst_t == DTYPE_BF16) convert_kernel<bf16, float><<<g, 256, 0, stream>>>((bf16 *)dst, (const float *)src, n);
    else convert_kernel<float, bf16><<<g, 256, 0, stream>>>((float *)dst, (const bf16 *)src, n);
    return cudaGetLastError();
}
