// Hopper's bulk copies (TMA) and the shared-memory barriers that count their bytes (sm_90a): what
// the few-row products (gemm_rows.cu, logits_rows.cu) and the wgmma prefill attention
// (fused_attention.cu) load their tiles with. A tile lands in shared memory under the 128-byte
// swizzle that wgmma's descriptors read (wgmma.cuh), and its bytes complete a phase of an mbarrier
// that the consumers wait on.
//
// Compiled for any other target the bulk copies trap: callers launch the kernels that use them
// only on compute capability 9.0 from a build that has sm_90a code (GPT2_SM90A). The mbarriers are
// sm_90's, not sm_90a's, so they also serve kernels that run from the PTX on later devices (the
// decode attention's cluster merge); before sm_90 they trap.
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernel_util.h"  // device_is_sm90

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_ASM(...) __trap()
#else
#define SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif

// ----------------------------------------------------------------------------
// mbarriers

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MBAR_ASM(...) __trap()
#else
#define MBAR_ASM(...) asm volatile(__VA_ARGS__)
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, int arrivals) {
    MBAR_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA's completions) and to the cluster.
__device__ __forceinline__ void mbar_fence_init() { MBAR_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// This thread's arrival, announcing `bytes` of TMA traffic the phase must also wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    MBAR_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// This thread's arrival (release: its earlier shared-memory reads and writes are done before the phase
// completes).
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    MBAR_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Returns once the barrier's phase of this parity has completed (phases alternate 0, 1, 0, ...).
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        MBAR_ASM("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
    } while (!done);
}
// The same, acquiring at cluster scope: for a phase completed by other blocks' st_async (cluster.cuh).
__device__ __forceinline__ void mbar_wait_cluster(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        MBAR_ASM("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
    } while (!done);
}

// ----------------------------------------------------------------------------
// Bulk tensor copies

// The box of `map` at (k, row) into shared memory; its bytes count against `bar`.
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int k, int row, uint64_t *bar) {
    SM90_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
                 "r"(smem_addr(dst)),
             "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar))
             : "memory");
}
// The box of a slice map (tensor_map_slices) at slice `slice`, row `row`: its slices one after another.
__device__ __forceinline__ void tma_load_slices(void *dst, const CUtensorMap *map, int slice, int row, uint64_t *bar) {
    SM90_ASM("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
             " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
             "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(row), "r"(slice), "r"(smem_addr(bar))
             : "memory");
}
// The box of a 4-D map (tensor_map_rows4) at coordinates (0, c1, c2, c3).
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *map, int c1, int c2, int c3, uint64_t *bar) {
    SM90_ASM("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
             " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
             "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
             : "memory");
}
// Shared memory at src into the box of a 4-D map at (0, c1, c2, c3) (entries past a dim are not
// written), as one bulk group; src must not change until tma_store_wait_read() has returned.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap *map, const void *src, int c1, int c2, int c3) {
    SM90_ASM("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
             "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
             "r"(0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(src))
             : "memory");
}
// Returns once this thread's bulk stores have read their shared memory (their global writes may still
// be in flight; the grid's completion makes them visible).
__device__ __forceinline__ void tma_store_wait_read() {
    SM90_ASM("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    SM90_ASM("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

#undef SM90_ASM
#undef MBAR_ASM

// ----------------------------------------------------------------------------
// Tensor maps (host)

// cuTensorMapEncodeTiled from the driver through the runtime (no -lcuda); NULL when unavailable.
static inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static bool tried;
    if (!tried) {
        tried = true;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        cudaGetLastError();
    }
    return fn;
}

// Whether the kernels built on TMA and wgmma run here: a build with sm_90a code (GPT2_SM90A, set by the
// Makefile from CUDA_ARCH), a compute capability 9.0 device and the driver's cuTensorMapEncodeTiled.
static inline bool tma_wgmma_runs() {
#if GPT2_SM90A
    return device_is_sm90() && encode_tiled() != NULL;
#else
    return false;
#endif
}

// Every map here: bf16, 64-element (128-byte) rows under the 128-byte swizzle that wgmma reads, a
// tensor of `rank` dims (dims[0] = the 64 columns) with strides[i - 1] bytes along dim i, boxes of
// box[i] entries, entries past a dim read as zeros (and not written by stores).
static inline bool encode_sw128(CUtensorMap *map, const void *p, cuuint32_t rank, const cuuint64_t *dims,
                                const cuuint64_t *strides, const cuuint32_t *box) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    return encode && rank <= 5 &&
           encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void *>(p), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A bf16 [rows, K] matrix, rows ld elements apart, read in boxes of box_rows x 64 under the 128-byte
// swizzle (rows and k past the end read as zeros). ld * 2 must be a multiple of 16.
static inline bool tensor_map(CUtensorMap *map, const void *p, int rows, int K, long long ld, int box_rows) {
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    return encode_sw128(map, p, 2, dims, strides, box);
}

// The same matrix, K a multiple of 64, as K / 64 slices of 64 columns: one box holds box_slices
// slices of box_rows rows, slice after slice (each box_rows x 128 bytes, swizzled as tensor_map's
// boxes), so one copy brings what would take box_slices of tensor_map's. The copy engine takes
// ~55 cycles to issue a box and ~40 more to serve it: x's 12 slices after the wait landed in ~0.62
// us as 12 boxes and ~0.39-0.45 us as one (docs/PERF.md, "Session 25"). Slices past K/64 and rows
// past `rows` read as zeros.
static inline bool tensor_map_slices(CUtensorMap *map, const void *p, int rows, int K, long long ld, int box_rows,
                                     int box_slices) {
    const cuuint64_t dims[3] = {64, (cuuint64_t)rows, (cuuint64_t)(K / 64)}, strides[2] = {(cuuint64_t)ld * 2, 128};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, (cuuint32_t)box_slices};
    return K % 64 == 0 && box_slices >= 1 && box_slices <= 256 && encode_sw128(map, p, 3, dims, strides, box);
}

// A bf16 tensor of 64-element rows indexed (column, i1, i2, i3): dims[j] entries along i(j+1), ld[j]
// elements apart (increasing with j, ld[j] * 2 a multiple of 16), read in boxes of 64 columns x
// box[0] x box[1] x box[2] under the 128-byte swizzle, entries past a dim read as zeros. The
// attention's K and V tiles: 64 rows of one head's keys, whichever index runs along the keys.
static inline bool tensor_map_rows4(CUtensorMap *map, const void *p, const long long (&dims)[3],
                                    const long long (&ld)[3], const int (&box)[3]) {
    const cuuint64_t gdims[4] = {64, (cuuint64_t)dims[0], (cuuint64_t)dims[1], (cuuint64_t)dims[2]};
    const cuuint64_t strides[3] = {(cuuint64_t)ld[0] * 2, (cuuint64_t)ld[1] * 2, (cuuint64_t)ld[2] * 2};
    const cuuint32_t gbox[4] = {64, (cuuint32_t)box[0], (cuuint32_t)box[1], (cuuint32_t)box[2]};
    return encode_sw128(map, p, 4, gdims, strides, gbox);
}
