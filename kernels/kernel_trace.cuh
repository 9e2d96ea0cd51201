// A timeline of the kernels inside a decode step, for developers: `make TRACE=1` builds
// build/gpu-trace/gpt2, where thread 0 of every block of every kernel launched through
// kernels/pdl.cuh writes %globaltimer when the block starts, when its pdl_wait() returns (the
// previous kernel has completed) and when it exits, with %gridid (one per launch; a graph's replays
// reuse it) and %smid, into a device buffer. GPT2_TRACE=FILE makes the GPU engine allocate the
// buffer and write it to FILE when the engine is freed; scripts/trace_decode.py turns it into
// per-kernel times. It exists because the tools that time kernels one at a time (ncu) hide what
// programmatic dependent launch changes, and nsys is not available on the machines this was tuned
// on (docs/PERF.md, "Engine decode, session 2"). Without TRACE=1 every call here compiles to nothing.
#pragma once

#include <cuda_runtime.h>

enum { TRACE_START = 0, TRACE_RELEASED = 1, TRACE_EXIT = 2 };

#ifdef GPT2_TRACE

struct TraceRecord {
    unsigned long long grid_id, time_ns;
    unsigned event, sm, blocks, threads;  // event: TRACE_*
};
constexpr unsigned kTraceCapacity = 1u << 21;  // records; later ones are dropped

// Each translation unit has its own copy of these two (no relocatable device code); the engine sets
// every copy through the binders registered below.
static __device__ TraceRecord *trace_records_;
static __device__ unsigned *trace_count_;

__device__ __forceinline__ void trace_mark(unsigned event) {
    if (threadIdx.x != 0 || !trace_count_) return;
    const unsigned i = atomicAdd(trace_count_, 1u);
    if (i >= kTraceCapacity) return;
    TraceRecord r;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(r.time_ns));
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid_id));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r.sm));
    r.event = event;
    r.blocks = gridDim.x * gridDim.y * gridDim.z;
    r.threads = blockDim.x;
    trace_records_[i] = r;
}

// kernels/gpu_engine.cu keeps the binders and calls them all when it allocates the buffer.
void trace_register(void (*bind)(TraceRecord *records, unsigned *count));
static void trace_bind_this_unit(TraceRecord *records, unsigned *count) {
    cudaMemcpyToSymbol(trace_records_, &records, sizeof records);
    cudaMemcpyToSymbol(trace_count_, &count, sizeof count);
}
static const int trace_registered_ = (trace_register(trace_bind_this_unit), 0);

// Declared first in a kernel, marks its exit on every return path.
struct TraceExit {
    __device__ TraceExit() {}
    __device__ ~TraceExit() { trace_mark(TRACE_EXIT); }
};
#define TRACE_KERNEL_EXIT const TraceExit trace_exit_

#else

__device__ __forceinline__ void trace_mark(unsigned) {}
// Nothing at all (a kernel's code is the same as without the line).
#define TRACE_KERNEL_EXIT static_assert(true, "")

#endif
