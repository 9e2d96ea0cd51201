// A timeline of the kernels inside a decode step, for developers: `make TRACE=1` builds
// build/gpu-trace/gpt2, where thread 0 of every block of every kernel launched through
// kernels/pdl.cuh takes %globaltimer when the block starts, when its pdl_wait() returns (the
// previous kernel has completed) and when it exits, and writes them with %gridid (one per launch; a
// graph's replays reuse it) and %smid into a device buffer as it exits. A kernel may also stamp
// its own phases (trace_mark(TRACE_PHASE + k): gemm_rows's W landed, x landed, MMAs done, epilogue;
// attn_decode1's keys done, streams merged and, in a cluster's block 0, every split's partial in);
// trace_decode.py prints them as a second table. GPT2_TRACE=FILE makes
// the GPU engine allocate the buffer and write it to FILE when the engine is freed;
// scripts/trace_decode.py turns it into per-kernel times. It exists because the tools that time kernels one at a time (ncu) hide what
// programmatic dependent launch changes, and nsys is not available on the machines this was tuned
// on (docs/PERF.md, "Engine decode, session 2"). Without TRACE=1 every call here compiles to nothing.
#pragma once

#include <cuda_runtime.h>

enum { TRACE_START = 0, TRACE_RELEASED = 1, TRACE_EXIT = 2, TRACE_PHASE = 3 };

#ifdef GPT2_TRACE

struct TraceRecord {
    unsigned long long grid_id, time_ns;  // time 0: a slot left empty
    unsigned event, sm, blocks, block;    // event: TRACE_*; block: the block's linear index in its grid
};
// Each SM writes its own region through its own counter, and a block reserves its slots when it
// starts (under PDL, before its release) and fills them when it exits: with one counter for all SMs
// and an atomic at every stamp, ~100 blocks' atomics were serialised at each kernel's release and
// exit, a microsecond of stamps on the step's path.
constexpr unsigned kTraceSMs = 256;       // regions (the most SMs a device may have)
constexpr unsigned kTracePerSM = 1u << 15;  // records a region; later blocks are dropped
constexpr unsigned kTraceEvents = 8;      // slots a block: start, released, exit and up to five phases

// Each translation unit has its own copy of these two (no relocatable device code); the engine sets
// every copy through the binders registered below.
static __device__ TraceRecord *trace_records_;  // [kTraceSMs][kTracePerSM]
static __device__ unsigned *trace_count_;       // [kTraceSMs]

// A block's stamps, in shared memory until it exits.
struct TraceStamps {
    unsigned long long time_ns[kTraceEvents];
    unsigned seen;  // bit e: event e was stamped
};
__device__ __forceinline__ TraceStamps &trace_stamps() {
    __shared__ TraceStamps stamps;  // one per block of every kernel that stamps
    return stamps;
}

__device__ __forceinline__ void trace_mark(unsigned event) {
    if (threadIdx.x != 0 || event >= kTraceEvents) return;
    TraceStamps &st = trace_stamps();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(st.time_ns[event]));
    st.seen |= 1u << event;
}

__device__ __forceinline__ unsigned trace_sm() {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    return sm % kTraceSMs;
}

// kernels/gpu_engine.cu keeps the binders and calls them all when it allocates the buffer.
void trace_register(void (*bind)(TraceRecord *records, unsigned *count));
static void trace_bind_this_unit(TraceRecord *records, unsigned *count) {
    cudaMemcpyToSymbol(trace_records_, &records, sizeof records);
    cudaMemcpyToSymbol(trace_count_, &count, sizeof count);
}
static const int trace_registered_ = (trace_register(trace_bind_this_unit), 0);

// Declared first in a kernel: clears the block's stamps and reserves its slots (the atomic's result
// is needed only at the exit), and on every return path marks the exit and writes the stamps.
struct TraceExit {
    unsigned slot = kTracePerSM;
    __device__ TraceExit() {
        if (threadIdx.x != 0 || !trace_count_) return;
        trace_stamps().seen = 0;
        slot = atomicAdd(&trace_count_[trace_sm()], kTraceEvents);
    }
    __device__ ~TraceExit() {
        trace_mark(TRACE_EXIT);
        if (threadIdx.x != 0 || slot + kTraceEvents > kTracePerSM) return;
        const TraceStamps &st = trace_stamps();
        TraceRecord r;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid_id));
        r.sm = trace_sm();
        r.blocks = gridDim.x * gridDim.y * gridDim.z;
        r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        TraceRecord *out = trace_records_ + (size_t)r.sm * kTracePerSM + slot;
        for (unsigned e = 0; e < kTraceEvents; e++)
            if (st.seen >> e & 1) r.event = e, r.time_ns = st.time_ns[e], *out++ = r;
    }
};
#define TRACE_KERNEL_EXIT const TraceExit trace_exit_

#else

__device__ __forceinline__ void trace_mark(unsigned) {}
// Nothing at all (a kernel's code is the same as without the line).
#define TRACE_KERNEL_EXIT static_assert(true, "")

#endif
