// The layout moves around the reference attention. cuBLAS's strided batched products want one
// matrix per (sequence, head) at a fixed stride, so:
//   qkv_to_heads: the qkv product's rows [B*T, 3C] (fp32, bias added) -> q [B, NH, T, HS] (or kept as
//                 rows [B*T, C], the fused attention's layout) and k, v appended to the cache
//                 [B][NH][max_seq][HS] at positions pos..pos+T-1 (dtype);
//   heads_to_rows: P.V's [B, NH, T, HS] (fp32) -> [B*T, C] rows (dtype) for the projection.
#include "kernel_util.h"
#include "reference_kernels.h"

template <typename T>
__global__ void qkv_to_heads_kernel(T *__restrict__ q, T *__restrict__ kc, T *__restrict__ vc,
                                    const float *__restrict__ qkv, int B, int T_, int pos,
                                    const int *__restrict__ pos_device, int NH, int HS, int max_seq, int q_rows) {
    if (pos_device) pos = *pos_device;  // a decode graph's position
    int C = NH * HS;
    size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        size_t row = i / C;
        int t = (int)(row % T_), b = (int)(row / T_);
        int h = c / HS, d = c % HS;
        const float *src = qkv + row * 3 * C;
        size_t bh = (size_t)b * NH + h;
        q[q_rows ? i : (bh * T_ + t) * HS + d] = from_f32<T>(src[c]);
        size_t cache = (bh * max_seq + pos + t) * HS + d;
        kc[cache] = from_f32<T>(src[C + c]);
        vc[cache] = from_f32<T>(src[2 * C + c]);
    }
}

template <typename T>
__global__ void heads_to_rows_kernel(T *__restrict__ out, const float *__restrict__ y, int B, int T_, int NH, int HS) {
    int C = NH * HS;
    size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        size_t row = i / C;
        int t = (int)(row % T_), b = (int)(row / T_);
        int h = c / HS, d = c % HS;
        out[i] = from_f32<T>(y[(((size_t)b * NH + h) * T_ + t) * HS + d]);
    }
}

cudaError_t qkv_to_heads(void *q, void *k_cache, void *v_cache, const float *qkv, int B, int T, int pos,
                         const int *pos_device, int NH, int HS, int max_seq, int q_rows, DType dt,
                         cudaStream_t stream) {
    size_t n = (size_t)B * T * NH * HS;
    DISPATCH_DTYPE(dt, E, qkv_to_heads_kernel<E><<<grid_for(n, 256), 256, 0, stream>>>(
                              (E *)q, (E *)k_cache, (E *)v_cache, qkv, B, T, pos, pos_device, NH, HS, max_seq,
                              q_rows));
    return cudaGetLastError();
}

cudaError_t heads_to_rows(void *out, const float *y, int B, int T, int NH, int HS, DType dt, cudaStream_t stream) {
    size_t n = (size_t)B * T * NH * HS;
    DISPATCH_DTYPE(dt, E, heads_to_rows_kernel<E><<<grid_for(n, 256), 256, 0, stream>>>((E *)out, y, B, T, NH, HS));
    return cudaGetLastError();
}
