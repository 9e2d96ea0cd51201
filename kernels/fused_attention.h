// Fused causal self-attention over the KV cache (issue 5): softmax(q k^T / sqrt(HS) + mask) v in
// one pass per (sequence, head), the T x L scores never written to memory.
//
//   q      [B*T, C] compute dtype, row b*T + t, head h at columns [h*HS, (h+1)*HS), C = NH*HS
//   k, v   this layer's cache, each [B][NH][max_seq][HS] compute dtype, positions 0..pos+T-1 filled
//   out    [B*T, C] compute dtype, same columns as q
// Query t of sequence b sits at position pos + t and attends to cache positions 0..pos + t.
//
// Picked per call:
//   prefill (T > 4): flash-attention tiles of 64 queries (bf16 with many blocks: 128) x 64 keys,
//     online softmax, causal tiles skipped. bf16 with HS % 8 == 0: tensor cores (mma.sync m16n8k16,
//     fp32 accumulation and softmax, P rounded to bf16 for P.V); fp32 (or odd HS): fp32 FMA throughout.
//   decode (T <= 4): flash-decoding. Each (b, h)'s keys are cut into chunks handled by separate
//     blocks that write partial (max, sum, acc) into the workspace; the last of a head's blocks to
//     finish merges them (one launch). So B=1 with a long cache still fills the GPU. T = 1 streams
//     K and V rows straight into registers, and on sm_90 and later a head's blocks (up to 16) form a
//     cluster that merges in shared memory, without the workspace.
// Any HS from 1 to 128 (HS = 64 is the tuned case), any B, NH, T, pos with pos + T <= max_seq.
// Nothing is allocated per call, no host synchronisation: capturable in a CUDA graph.
#pragma once

#include <stddef.h>
#include <cuda_runtime_api.h>

#include "model.h"  // DType

#ifdef __cplusplus
extern "C" {
#endif

// Bytes of workspace that let fused_attention split the cache as finely as it wants for any call
// with at most B sequences, num_heads heads of head_size and a cache of max_seq positions
// (about 13 MiB for GPT-2 124M at B = 64, max_seq = 1024). Allocate once, zero it once
// (cudaMemset: its first 64 KiB are per-head counters that every call leaves at zero again),
// and pass it to every call on one stream.
size_t fused_attention_workspace_size(int B, int num_heads, int head_size, int max_seq);

// Enqueues attention on `stream`; returns cudaSuccess (0) or the error (cudaErrorInvalidValue for
// a bad shape: T < 0, pos < 0, pos + T > max_seq, head_size outside 1..128, ...; else the launch's).
// `workspace` (device memory, workspace_bytes long) holds the flash-decoding partials: NULL / 0 is
// allowed and still correct, but then each (b, h) of a decode step runs in one block (slower for
// small B), except where T = 1 merges inside a cluster. The workspace is only touched by this call's kernels on `stream`.
// All pointers device memory, 16-byte aligned for the fast paths (cudaMalloc'd buffers are).
// pos_device (decode, T <= 4, else cudaErrorInvalidValue): when not NULL the kernels read the
// position from this device int as they run, so one captured CUDA graph serves every step; `pos`
// is then the largest position it will hold (max_seq - T), which lays out the cache split.
int fused_attention(const void *q, const void *k_cache, const void *v_cache, void *out, DType dtype, int B, int T,
                    int pos, const int *pos_device, int num_heads, int head_size, int max_seq, void *workspace,
                    size_t workspace_bytes, cudaStream_t stream);

// Attention straight from the qkv product (the many-row route of kernels/ops_fused.cu), without
// first splitting it into q rows and cache rows:
//   qkv    [B*T, 3C] compute dtype, row b*T + t: q, k, v of the token at position pos + t, head h
//          at columns h*HS (+ C for k, + 2C for v)
// Attends exactly as fused_attention (keys before pos from the cache, the new ones from qkv) and
// also stores the new keys and values into the cache at pos..pos+T-1, as qkv_split would have.
// Only where fused_attention_takes_qkv: decode of one token (T = 1, fp32 or bf16, HS a multiple of
// 16 bytes; pos_device and the workspace as in fused_attention), and bf16 prefill (T > 4, HS % 8 == 0:
// the tensor-core prefill; pos_device must be NULL), every buffer 16-byte aligned; else
// cudaErrorInvalidValue and nothing launched.
int fused_attention_takes_qkv(DType dtype, int T, int head_size);
int fused_attention_qkv(const void *qkv, void *k_cache, void *v_cache, void *out, DType dtype, int B, int T, int pos,
                        const int *pos_device, int num_heads, int head_size, int max_seq, void *workspace,
                        size_t workspace_bytes, cudaStream_t stream);

// The unfused baseline's middle step, for tests/bench_fused_attention.c only (its cuBLAS products
// around it live in the bench): probs[r][j] = softmax_j(scale * scores[r][j]) over j <= pos + r % T,
// 0 for the rest of the row; scores fp32 [rows][Tk], probs dtype [rows][Tk], rows = B*NH*T.
int attention_softmax_baseline(void *probs, const float *scores, int rows, int T, int Tk, int pos, float scale,
                               DType dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
