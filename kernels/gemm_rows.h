// Products of a few rows on Hopper (batched decode, 1-64 rows, and short prompts where the grid is
// one wave: docs/PERF.md, "Session 31"): y = epilogue(x W^T + b) with
// matmul_lt's four epilogues, types and row stride (matmul_lt.h), bf16 only, as one kernel that
// joins the decode step's chain of programmatically dependent launches (kernels/pdl.cuh), which
// cuBLASLt's kernels cannot ("Session 14" in docs/PERF.md: ~0.8 us lost at each boundary into them).
//
// At 64 rows a decode product still reads more weight than x (W 1.2-3.5 MB against x's 96 KB), so
// what matters is what happens after the wait for the previous kernel, not the arithmetic:
//   - a block owns 64 output columns (W rows) and all K, and loads that W tile into shared memory
//     by TMA *before* pdl_wait(): the weights stream in while the previous kernel finishes;
//   - after the wait only its rows of x arrive, RB of them (16 or 32; grid.y covers M), as 64-wide
//     K slices in one TMA copy (sharing them across a cluster by multicast was slower: docs/PERF.md);
//   - one warpgroup multiplies them slice by slice: wgmma with W's 64 columns as the 64-row A
//     operand and x's rows as the N side ("swap AB": a decode batch of 8-64 rows is a legal wgmma N,
//     where as the M side it would pad to 64), so D is y's tile transposed;
//   - where the W tile would not fit (the MLP projection's K = 3072), K splits over the 2-8 blocks
//     of a cluster: each block multiplies its part of K, and the cluster adds the partial tiles
//     through distributed shared memory, in a fixed order; with 32-64 rows a block K splits over
//     twice as many blocks where the grid leaves room (gemm_rows.cu's pick_split), a whole K too;
//   - the epilogue adds the bias (read before the wait), GELU, or the residual (read as x lands).
// Measured against LayerNorm + cuBLASLt and the other fused kernels in docs/PERF.md, "Session 21"
// and "Session 22".
//
// Shapes: 0 <= M <= GEMM_ROWS_MAX_ROWS, K a multiple of 64 (whole slices; every GPT-2 size's K is) and small enough
// that an eighth of the W tile and x's rows fit in shared memory (gemm_rows_takes: to K = 6656 at 64
// rows on an H100 or H200, so every GPT-2 size's layer products); x and W 16-byte aligned.
// y, ldy, bias as matmul_lt's: y fp32 for NONE and BIAS_RESIDUAL (bias fp32), else bf16 (bias bf16).
// All pointers are device memory; nothing is allocated per call (the tensor maps are kernel
// parameters), so calls can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include "matmul_lt.h"  // MatmulLtEpilogue

// The most rows gemm_rows takes. Past 64 the engine's routing (gemm_rows_takes) keeps it to grids of
// one wave, which for GPT-2's products means at most 704 rows (124M's attention projection, 64 a
// block).
#define GEMM_ROWS_MAX_ROWS 1024

#ifdef __cplusplus
extern "C" {
#endif

// 1 when the current device is compute capability 9.0, the build has sm_90a code (GPT2_SM90A) and
// the driver gives cuTensorMapEncodeTiled; GPT2_GEMM_ROWS=0 turns it off (to compare routes).
int gemm_rows_available(void);

// 1 when gemm_rows can run this shape (above) on the current device and should: past 32 rows, only
// where its grid fits in one wave of blocks (gemm_rows.cu says why; past 64 rows it takes 64 a
// block where 32 would not fit one wave). The engine's routing asks this;
// gemm_rows itself runs any shape it can.
int gemm_rows_takes(int M, int N, int K);

// Returns cudaSuccess, cudaErrorNotSupported (not available, or a shape it does not take) or
// cudaErrorInvalidValue (a bad argument), nothing launched for either; else the launch's error.
cudaError_t gemm_rows(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                      const void *bias, int M, int N, int K, cudaStream_t stream);

// The same with a forced number of rows a block and blocks K splits over (tests, benchmarks): rb in
// {16, 32, 64}, ks in {1, 2, 4, 8}; 0 picks as gemm_rows does (cudaErrorNotSupported where the
// forced split's part of K does not fit). GPT2_ROWS_TILE=16|32|64 and GPT2_ROWS_SPLIT=1|2|4|8 force
// them for gemm_rows too.
cudaError_t gemm_rows_ex(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                         const void *bias, int M, int N, int K, int rb, int ks, cudaStream_t stream);

// LayerNorm + Linear (+ GELU) in one kernel for a few rows (fused_ln_linear.h's function on Hopper):
// y = epilogue(LayerNorm(x) W^T + b), the blocks normalising their rows of x into the tiles their
// wgmmas read (exact statistics of whole rows, then gamma (x - mean) rstd in bf16: gemm_rows.cu) instead
// of reading a LayerNorm kernel's output; the rest as gemm_rows (W's tile before the PDL wait, past 32
// rows after the block's loads of x: gemm_rows.cu's pick_w_after_x). Two warpgroups a block stage
// the rows, and the 2 or 4 blocks of a cluster along the columns share them: each normalises its
// part of the rows into all their tiles (gemm_rows.cu; docs/PERF.md "Session 35", "Session 38").
//   x         fp32 [M, K], rows ldx floats apart (16-byte aligned)
//   gamma     fp32 [K]; beta enters through the bias:
//   b_folded  fp32 [N] = W beta + b (ln_fold.cu's vectors, the GEMV's), or NULL (no beta, no bias)
//   y         bf16 [M, N], rows ldy apart; epilogue MATMUL_LT_BIAS or MATMUL_LT_BIAS_GELU
// Takes 0 <= M <= GEMM_ROWS_LN_MAX_ROWS, K a multiple of 64 up to 1280 (a lane holds ten float4s of a
// row: GPT-2 124M's, 355M's and 774M's C) whose W tile and x tiles fit whole (gemm_rows_ln_takes: at
// K = 1280, 16 rows a block, so 1-16 rows). Returns as gemm_rows.
#define GEMM_ROWS_LN_MAX_ROWS 64
int gemm_rows_ln_takes(int M, int N, int K);
cudaError_t gemm_rows_ln(MatmulLtEpilogue epilogue, void *y, long long ldy, const float *x, long long ldx,
                         const float *gamma, const void *W, const float *b_folded, int M, int N, int K,
                         cudaStream_t stream);

// The LayerNorm folded into the product that follows it, for batched decode past gemm_rows_ln's rows
// (17-64: there staging normalised rows before the MMAs costs about what the LayerNorm kernel does,
// docs/PERF.md "Session 49"). Two halves:
//   1. The residual product before the LayerNorm (gemm_rows_residual_copy) also writes a bf16 copy of
//      its new rows, shifted and scaled for the LayerNorm: copy = gamma (y - c), c a shift of each
//      row near its mean (the mean the last folded product measured, or 0).
//   2. The product after it (gemm_rows_fold) multiplies W by that copy exactly as gemm_rows multiplies
//      x, while a second warpgroup of each block takes the exact statistics (fp32, gemm_rows.cu) of the
//      rows the copy was made from; only the epilogue waits for them:
//          y = epilogue(rstd (copy W^T - (mean - c) s) + b'),  s = W gamma, b' = W beta + b
//      which is LayerNorm(x) W^T + b, since W (gamma (x - mean)) = W (gamma (x - c)) - (mean - c) W gamma.
//      It writes the rows' means to mean_out: the next copy's c.
// No LayerNorm kernel and no boundary before the product. c keeps the copy's bf16 rounding relative
// to the row's spread rather than its offset: a stale c (the residual adds since it was measured)
// costs precision in proportion to |mean - c| / std, never correctness. The blocks of 8 or 4 column
// tiles in a cluster share the statistics (each takes RB / CN of the rows), as gemm_rows_ln's share
// their staging (gemm_rows.cu).

// The residual product of gemm_rows (MATMUL_LT_BIAS_RESIDUAL: y fp32 += x W^T + bias) that also
// writes copy->copy [M, N] bf16, rows N apart: gamma (y - shift) of the new y. shift [M] or NULL (0).
// copy must not overlap y, x or W. Takes and returns as gemm_rows.
typedef struct {
    void *copy;          // bf16 [M, N]
    const float *gamma;  // [N]: the next LayerNorm's gamma
    const float *shift;  // [M]: c, or NULL
} GemmRowsCopy;
cudaError_t gemm_rows_residual_copy(float *y, long long ldy, const void *x, const void *W, const void *bias, int M,
                                    int N, int K, const GemmRowsCopy *copy, cudaStream_t stream);

// gemm_rows_fold: y = epilogue(LayerNorm(x) W^T + b) from the copy of x and x's statistics.
//   in->x        fp32 [M, K], rows ldx apart (16-byte aligned): the rows the copy was made from
//   in->copy     bf16 [M, K]: gamma (x - c), as gemm_rows_residual_copy wrote it (16-byte aligned)
//   in->shift    [M]: that c, or NULL (0)
//   in->mean_out [M]: where the rows' means go (the next copy's c), or NULL; not in->shift (blocks
//                still read it while block 0 of the columns writes)
//   s            fp32 [N] = W gamma; b_folded fp32 [N] = W beta + b, or NULL (ln_fold.cu's vectors)
//   y            bf16 [M, N], rows ldy apart; epilogue MATMUL_LT_BIAS or MATMUL_LT_BIAS_GELU
// Takes 0 <= M <= GEMM_ROWS_FOLD_MAX_ROWS, K a multiple of 64 up to 1024 (gemm_rows_ln's rows in
// registers; its 32-row tile at 774M's 1280 does not fit shared memory), where the grid's clusters of
// 8 or 4 fit the device at once (gemm_rows_fold_takes). Returns as gemm_rows.
#define GEMM_ROWS_FOLD_MAX_ROWS 64
typedef struct {
    const float *x;
    long long ldx;
    const void *copy;
    const float *shift;
    float *mean_out;
} GemmRowsFold;
int gemm_rows_fold_takes(int M, int N, int K);
cudaError_t gemm_rows_fold(MatmulLtEpilogue epilogue, void *y, long long ldy, const GemmRowsFold *in, const void *W,
                           const float *s, const float *b_folded, int M, int N, int K, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
