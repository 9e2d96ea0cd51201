// Thread-block clusters (sm_90 on): the cluster barrier in halves, and loads from and stores into
// another block's shared memory (distributed shared memory), shared by the cluster GEMV
// (linear_kernels.cuh), the decode attention's in-cluster merge (fused_attention.cu) and the few-row
// GEMM's split of K (gemm_rows.cu). Callers launch the kernels that use them
// only where the device has clusters (cluster_fits, below); compiled for an older target they trap.
//
// barrier.cluster.wait waits for the cluster's non-exited threads to arrive (PTX ISA), so a block
// may leave without arriving, and a block that has arrived may leave before the others wait.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define CLUSTER_ASM(...) __trap()
#else
#define CLUSTER_ASM(...) asm volatile(__VA_ARGS__)
#endif

// arrive.relaxed does not wait for this thread's loads in flight (a release would: the weights), so
// it can be issued as soon as the block starts, as the "started" half of a barrier whose wait comes
// before the first store into another block. arrive (release) makes this thread's stores, remote
// ones included, visible to whoever waits (acquire) on the same phase.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    CLUSTER_ASM("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { CLUSTER_ASM("barrier.cluster.arrive.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { CLUSTER_ASM("barrier.cluster.wait.aligned;" ::: "memory"); }

// The shared::cluster address of `smem` (this block's shared memory) in block `rank` of the cluster,
// 16- and 4-byte stores there and 4-byte loads from there.
__device__ __forceinline__ uint32_t cluster_map(const void *smem, int rank) {
    uint32_t a = 0;
    CLUSTER_ASM("mapa.shared::cluster.u32 %0, %1, %2;"
                : "=r"(a)
                : "r"((uint32_t)__cvta_generic_to_shared(smem)), "r"(rank));
    return a;
}
__device__ __forceinline__ void st_cluster(uint32_t addr, uint4 v) {
    CLUSTER_ASM("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
                "r"(v.w)
                : "memory");
}
__device__ __forceinline__ void st_cluster(uint32_t addr, float v) {
    CLUSTER_ASM("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

// A 4-, 8- and 16-byte store into another block's shared memory whose bytes complete a transaction
// count on `bar`, an mbarrier in that same block (both shared::cluster addresses): the receiver waits
// on its own barrier (mbar_wait_cluster, tma.cuh) for exactly the bytes it expects, and neither side
// needs a fence or the cluster barrier. Its destination must be another block, not this one.
__device__ __forceinline__ void st_async(uint32_t addr, float v, uint32_t bar) {
    CLUSTER_ASM("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
                "r"(__float_as_uint(v)), "r"(bar)
                : "memory");
}
__device__ __forceinline__ void st_async(uint32_t addr, uint2 v, uint32_t bar) {
    CLUSTER_ASM("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(addr),
                "r"(v.x), "r"(v.y), "r"(bar)
                : "memory");
}
__device__ __forceinline__ void st_async(uint32_t addr, float4 v, uint32_t bar) {
    CLUSTER_ASM("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
                ::"r"(addr), "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
                "r"(__float_as_uint(v.w)), "r"(bar)
                : "memory");
}

// Host side: how many clusters of `blocks` blocks of `kernel` the device holds at once (`threads` a
// block, `smem` bytes of dynamic shared memory each; a cluster's blocks share one GPC), 0 when none
// or the device cannot say. The kernel's attributes (its shared memory, non-portable cluster sizes)
// are set first.
static inline int max_active_clusters(const void *kernel, int blocks, int threads, size_t smem) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = blocks;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) return clusters;
    cudaGetLastError();
    return 0;
}

// True when the device can hold at least one such cluster.
static inline bool cluster_fits(const void *kernel, int blocks, int threads, size_t smem) {
    return max_active_clusters(kernel, blocks, threads, smem) > 0;
}

__device__ __forceinline__ float ld_cluster(uint32_t addr) {
    float v = 0.0f;
    CLUSTER_ASM("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

#undef CLUSTER_ASM
