// LayerNorm + Linear (+ GELU) in one pass (issue 5): for a row x (fp32, the residual stream) and
// output column n,
//
//   y_n = act( rstd * (sum_k W_nk gamma_k x_k - mean(x) * s_n) + b'_n )
//   s_n = sum_k W_nk gamma_k,  b'_n = sum_k W_nk beta_k + b_n      (precomputed: ln_fold.cu)
//   rstd = 1 / sqrt(var(x) + 1e-5)
//
// W is [N, K] row-major (llm.c: each output row a dot product over K inputs), fp32 or bf16 with
// fp32 accumulation. Used for ln1 -> qkv (the QKV output mode below), ln2 -> fc -> GELU and
// lnf -> logits (W = wte, b' = wte . beta, fp32 logits).
//
// Kernels (kernels/linear_kernels.cuh), picked per call by M (measured routing: docs/PERF.md):
//   bf16 W and y, plain output, M <= 64, K a multiple of 64 up to 1280 where the tiles fit
//             (gemm_rows_ln_takes), on Hopper (sm_90a build): gemm_rows_ln (gemm_rows.h), the rows
//             normalised by each block (exact statistics of whole rows: each lane's two passes,
//             merged by Chan's rule) into the tile its wgmmas read, W's tile loaded by TMA before
//             the PDL wait (past 32 rows after the rows' loads);
//             otherwise:
//   M <= 16   GEMV: W read once with 16-byte loads over all SMs; each block stages its rows of x
//             in shared memory as gamma (x - c), each warp takes exact two-pass statistics of whole
//             rows (x is tiny), and the epilogue applies the formula above. bf16 with 8 < M <= 16:
//             the rows staged normalised (as bf16), then tensor cores (mma.sync) fed with W straight
//             from global memory.
//   bf16, 4 < M <= 32 on sm_90 and later: the cluster GEMV. The same exact statistics and
//             tensor cores, with the rows of x staged once per cluster of 8 blocks (distributed
//             shared memory) instead of once per block.
//   fp32 W, 9 <= M <= 64: the fp32 rows kernel. W's columns in shared memory, x normalised in
//             registers as it becomes the MMAs' operand, 3xTF32 tensor cores (fp32-level error).
//   M > 16    tiled: bf16 tensor cores (mma.sync m16n8k16, fp32 accumulate) or fp32 FFMA tiles
//             (no plain TF32), cp.async rings; the x tile each K step loads also feeds the row
//             statistics; the formula above is applied in the epilogue.
//
// Numerics of the tiled kernels. The plain one-pass form fails where GPT-2 needs it: a row whose
// mean is large against its spread loses the variance in E[x^2] - E[x]^2, and W.x - mean * s_n
// subtracts two large numbers; worse, with bf16 operands the rounding of gamma * x is relative to
// |x|, not to the spread, so an offset row would be multiplied with errors of |mean| * 2^-9. So
// every row is shifted by c = the mean of its first min(K, BK) elements (BK = 32 bf16, 16 fp32; the
// fp32 rows kernel: 128), known after the first tile: the kernel accumulates d = x - c, sum d, sum
// d^2 and sum_k W_nk gamma_k d_k (gamma * d rounded to bf16 for the tensor cores), and uses
//   dmean = sum d / K,  var = sum d^2 / K - dmean^2,  y_n = act(rstd * (acc_n - dmean * s_n) + b'_n)
// which is the same function (mean = c + dmean) with every term of the size of the spread as long
// as c is within a few standard deviations of the mean, which the mean of 16-32 values is (a row
// of 768 with one channel of 500 among N(0, 1) ones puts c at ~16-31, near the row's std of ~18).
// The GEMV paths stage whole rows, so they need less care: the FMA GEMV takes exact two-pass
// statistics around c = x[0] and multiplies fp32 gamma (x - c), so W.x - dmean * s_n subtracts
// terms of the size of |x[0] - mean|, which stays within fp32's 1e-5 even when x[0] is a +-500
// channel; the tensor-core GEMV (bf16 only) one pass around c = x[0], whose error (x - c is exact
// for an offset row) stays far under the bf16 rounding of its operand.
// tests/test_fused_linear.c checks offset rows (mean 100, std 1) and outlier channels (+-500).
//
// All pointers are device memory. Nothing is allocated per call and the host never waits: every
// call can be captured in a CUDA graph. Returns cudaSuccess (0) or the error: cudaErrorInvalidValue
// for a bad argument, else the launch's.
#pragma once

#include <cuda_runtime_api.h>

#include "greedy_pick.h"  // LogitsGreedy
#include "model.h"        // DType

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ACT_NONE = 0, ACT_GELU = 1 } Activation;

// Which kernel; AUTO routes by M, N and dtype (the others exist for tests and benchmarks).
//   GEMV      FMA GEMV, any M (rows in slices of up to 16, W re-read per slice)
//   GEMV_TC   bf16 only: tensor-core GEMV, rows in slices of up to 64 (LN: K <= 2048)
//   TILED_XS  32 x 32 tiles, TILED_S 64 x 64, TILED_L 128 x 128
//   CLUSTER   bf16 with the LayerNorm only (linear_residual.h: cudaErrorInvalidValue), sm_90 and
//             later (else cudaErrorNotSupported): cluster GEMV, rows in slices of up to 64, K <= 2048
//   SKINNY    bf16 plain linear only (linear_residual.h; with a LayerNorm cudaErrorInvalidValue): W
//             in shared memory before the PDL wait, row tiles of up to 64
//   ROWS      bf16 W and y, plain output, with the LayerNorm only: gemm_rows_ln (gemm_rows.h; Hopper,
//             M <= 64, K <= 1024; else cudaErrorNotSupported), each block normalising its rows into
//             the tile its wgmmas read
//   ROWS_F32  fp32 W with the LayerNorm only: 24-32 columns of W a block in shared memory, x's rows
//             in chunks, 3xTF32 tensor cores with fp32-level error (K a multiple of 4 whose block
//             fits, ldx a multiple of 4, 16-byte aligned x, W and gamma; else cudaErrorInvalidValue),
//             rows in slices of 64
typedef enum {
    LINEAR_PATH_AUTO = 0,
    LINEAR_PATH_GEMV = 1,
    LINEAR_PATH_TILED_XS = 2,
    LINEAR_PATH_TILED_S = 3,
    LINEAR_PATH_TILED_L = 4,
    LINEAR_PATH_GEMV_TC = 5,
    LINEAR_PATH_CLUSTER = 6,
    LINEAR_PATH_SKINNY = 7,
    LINEAR_PATH_ROWS = 8,
    LINEAR_PATH_ROWS_F32 = 9
} LinearPath;

// The engine's three kinds of linear op, for fused_linear_rows: a plain linear (the projections,
// linear_residual), LayerNorm folded in (qkv, fc) and the logits (LayerNorm folded in, N = the
// vocabulary).
typedef enum { LINEAR_OP_PLAIN = 0, LINEAR_OP_LN = 1, LINEAR_OP_LOGITS = 2 } LinearOp;

// The most rows for which AUTO's kernels beat the unfused route (LayerNorm kernel, cuBLASLt with
// its epilogues) on the current device, for the engine's routing (measured: docs/PERF.md,
// "Session 4" and "Session 10"): bf16 on sm_90 and later 32 (with LayerNorm the cluster GEMV,
// without it the skinny kernel), the logits 4 (the GEMV); bf16 before sm_90 4; fp32 16. 0 when
// the device cannot be queried.
int fused_linear_rows(DType wtype, LinearOp op);

// 1 when AUTO runs M rows of fp32 W with the LayerNorm, K -> N, on the fp32 rows kernel
// (LINEAR_PATH_ROWS_F32: 9-64 rows whose block fits the device's shared memory, K a multiple of 4;
// x, gamma and W 16-byte aligned, x's rows a multiple of 4 floats apart, as the engine's are). It
// beats the LayerNorm kernel + cuBLAS there (1.5-2.4x on an H200), so the engine's fp32 LayerNorm
// ops take it past fused_linear_rows' 16 rows.
int fused_ln_linear_rows_f32_takes(int M, int N, int K);

// QKV output mode (N = 3C, C = num_heads * head_size): column n < C is q, written to q [M, C]
// (row m, ytype); columns C..2C-1 are k and 2C..3C-1 are v, written straight into this layer's
// cache, each [B][num_heads][max_seq][head_size] (ytype): row m = b*T + t goes to position pos + t.
// pos_device (may be NULL): the position is read from this device int as the kernel runs, so one
// captured CUDA graph serves every decode step; pos is then only the bound checked against
// max_seq (the largest position it will hold, e.g. max_seq - T).
typedef struct {
    void *q;
    void *k_cache, *v_cache;
    int T, pos, num_heads, head_size, max_seq;
    const int *pos_device;
} QKVDest;

// y = act(LayerNorm(x) W^T + b) through the folded form above.
//   x         fp32 [M, K] (row stride K)
//   ln_gamma  fp32 [K]
//   W         wtype [N, K]
//   s, b_folded  fp32 [N] (ln_fold.cu; b_folded may be NULL: no bias at all)
//   y         ytype [M, N], or NULL when qkv is given
int fused_ln_linear(const float *x, const float *ln_gamma, const void *W, DType wtype, const float *s,
                    const float *b_folded, void *y, DType ytype, int M, int N, int K, Activation act,
                    const QKVDest *qkv, cudaStream_t stream);

// The same with row strides, greedy decoding's pick and a forced kernel: x rows ldx floats apart
// (e.g. each sequence's last token: x + (T-1)*C with ldx = T*C), y rows ldy elements apart (plain
// output only). greedy (may be NULL; greedy_pick.h): the logits' greedy tokens too, taken by the
// GEMV (path AUTO or GEMV) as it writes them, so that no sampler kernel runs after it (with
// greedy->ids_only instead of writing them: y is left as it was); fp32 output without GELU only
// (else cudaErrorInvalidValue).
int fused_ln_linear_ex(const float *x, long long ldx, const float *ln_gamma, const void *W, DType wtype,
                       const float *s, const float *b_folded, void *y, long long ldy, DType ytype, int M, int N,
                       int K, Activation act, const QKVDest *qkv, const LogitsGreedy *greedy, LinearPath path,
                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
