// One decode step of one sequence in one kernel (issue 5: batch-1 decode is latency-bound).
//
// The layer loop of the fused table spends a batch-1 step in ~63 dependent kernels: ~19 µs a layer
// where the layer's weights need 3.4 µs of bandwidth (docs/PERF.md, "Engine decode, session 2").
// Here one persistent kernel, one block per SM, runs the embedding, the twelve (L) layers and the
// logits, and the kernel boundaries become grid-wide barriers: five per layer, each the point where
// every block needs every other block's output (the LayerNorm and each product need whole rows).
// Before each barrier a block starts copying its share of the next phase's weights into shared
// memory (cp.async), so the bytes stream during the barrier and only the dependent work (the
// activations, a few dot products, a store) is on the critical path.
//
//   P1  x = embedding (layer 0)          qkv = ln1(x) W_qkv^T + b   q -> workspace, k/v -> cache[pos]
//   P2  attention over cache[0..pos]      flash-decoding: warps take (head, chunk), the last warp of a
//                                         head to finish merges the head's partials
//   P3  x += atty W_proj^T + b
//   P4  h = gelu(ln2(x) W_fc^T + b)
//   P5  x += h W_fcproj^T + b
//   after the last layer: logits = lnf(x) wte[:V]^T (fp32), for the sampler that follows
//
// Numerics: every product, the LayerNorm (exact two-pass statistics of the whole row) and the
// softmax in fp32; q, the attention output and h stay fp32 (the layer loop rounds them to the
// compute dtype in bf16), and the row-to-thread assignment is fixed, so results are deterministic.
// Each block's rows of a product are contiguous; a row's dot product is one warp's (or, for a block
// with fewer than 8 rows in a round, a fixed group of warps summed in order).
//
// The grid must be co-resident for the barriers: the launch is cooperative (capturable in a CUDA
// graph), one 256-thread block per SM.
#pragma once

#include <cuda_runtime_api.h>

#include "model.h"  // DType

#ifdef __cplusplus
extern "C" {
#endif

struct GpuLayer;  // block_ops.h

typedef struct {
    int L, C, NH, HS, V, max_seq;
    DType dtype;
    const struct GpuLayer *layers;  // [L] on the device (GpuState.layers_dev)
    const void *wte, *wpe;          // dtype
    const float *lnfw, *lnfb;
    const int *token;               // device: this step's token
    int pos;                        // position of the token, or the bound on it when pos_device is set
    const int *pos_device;          // device: the position (a replayed graph), or NULL
    float *x;                       // [C] fp32: the residual stream (written: the step's final x)
    float *logits;                  // [V] fp32
    void *workspace;                // decode_persistent_workspace_size bytes, zeroed once
} DecodePersistentArgs;

// Bytes of workspace for this model shape: q, the attention output, h, the attention partials and
// the barrier. Zero it once; every step leaves its counters as it found them.
size_t decode_persistent_workspace_size(int C, int NH, int HS, int max_seq);

// 1 when the current device and shape can run it: HS == 64, C % 8 == 0, a cooperative launch of
// one block per SM with the shared memory it needs. Otherwise the layer loop serves the step.
int decode_persistent_supported(int C, int HS, DType dtype);

// Enqueues the step on stream. Returns the launch's error (cudaErrorInvalidValue for bad arguments).
cudaError_t decode_persistent(const DecodePersistentArgs *args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
