// Each sequence's last row moved to the front, in place: x[b] = x[b*T + T-1] and atty[b] =
// atty[b*T + T-1] for b < B. A prompt's forward wants only those rows' logits, so after the last
// layer's attention (every position's keys and values are in the cache by then, and nothing reads
// the other rows again) the engine's loop runs the rest of that layer as a one-token step on them
// (gpu_engine.cu, enqueue_model). Shared by every op table, as the embedding is.
//
// In place without a race: thread c owns column c of every row and moves rows in increasing b.
// Row b's source b*T + T-1 is past b (T > 1) and past every row written before it, so no source is
// overwritten before it is read; the loads of a group of rows go out together before its stores.
#include "kernel_util.h"
#include "pdl.cuh"
#include "reference_kernels.h"

constexpr int GROUP = 8;  // rows whose loads are in flight at once

template <typename E>
__global__ void last_rows_kernel(float *__restrict__ x, E *__restrict__ atty, int B, int T, int C) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // the next product's weights start streaming now
    pdl_wait();               // atty and x are the attention's and the previous layer's output
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int b0 = 0; b0 < B; b0 += GROUP) {
        float xv[GROUP];
        E av[GROUP];
#pragma unroll
        for (int i = 0; i < GROUP; i++) {
            const size_t src = ((size_t)(b0 + i) * T + T - 1) * C + c;
            if (b0 + i < B) xv[i] = x[src], av[i] = atty[src];
        }
#pragma unroll
        for (int i = 0; i < GROUP; i++) {
            const size_t dst = (size_t)(b0 + i) * C + c;
            if (b0 + i < B) x[dst] = xv[i], atty[dst] = av[i];
        }
    }
}

cudaError_t last_rows_to_front(float *x, void *atty, int B, int T, int C, DType dt, cudaStream_t stream) {
    if (B < 1 || T < 2 || C < 1) return cudaErrorInvalidValue;
    const int threads = 128;
    DISPATCH_DTYPE(dt, E, return launch_pdl(last_rows_kernel<E>, dim3((C + threads - 1) / threads), dim3(threads), 0,
                                            stream, x, (E *)atty, B, T, C));
}
