// Products of a prompt's many rows on Hopper (bf16): y = epilogue(x W^T + b) for GPT-2 124M's four
// layer products at 129-1024 rows, where 128-row tiles make 2/5 to one wave of blocks, as one kernel
// that joins the prompt's chain of programmatically dependent launches (kernels/pdl.cuh), which
// cuBLASLt's kernels cannot, with the LayerNorms folded in, so that no LayerNorm kernel runs between
// layers:
//   - at 513-1024 rows a block owns a 128-row x BN-column tile of y (BN 144 for qkv, 192 for fc, 48
//     for the projections: 16 column tiles, 128 blocks at 1024 rows) and all of K; the MLP
//     projection's K (3072) is split over a cluster of two blocks that multiply a 128 x 96 tile over
//     half of K each and exchange partial sums, so that each reads x for half of K;
//   - at 257-512 rows (3-4 row tiles) 32 blocks a row tile: qkv and fc tiles half as wide (BN 72 and
//     96), and both projections' K split over pairs of blocks that multiply the same 128 x 48 tile
//     and finish 64 of its rows each; at 129-256 rows (2 row tiles) qkv and fc tiles 48 wide;
//   - one producer thread streams 64-wide K slices of W (its first stages before the PDL wait: they
//     are weights) and x (after it) into a ring of shared-memory stages by TMA; two consumer
//     warpgroups multiply them on wgmma, 64 rows each;
//   - the epilogue goes through shared memory and out as whole-row 16-byte vectors, its column
//     vectors (bias, s, gamma) loaded before the wait by a spare warp, the residual's old tile by TMA
//     during the K loop, so that no global round trip sits after the last MMA.
// The LayerNorm fold is gemm_rows.h's ("The LayerNorm folded into the product that follows it"), with
// the statistics split between the two products:
//   1. the residual product (gemm_tiles_residual_copy) writes the bf16 copy gamma (y - c) of its new
//      rows and, for each row, the sum and the centred sum of squares (M2) of its BN columns: parts;
//   2. the folded product (gemm_tiles_fold) multiplies W by the copy while two spare warps merge each
//      row's parts (Chan's rule, exact) into its mean and rstd, and finishes with
//          y = epilogue(rstd (copy W^T - (mean - c) s) + b'),  s = W gamma, b' = W beta + b,
//      writing the rows' means to mean_out (the next copy's c).
// Against cuBLASLt with the LayerNorm kernels, a 1024-row layer's four products as a chain took 37.8
// against 41.1-41.9 us on an H200 (docs/PERF.md, "Session 60").
//
// Shapes: gemm_tiles_takes. All pointers device memory, x, W, y 16-byte aligned; nothing is
// allocated per call (the tensor maps are kernel parameters), so calls can be captured in a graph.
#pragma once

#include <cuda_runtime_api.h>

#include "matmul_lt.h"  // MatmulLtEpilogue

#define GEMM_TILES_MAX_ROWS 1024
#define GEMM_TILES_MAX_PARTS 16  // a row's statistics' parts at most (N / BN of a residual product)

#ifdef __cplusplus
extern "C" {
#endif

// 1 when the current device is compute capability 9.0, the build has sm_90a code (GPT2_SM90A) and the
// driver gives cuTensorMapEncodeTiled; GPT2_GEMM_TILES=0 turns it off (to compare routes).
int gemm_tiles_available(void);

// 1 when gemm_tiles runs this product and should: N x K one of GPT-2 124M's layer products (2304 x
// 768, 768 x 768, 3072 x 768, 768 x 3072), M rows making two or more row tiles and 2/5 to one wave of
// blocks on this device (129-1024 rows on an H100 SXM or H200), for a K split one wave of the pairs
// that fit at once.
int gemm_tiles_takes(int M, int N, int K);

// The parts a row's statistics come in from a residual product of N columns (gemm_tiles_residual_copy),
// 0 where none is taken.
int gemm_tiles_parts(int N);

// y = epilogue(x W^T + b) as matmul_lt: x bf16 [M, K] (rows K apart), W bf16 [N, K]; epilogue
// MATMUL_LT_BIAS or MATMUL_LT_BIAS_GELU (y and bias bf16) or MATMUL_LT_BIAS_RESIDUAL (y and bias fp32,
// y += ...). Returns cudaSuccess, cudaErrorNotSupported (a shape it does not take, or not available)
// or cudaErrorInvalidValue (a bad argument), nothing launched for either; else the launch's error.
cudaError_t gemm_tiles(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                       const void *bias, int M, int N, int K, cudaStream_t stream);

// The residual product (y fp32 += x W^T + bias, bias fp32) that also writes, for the LayerNorm after it:
//   copy   bf16 [M, N], rows N apart: gamma (y - c) of the new y, c = shift[row] (0 without shift)
//   parts  fp32 [M, gemm_tiles_parts(N), 2]: (sum, M2) of the new y over each tile's columns
// copy and parts must not overlap y, x or W.
typedef struct {
    void *copy;
    const float *gamma;  // [N]: the next LayerNorm's gamma
    const float *shift;  // [M]: c, or NULL
    float *parts;
} GemmTilesCopy;
cudaError_t gemm_tiles_residual_copy(float *y, long long ldy, const void *x, const void *W, const float *bias, int M,
                                     int N, int K, const GemmTilesCopy *copy, cudaStream_t stream);

// y = epilogue(LayerNorm(x) W^T + b) from the residual product's copy and parts of x:
//   copy, parts, nparts  as gemm_tiles_residual_copy wrote them (nparts = gemm_tiles_parts(K))
//   shift     [M]: the c the copy was made with, or NULL (0)
//   mean_out  [M]: where the rows' means go (the next copy's c), or NULL; not shift
//   s fp32 [N] = W gamma; b_folded fp32 [N] = W beta + b (ln_fold.cu's vectors)
//   y bf16 [M, N], rows ldy apart; epilogue MATMUL_LT_BIAS or MATMUL_LT_BIAS_GELU
typedef struct {
    const void *copy;
    const float *parts;
    int nparts;
    const float *shift;
    float *mean_out;
} GemmTilesFold;
cudaError_t gemm_tiles_fold(MatmulLtEpilogue epilogue, void *y, long long ldy, const GemmTilesFold *in,
                            const void *W, const float *s, const float *b_folded, int M, int N, int K,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif
