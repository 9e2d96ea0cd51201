// Logits as integer keys whose order is the host sampler's (src/sampler.c): the device sampler
// (sampling.cu) selects over them, and logits_rows.cu takes each row's greedy token with them.
#pragma once

#include <cuda_runtime.h>

// Order-preserving map of a float to uint32: larger float -> larger key. -0 becomes +0 first, so
// equal logits have equal keys (the host compares floats).
__device__ __forceinline__ unsigned float_key(float f) {
    const unsigned u = __float_as_uint(f + 0.0f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_float(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// A candidate's rank key: the logit's key above, the complement of its id below. Larger means
// earlier in (logit desc, id asc), the host's order for equal probabilities (and greedy's first
// maximum), and no two candidates share a rank key, so every selection is exact and ties need no
// separate pass. Zero is below every candidate's.
__device__ __forceinline__ unsigned long long rank_key(unsigned key, int id) {
    return (unsigned long long)key << 32 | (0xffffffffu - (unsigned)id);
}
__device__ __forceinline__ unsigned rank_logit_key(unsigned long long rk) { return (unsigned)(rk >> 32); }
__device__ __forceinline__ int rank_id(unsigned long long rk) { return (int)(0xffffffffu - (unsigned)rk); }
