// Checking every CUDA and cuBLAS call. An engine reports failures as one line in an Error
// ("file.cu:123: cudaMemcpyAsync(...): an illegal memory access was encountered") and returns -1,
// so the program ends cleanly with a message instead of crashing or running on with garbage.
// Device allocation goes through gpu_alloc, which turns out-of-memory into a line that names what
// was being allocated and how much the device had left.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu_engine.h"  // common.h made C++-safe

static inline int cuda_fail(Error *err, cudaError_t e, const char *call, const char *file, int line) {
    cudaGetLastError();  // clear a non-sticky error so the next call does not see it again
    return fail(err, "%s:%d: %s: %s", file, line, call, cudaGetErrorString(e));
}

// A failed launch inside cuBLAS (or inside our own steps around a cuBLASLt call: matmul_lt.h) comes back
// as CUBLAS_STATUS_EXECUTION_FAILED; the CUDA error behind it, where one is still pending, says why.
static inline int cublas_fail(Error *err, cublasStatus_t s, const char *call, const char *file, int line) {
    const cudaError_t e = cudaGetLastError();
    return fail(err, "%s:%d: %s: cuBLAS error %s (%s)%s%s", file, line, call, cublasGetStatusName(s),
                cublasGetStatusString(s), e != cudaSuccess ? ": " : "", e != cudaSuccess ? cudaGetErrorString(e) : "");
}

// In a function returning int (0 ok, -1 failed) that has an `Error *err` in scope.
#define CUDA_TRY(call)                                                                     \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) return cuda_fail(err, e_, #call, __FILE__, __LINE__);       \
    } while (0)

#define CUBLAS_TRY(call)                                                                   \
    do {                                                                                   \
        cublasStatus_t s_ = (call);                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) return cublas_fail(err, s_, #call, __FILE__, __LINE__); \
    } while (0)

// Where no Error can travel (teardown): report on stderr and carry on; never abort.
#define CUDA_WARN(call)                                                                    \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess)                                                             \
            fprintf(stderr, "gpt2: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

// cudaMalloc that names what failed: "CUDA out of memory allocating N MiB for <what> (free M MiB
// of T MiB)". Zero bytes allocate nothing and leave *p NULL.
static inline int gpu_alloc(void **p, size_t bytes, const char *what, Error *err) {
    *p = NULL;
    if (bytes == 0) return 0;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) return 0;
    *p = NULL;
    cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        return fail(err, "CUDA out of memory allocating %.1f MiB for %s (free %.0f MiB of %.0f MiB)",
                    bytes / 1048576.0, what, free_b / 1048576.0, total_b / 1048576.0);
    }
    return fail(err, "cudaMalloc of %.1f MiB for %s: %s", bytes / 1048576.0, what, cudaGetErrorString(e));
}
