// The logits of a few rows on Hopper (batched decode: one row a sequence, 1-64 sequences):
// y = x W^T with W the tied token embedding (GPT-2 124M: 50257 x 768, 77 MB in bf16), as one
// persistent kernel that joins the decode step's chain of programmatically dependent launches
// (kernels/pdl.cuh).
//
// At 64 rows the product is 5 GFLOP against 77 MB of W: reading W is the whole cost (18.4 us at
// the ~4.2 TB/s a copy reaches on an H200), and cuBLASLt took 25-28 us with the LayerNorm kernel's
// 3 more before it ("Session 23" in docs/PERF.md). gemm_rows's tile-per-block grid ran it at 0.56x
// cuBLASLt: 786 column tiles are six waves of blocks, and only the first loads its W before the
// wait. Here one block an SM keeps x's rows resident in shared memory and streams its share of W's
// 64-row tiles through a ring of TMA slices, so W is read once, at the copy rate, from before the
// previous kernel has finished to the end:
//   - a producer warp issues the ring's first slices before pdl_wait() (nothing in the step writes
//     W), then x's rows after it, then each slice as the multiplying warps free its slot;
//   - one warpgroup multiplies each slice as it lands (wgmma, W's 64 rows as the A operand and x's
//     rows as the N side, as gemm_rows does), and writes the tile's fp32 logits.
//
// The final LayerNorm comes before: x = LayerNorm(x0) in bf16, the LayerNorm kernel's output.
//
// Shapes: 1 <= M <= 64, K % 8 == 0 and x's M rows of K plus a ring of four slices fitting in shared
// memory (logits_rows_takes: every GPT-2 size to 64 rows but 1558M past 32); y [M, N] fp32 rows ldy
// apart (N <= ldy: only N columns are written), x bf16 [M, K] rows ldx apart (ldx % 8 == 0),
// W bf16 [N, K]; x and W 16-byte aligned. All pointers are device memory; nothing is allocated per
// call (the tensor maps are kernel parameters), so calls can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include "greedy_pick.h"  // LogitsGreedy

#ifdef __cplusplus
extern "C" {
#endif

// 1 when logits_rows runs M rows of K on the current device (gemm_rows_available(), the shapes
// above); GPT2_LOGITS_ROWS=0 turns it off (to compare routes).
int logits_rows_takes(int M, int K);

// y = x W^T, and with greedy set each row's greedy token too (with greedy->ids_only, only the
// tokens: y is not written). Returns cudaSuccess, cudaErrorNotSupported (a shape or device it does
// not take; nothing launched) or cudaErrorInvalidValue (a bad argument; nothing launched), else the
// launch's error.
cudaError_t logits_rows(float *y, long long ldy, const void *x, long long ldx, const void *W, int M, int N, int K,
                        const LogitsGreedy *greedy, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
