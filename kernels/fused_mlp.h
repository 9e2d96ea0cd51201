// The MLP sub-block of a few rows in one kernel (issue 5, decode): for each row m of the fp32
// residual stream x,
//
//   x_m += gelu(ln2(x_m) fcw^T + fcb) fcprojw^T + fcprojb          fcw [H, C], fcprojw [C, H]
//
// At one token a step the two products are GEMVs, and each one's share of the weights arrives
// long before its inputs do (docs/PERF.md, "The batch-1 decode step's timeline"): what a kernel
// costs is its dependent path and its boundary, ~4 µs each for fc and fcproj. Here the hidden
// units are split over the blocks instead (one block per SM, a slice of HB units each), so a block
// needs only its own units' GELU outputs for its share of the projection:
//
//   1. before the previous kernel ends (programmatic dependent launch, kernels/pdl.cuh): the block's
//      HB rows of fcw and HB columns of fcprojw into shared memory (cp.async), gamma and biases;
//   2. the M rows of x, normalised in shared memory (exact two-pass statistics, beta folded into
//      b' = fcw beta + fcb as in fused_ln_linear.h), then its HB hidden units, GELU, kept in fp32;
//   3. its partial projection of every output column into the workspace, [block][M][C];
//   4. the blocks that arrive last (a ticket counter) each finish a slice of 64 columns once every
//      block has arrived: the partials summed in block order (so the result does not depend on
//      which block finished first: the same bits on every run), plus the bias, into x.
// One kernel and one boundary where the GEMV route runs two of each.
//
// Needs C and H multiples of 8 (16-byte rows of both matrices) and a block's slices (2 * HB * C
// weights, HB ~ H / SMs) in one block's shared memory: GPT-2 124M to 774M in bf16 and 124M in fp32
// on an H100; fused_mlp_fits says. M <= FUSED_MLP_MAX_ROWS.
//
// All pointers are device memory; the workspace (fused_mlp_workspace_size, zeroed once before the
// first call) holds the partials and the two counters, which every call leaves at zero again, and
// must not be shared by calls running at the same time. The host never waits: calls can be
// captured in a CUDA graph. Returns cudaSuccess (0) or the error: cudaErrorInvalidValue for a bad
// argument or a shape that does not fit, else the launch's.
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "model.h"  // DType

#ifdef __cplusplus
extern "C" {
#endif

enum { FUSED_MLP_MAX_ROWS = 4 };

// 1 when fused_mlp takes this shape on the current device (see above), else 0.
int fused_mlp_fits(DType wtype, int C, int H);

// Workspace bytes for up to max_rows rows of this shape on the current device (0 on error).
size_t fused_mlp_workspace_size(int max_rows, int C, int H);

// x [M, C] fp32, updated in place; ln_gamma [C]; b_folded [H] = fcw beta + fcb (ln_fold.cu);
// fcprojb [C] or NULL; fcw and fcprojw in wtype (fp32 or bf16).
int fused_mlp(float *x, int M, int C, int H, const float *ln_gamma, const void *fcw, const float *b_folded,
              const void *fcprojw, const float *fcprojb, DType wtype, void *workspace, size_t workspace_bytes,
              cudaStream_t stream);

#ifdef __cplusplus
}
#endif
