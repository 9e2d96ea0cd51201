// The few PTX wrappers the tensor-core and cp.async kernels share (fused_attention.cu,
// linear_kernels.cuh): asynchronous 16-byte copies into shared memory, ldmatrix, the bf16 m16n8k16
// and tf32 m16n8k8 MMAs with fp32 accumulators, and the store of their accumulator tiles. All of them
// exist from sm_80 on.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

// 16 bytes from global to shared memory, bypassing L1; src_bytes < 16 zero-fills the rest (0: a
// pure zero fill, gmem only has to be a valid address).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 b16 matrices from shared memory (each lane gives one row address), as MMA fragments.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A warp's MI x NI m16n8 fp32 accumulator tiles into a row-major buffer (row stride ld): tile
// (i, j) at rows 16 i.., columns 8 j..; each lane holds two pairs of neighbouring columns, in rows
// lane / 4 and lane / 4 + 8.
template <int MI, int NI>
__device__ __forceinline__ void store_acc(float *dst, int ld, const float (&acc)[MI][NI][4], int lane) {
    const int gid = lane / 4, tig = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < NI; j++)
                *reinterpret_cast<float2 *>(dst + (i * 16 + gid + 8 * h) * ld + j * 8 + 2 * tig) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
}

// x rounded to the nearest tf32 (ties away from zero), as the b32 operand of a tf32 MMA: half an ulp of
// tf32's 10-bit mantissa added to the bits, the 13 low bits cleared. Two integer instructions where
// cvt.rna.tf32.f32 takes four on sm_90, for finite x only: a NaN whose low mantissa bits are all ones
// (CUDA's canonical 0x7fffffff) carries into the sign and becomes -0. Its user (rows_f32_kernel)
// still returns NaN for NaN inputs: a NaN in x reaches the row statistics, one in W or gamma s_n.
__device__ __forceinline__ uint32_t to_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
// x = hi + lo to about 22 bits, both tf32 (the "3xTF32" split: hi * hi + hi * lo + lo * hi carries
// fp32-level error on tensor cores). x - hi is exact in fp32.
__device__ __forceinline__ void split_tf32(float x, uint32_t &hi, uint32_t &lo) {
    hi = to_tf32(x);
    lo = to_tf32(x - __uint_as_float(hi));
}

// d += a (16x8, row) * b (8x8, col), tf32 in, fp32 accumulate.
__device__ __forceinline__ void mma_tf32_1688(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
