// The GPU side of ./gpt2 bench (kernels/bench_gpu.cu): the device's name, its measured copy
// bandwidth (the memory roofline's denominator), CUDA-event timing of work the host drives through
// the Engine API, and the `bench --kernels` micro-benchmarks of the fused kernels against the
// unfused reference ops at GPT-2's shapes.
#pragma once

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

// Device 0's name ("NVIDIA H200") and memory in GiB. 0, or -1 with err.
int bench_gpu_device(char *name, size_t name_len, double *mem_gib, Error *err);

// A device-to-device cudaMemcpy of `bytes`, timed with CUDA events: one warm-up copy, then the
// median of `runs`. GB/s (1e9) counting bytes read plus bytes written (2 * bytes per copy): what a
// kernel that streams its inputs once can hope for. 0, or -1 with err.
int bench_gpu_copy_bandwidth(size_t bytes, int runs, double *gbps, Error *err);

// CUDA events around work the host drives (Engine.forward, which synchronizes before it returns).
// start synchronizes the device and records the first event on the default stream; stop waits for
// the device again, records the second and gives the milliseconds between the two. Whatever stream
// the engine uses, its work lies between them, and so does the host's launch time, which a user
// waits for too.
typedef struct BenchTimer BenchTimer;
BenchTimer *bench_timer_create(Error *err);
int bench_timer_start(BenchTimer *t, Error *err);
int bench_timer_stop(BenchTimer *t, double *ms, Error *err);
void bench_timer_free(BenchTimer *t);

// One line of `bench --kernels`: a fused kernel against the unfused ops it replaces, on the same
// inputs. Each case is validated (rel_l2 of the fused output against the unfused one) before it
// is timed; a case that fails validation is reported with ok = 0 and not timed (times 0).
typedef struct {
    char op[24];       // "ln_linear_gelu", "linear_residual", "attention"
    char shape[48];    // "M=16 K=768 N=3072", "prefill B=1 T=1024", "decode B=8 L=512"
    DType dtype;
    int M, K, N;       // matmuls (0 for attention)
    int B, T, L;       // attention: batch, new tokens, cache length after them (0 for matmuls)
    double fused_us, unfused_us;  // median per call
    double rel_l2, tol;
    int ok;
    double fused_gbps;    // least bytes the op must move, over the fused time
    double fused_tflops;  // useful FLOPs over the fused time
} BenchKernelRow;

// Runs every case (fewer with quick), printing a progress line per case on stderr. *rows is
// malloc'ed (free it). The fused kernels must be linked in (kernels/fused_ln_linear.h,
// linear_residual.h, fused_attention.h). 0, or -1 with err on a CUDA failure.
int bench_gpu_kernels(int quick, BenchKernelRow **rows, int *nrows, Error *err);

#ifdef __cplusplus
}
#endif
