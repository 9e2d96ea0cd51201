// The layout moves around the reference attention. cuBLAS's strided batched products want one
// matrix per (sequence, head) at a fixed stride, so:
//   qkv_to_heads: the qkv product's rows [B*T, 3C] (fp32, bias added) -> q [B, NH, T, HS] and k, v
//                 appended to the cache [B][NH][max_seq][HS] at positions pos..pos+T-1 (dtype);
//   heads_to_rows: P.V's [B, NH, T, HS] (fp32) -> [B*T, C] rows (dtype) for the projection;
//   qkv_split:     the fused table's many-row route: the qkv product already in the compute dtype
//                  (bias added in cuBLASLt's epilogue) -> q rows [B*T, C] and k, v into the cache.
//                  A pure copy, so it moves raw 16-byte units where the head size allows.
#include <stdint.h>

#include "kernel_util.h"
#include "reference_kernels.h"

// Element i of rows [B*T, NH*HS] (heads side by side): its row b*T + t, column c = h*HS + d.
struct RowHead {
    size_t row;
    int t, b, c, h, d;
};
__device__ __forceinline__ RowHead row_head(size_t i, int T_, int NH, int HS) {
    RowHead r;
    const int C = NH * HS;
    r.c = (int)(i % C);
    r.row = i / C;
    r.t = (int)(r.row % T_), r.b = (int)(r.row / T_);
    r.h = r.c / HS, r.d = r.c % HS;
    return r;
}

template <typename T>
__global__ void qkv_to_heads_kernel(T *__restrict__ q, T *__restrict__ kc, T *__restrict__ vc,
                                    const float *__restrict__ qkv, int B, int T_, int pos, int NH, int HS,
                                    int max_seq) {
    const int C = NH * HS;
    const size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const RowHead r = row_head(i, T_, NH, HS);
        const float *src = qkv + r.row * 3 * C;
        const size_t bh = (size_t)r.b * NH + r.h;
        q[(bh * T_ + r.t) * HS + r.d] = from_f32<T>(src[r.c]);
        const size_t cache = (bh * max_seq + pos + r.t) * HS + r.d;
        kc[cache] = from_f32<T>(src[C + r.c]);
        vc[cache] = from_f32<T>(src[2 * C + r.c]);
    }
}

template <typename T>
__global__ void heads_to_rows_kernel(T *__restrict__ out, const float *__restrict__ y, int B, int T_, int NH, int HS) {
    const size_t n = (size_t)B * T_ * NH * HS;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const RowHead r = row_head(i, T_, NH, HS);
        out[i] = from_f32<T>(y[(((size_t)r.b * NH + r.h) * T_ + r.t) * HS + r.d]);
    }
}

cudaError_t qkv_to_heads(void *q, void *k_cache, void *v_cache, const float *qkv, int B, int T, int pos, int NH,
                         int HS, int max_seq, DType dt, cudaStream_t stream) {
    size_t n = (size_t)B * T * NH * HS;
    DISPATCH_DTYPE(dt, E, qkv_to_heads_kernel<E><<<grid_for(n, 256), 256, 0, stream>>>(
                              (E *)q, (E *)k_cache, (E *)v_cache, qkv, B, T, pos, NH, HS, max_seq));
    return cudaGetLastError();
}

cudaError_t heads_to_rows(void *out, const float *y, int B, int T, int NH, int HS, DType dt, cudaStream_t stream) {
    size_t n = (size_t)B * T * NH * HS;
    DISPATCH_DTYPE(dt, E, heads_to_rows_kernel<E><<<grid_for(n, 256), 256, 0, stream>>>((E *)out, y, B, T, NH, HS));
    return cudaGetLastError();
}

// U: the unit moved (uint4: 16 bytes of any dtype; else one element as raw bits). Sizes in units.
template <typename U>
__global__ void qkv_split_kernel(U *__restrict__ q, U *__restrict__ kc, U *__restrict__ vc, const U *__restrict__ qkv,
                                 int B, int T_, int pos, const int *__restrict__ pos_device, int NH, int HSu,
                                 int max_seq) {
    if (pos_device) pos = *pos_device;  // a decode graph's position
    const int Cu = NH * HSu;
    const size_t n = (size_t)B * T_ * Cu;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const RowHead r = row_head(i, T_, NH, HSu);
        const U *src = qkv + r.row * 3 * Cu;
        q[i] = src[r.c];
        const size_t cache = (((size_t)r.b * NH + r.h) * max_seq + pos + r.t) * HSu + r.d;
        kc[cache] = src[Cu + r.c];
        vc[cache] = src[2 * Cu + r.c];
    }
}

cudaError_t qkv_split(void *q, void *k_cache, void *v_cache, const void *qkv, int B, int T, int pos,
                      const int *pos_device, int NH, int HS, int max_seq, DType dt, cudaStream_t stream) {
    const size_t es = dtype_size(dt), q_bytes = (size_t)B * T * NH * HS * es;
    const bool wide = (HS * es) % 16 == 0 &&
                      ((uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache | (uintptr_t)qkv) % 16 == 0;
    if (wide)
        qkv_split_kernel<uint4><<<grid_for(q_bytes / 16, 256), 256, 0, stream>>>(
            (uint4 *)q, (uint4 *)k_cache, (uint4 *)v_cache, (const uint4 *)qkv, B, T, pos, pos_device, NH,
            (int)(HS * es / 16), max_seq);
    else if (es == 4)
        qkv_split_kernel<uint32_t><<<grid_for(q_bytes / 4, 256), 256, 0, stream>>>(
            (uint32_t *)q, (uint32_t *)k_cache, (uint32_t *)v_cache, (const uint32_t *)qkv, B, T, pos, pos_device,
            NH, HS, max_seq);
    else
        qkv_split_kernel<uint16_t><<<grid_for(q_bytes / 2, 256), 256, 0, stream>>>(
            (uint16_t *)q, (uint16_t *)k_cache, (uint16_t *)v_cache, (const uint16_t *)qkv, B, T, pos, pos_device,
            NH, HS, max_seq);
    return cudaGetLastError();
}
