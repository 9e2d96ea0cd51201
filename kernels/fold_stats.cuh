// A folded LayerNorm's row statistics (gemm_rows.h, logits_rows.h): the product before it wrote
// each row's (mean, M2) over `slices` equal slices of the row's K columns (M2: the sum of squared
// deviations from the slice's mean) and the row's shift; the product after it needs each row's
// (mean - shift, rstd). Exact two-level statistics (Chan et al.): the mean of the slices' means,
// then M2 = sum M2_j + width sum (mean_j - mean)^2, so a row whose mean is large against its spread
// keeps its variance.
//
// G = THREADS / RB adjacent threads merge a row of the block's RB rows. A thread loads its share of
// the row's pairs right after the wait, all in flight at once (fold_load), and merges them once the
// block's MMAs are issued (fold_finish): loaded and merged before the MMAs, a few pairs at a time,
// they cost qkv ~2 us at 64 rows, and merged halfway through its MMAs ~0.6-1 us (docs/PERF.md,
// "Session 23"). A thread holds PAIRS of them in registers (gemm_rows's qkv 16, the logits 24: GPT-2
// 124M's 48 slices at 64 rows a block); a row of more than PAIRS G slices (GPT-2 XL's 200 at 16 rows
// a block) reads the rest in fold_finish.
#pragma once

#include <cuda_runtime.h>

struct FoldStats {
    const float2 *stats;  // [M, slices] (mean, M2)
    int slices;
    const float *shift;  // [M]
};

template <int PAIRS> struct FoldLoad {
    float2 pair[PAIRS];  // pairs g, g + G, ... of the row (0 past slices)
    float shift;         // the row's (its first thread's)
};

template <int RB, int THREADS, int PAIRS>
__device__ __forceinline__ FoldLoad<PAIRS> fold_load(const FoldStats &fs, int r0, int M, int tid) {
    constexpr int G = THREADS / RB;
    const int t = r0 + tid / G, g = tid % G;
    FoldLoad<PAIRS> f;
#pragma unroll
    for (int i = 0; i < PAIRS; i++) {
        const int j = g + G * i;
        f.pair[i] = t < M && j < fs.slices ? fs.stats[(size_t)t * fs.slices + j] : make_float2(0.0f, 0.0f);
    }
    f.shift = t < M && g == 0 ? fs.shift[t] : 0.0f;
    return f;
}

// Row r0 + i's (mean - shift, rstd) into rows[i] (0 past M), GPT-2's eps; every thread of the
// block's first THREADS calls it (the shuffles), and rows is read after a barrier.
template <int RB, int THREADS, int PAIRS>
__device__ __forceinline__ void fold_finish(const FoldStats &fs, const FoldLoad<PAIRS> &f, float2 *rows, int r0,
                                            int M, int K, int tid) {
    constexpr int G = THREADS / RB;
    const int t = r0 + tid / G, g = tid % G, S = fs.slices;
    const float width = (float)(K / S);
    const float2 *rest = fs.stats + (size_t)t * S;  // pairs past the registers'
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PAIRS; i++) sum += f.pair[i].x;
    if (t < M)
        for (int j = g + G * PAIRS; j < S; j += G) sum += rest[j].x;
#pragma unroll
    for (int o = 1; o < G; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float mean = sum / S;
    float m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < PAIRS; i++)
        if (g + G * i < S) {
            const float d = f.pair[i].x - mean;
            m2 += f.pair[i].y + width * d * d;
        }
    if (t < M)
        for (int j = g + G * PAIRS; j < S; j += G) {
            const float2 p = rest[j];
            m2 += p.y + width * (p.x - mean) * (p.x - mean);
        }
#pragma unroll
    for (int o = 1; o < G; o *= 2) m2 += __shfl_xor_sync(0xffffffffu, m2, o);
    if (g == 0) rows[tid / G] = t < M ? make_float2(mean - f.shift, rsqrtf(m2 / K + 1e-5f)) : make_float2(0.0f, 0.0f);
}
