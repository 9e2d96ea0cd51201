// Programmatic dependent launch (PDL, sm_90 and later): overlapping a kernel's start with the end of
// the kernel before it on the same stream.
//
// A decode step is ~60 small kernels in a row (docs/PERF.md, "Engine decode"). Launched plainly,
// each one starts only after the previous grid has drained and its memory is flushed, and then
// waits a full DRAM latency for its first weights: a few microseconds per boundary, more than the
// whole step's weight traffic (~59 us for GPT-2 124M in bf16 on an H200). With PDL the next grid
// is launched as soon as every block of the current one has called pdl_launch_dependents(); its
// blocks can issue loads of data no earlier kernel writes (the weights) and must then call
// pdl_wait(), which returns once the previous grid has completed and its writes are visible.
//
// The contract every kernel launched with launch_pdl() keeps:
//   - before pdl_wait(): read only what no kernel of the step writes (weights, folded LayerNorm
//     vectors, biases, and a decode graph's position, which the copy at the head of the graph
//     wrote before the step's first kernel could start); write nothing to global memory;
//   - every block calls pdl_wait() on every path, even one with no work, so that a grid completes
//     only after its predecessor has: the chain of waits then orders each kernel after all earlier
//     ones, not only after its immediate predecessor.
// pdl_launch_dependents() is only a hint that lets the next grid be scheduled; it never lets the
// next grid read this one's output early. Kernels call it first thing: one wave of blocks each,
// so the next grid's blocks fill whatever room is left on each SM.
//
// On devices before sm_90 (and where GPT2_PDL=0 is set, to measure what PDL is worth) launch_pdl()
// is a plain launch and the two device calls compile to nothing or return at once.
#pragma once

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_trace.cuh"

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    trace_mark(TRACE_RELEASED);
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    trace_mark(TRACE_START);
}

// How the current device's launches go, read once per device (every launch asks):
//   pdl       1 where the device has PDL (compute capability 9.0 or later) and GPT2_PDL is not "0";
//   carveout  the preferred L1/shared split of the kernels that name none (launch_pdl_ex's
//             carveout < 0), in percent of the most shared memory an SM can have, or -1 for the
//             driver's choice.
// An SM changes its split only when it is idle, which in a chain of PDL launches it seldom is, so
// with the driver's choice (the least shared memory each kernel's own blocks need) a block that
// needs more than the split an SM happens to have waits for that SM to drain: a cluster's blocks
// that must all find room in one GPC, the decode attention's small blocks beside a product's 145 KB
// (how many of those should fit there is a separate question: kDecodeHold in fused_attention.cu).
// So on Hopper one split for all of them, 70: room for a product's block and a few small blocks
// beside it, and L1 left for the decode attention, whose loads of the cache stream more slowly with
// less (with the most shared memory, 28 KB of L1, it lost 9-11% at depth even with loads that do
// not allocate in L1). On an H200 at the bench's depth (16 tokens) decode B = 8 +5.5%, B = 64
// +0.9%, B = 1 +0.5%; after 512 tokens B = 1 +3.5%, B = 8 -1.5%, B = 64 even. The most shared
// memory (100) gained as much at depth 16 but lost 9-11% at B = 8 and 64 after 512 tokens
// (docs/PERF.md, "Session 45"). Elsewhere, where it was not measured, the driver's choice.
// GPT2_CARVEOUT=N sets N (-1: the driver's choice), to compare.
typedef struct {
    int pdl, carveout;
} PdlSettings;

static inline PdlSettings pdl_settings() {
    static PdlSettings cache[16];
    static bool known[16];
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return PdlSettings{0, -1};
    if (dev < 16 && known[dev]) return cache[dev];
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) major = 0;
    const char *pdl = getenv("GPT2_PDL"), *carveout = getenv("GPT2_CARVEOUT");
    PdlSettings s = {major >= 9 && !(pdl && strcmp(pdl, "0") == 0), major == 9 ? 70 : -1};
    if (carveout && *carveout) {
        const int n = atoi(carveout);
        s.carveout = n < 0 ? -1 : n > 100 ? 100 : n;
    }
    if (dev < 16) cache[dev] = s, known[dev] = true;
    return s;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialisation allowed,
// so that the kernel may start while the previous kernel on the stream finishes, in clusters of
// `cluster` blocks along x when cluster > 1 (sm_90), with the preferred shared-memory carveout
// `carveout` (percent of the SM's shared memory; PDL_CARVEOUT_DRIVER: the driver's choice; any other
// value below 0: pdl_settings()'s). Toolkits whose launches have no such attribute leave the driver's
// choice. Returns the launch's error.
enum { PDL_CARVEOUT_DRIVER = -2 };
template <typename... Params, typename... Args>
static inline cudaError_t launch_pdl_ex(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                                        int carveout, cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attr[3];
    unsigned n = 0;
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    const PdlSettings settings = pdl_settings();
    attr[n++].val.programmaticStreamSerializationAllowed = settings.pdl;
    if (carveout < 0) carveout = carveout == PDL_CARVEOUT_DRIVER ? -1 : settings.carveout;
    if (cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
#ifdef cudaKernelNodeAttributePreferredSharedMemoryCarveout  // defined (an alias) where the attribute exists
    if (carveout >= 0) {
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n++].val.sharedMemCarveout = (unsigned)carveout;
    }
#else
    (void)carveout;
#endif
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
static inline cudaError_t launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                             unsigned cluster, cudaStream_t stream, Args... args) {
    return launch_pdl_ex(kernel, grid, block, smem, cluster, -1, stream, args...);
}

template <typename... Params, typename... Args>
static inline cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, Args... args) {
    return launch_pdl_ex(kernel, grid, block, smem, 1, -1, stream, args...);
}
