// The per-block op table and the state every op works on. The GPU engine (gpu_engine.cu) owns one
// GpuState: the weights on the device, the LayerNorm-folded vectors, the KV cache and the
// activation buffers. Its forward loop is the same for every table:
//
//   embedding(tokens) -> x, and ln1(x) -> ln where the table asks (shared kernel, not in the table)
//   for each layer l:
//       ops->attn_in(l)     x -> q (table's own layout), k/v into the cache at pos..pos+T-1
//       ops->attention(l)   q, cache -> atty [M, C]
//       ops->attn_out(l)    x += atty @ attprojw^T + attprojb
//       ops->mlp_in(l)      h [M, 4C] = gelu(ln2(x) @ fcw^T + fcb)
//       ops->mlp_out(l)     x += h @ fcprojw^T + fcprojb
//   ops->logits             lnf(x) @ wte^T -> logits [rows, V] fp32
//
// Where only each sequence's last logits are wanted (T > 1), the last layer's ops after the attention
// and the logits see a one-token step (M = B, T = 1) on those rows, moved to the front of x and atty.
// M = B*T rows, row b*T + t. The contract between ops is only these buffers: x (fp32 [M, C]),
// atty ([M, C], compute dtype), h ([M, 4C], compute dtype), the cache, logits. q's layout belongs
// to the table (reference: [B, NH, T, HS]; fused: [M, C]), so a table's attn_in and attention go
// together. A new table (kernels/ops_fused.cu) is a BlockOps value and nothing else; the loop and
// the buffers do not change.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu_engine.h"
#include "matmul_lt.h"

// One layer's parameters on the device. Matrices in the compute dtype (a `void *` that is float or
// __nv_bfloat16); LayerNorm gamma/beta and biases always fp32.
typedef struct {
    const float *ln1w, *ln1b;   // [C]
    const void *qkvw;           // [3C, C] rows q | k | v
    const float *qkvb;          // [3C]
    const void *attprojw;       // [C, C]
    const float *attprojb;      // [C]
    const float *ln2w, *ln2b;   // [C]
    const void *fcw;            // [4C, C]
    const float *fcb;           // [4C]
    const void *fcprojw;        // [C, 4C]
    const float *fcprojb;       // [C]
    // qkvb and fcb in the compute dtype (the same pointers when fp32): the bias of a cuBLASLt
    // epilogue has the output's type (matmul_lt.h), and these products write the compute dtype.
    const void *qkvb_c, *fcb_c;
    // LayerNorm folded into the following Linear (docs/DESIGN.md), fp32, from the weights exactly
    // as stored on the device (bf16-rounded when bf16):
    //   s_n = sum_k W_nk gamma_k,  b'_n = sum_k W_nk beta_k + b_n
    const float *qkv_s, *qkv_b;  // [3C]  ln1 -> qkv
    const float *fc_s, *fc_b;    // [4C]  ln2 -> fc
    // This layer's KV cache: [max_batch][NH][max_seq][HS] each, compute dtype. Position p of head
    // h of sequence b is at ((b * NH + h) * max_seq + p) * HS.
    void *k_cache, *v_cache;
} GpuLayer;

typedef struct GpuState {
    // Shapes
    int L, C, NH, HS, V, Vp, maxT;  // model (Vp: the checkpoint's wte rows; V logits are used)
    int wte_rows;                   // wte's rows on the device: Vp, or zero rows added up to logits_ld
    int max_batch, max_seq;         // what the cache and activations are sized for
    DType dtype;                    // compute dtype of matrices, cache, ln/atty/h buffers
    cudaStream_t stream;            // every op runs on this stream
    cublasHandle_t cublas;          // bound to stream; fp32: CUBLAS_DEFAULT_MATH (no TF32)
    MatmulLt *lt;                   // cuBLASLt GEMMs with epilogues: the fused table's many-row linear ops

    // Weights
    const void *wte;             // [wte_rows, C] dtype, tied to the logits
    const void *wpe;             // [maxT, C] dtype
    const float *lnfw, *lnfb;    // [C]
    const float *lnf_s, *lnf_b;  // [Vp] folded lnf -> logits (s_n = sum_k wte_nk lnfw_k, b'_n = sum_k wte_nk lnfb_k)
    GpuLayer *layers;            // [L], host array of device pointers

    // Activations, sized for max_batch * max_seq rows (R)
    int *tokens;          // [R + max_batch]: a forward's tokens, then a prompt's draws
    float *x;             // [R, C] fp32 residual stream
    void *q;              // [R, C] dtype: queries, layout owned by the table
    void *atty;           // [R, C] dtype: attention output, rows, heads side by side
    void *h;              // [R, 4C] dtype: MLP hidden after GELU
    // ln and scratch when the table sets unfused_buffers, att and att_p when score_buffers (else NULL):
    void *ln;             // [R, C] dtype: LayerNorm output
    float *scratch;       // [R, 4C] fp32: matmul outputs before bias / activation
    float *att;           // [max_batch * NH, max_seq, max_seq] fp32 attention scores
    void *att_p;          // same shape, dtype: probabilities (== att when fp32: softmax in place)
    float *logits;        // [R, logits_ld] fp32: V values a row
    int logits_ld;        // V rounded up to 64: aligned rows and a whole-tile N for cuBLASLt (matmul_lt.h)
    void *workspace;         // the table's scratch (BlockOps.workspace_bytes), zeroed at creation
    size_t workspace_bytes;
} GpuState;

// One forward call's shape: B sequences of T new tokens at positions [pos, pos + T).
typedef struct {
    int B, T, pos;
    int M;  // B * T
    // Inside a captured decode graph (gpu_engine.cu) the position changes from replay to replay,
    // so it is read from this device int instead of pos; NULL otherwise. Only tables that set
    // BlockOps.device_position are captured.
    const int *pos_device;
    // Greedy decoding's tokens: where the logits op may also write each sequence's token (the first
    // index of its row's largest logit), setting *greedy_written to 1 when it does, so that the
    // sampler need not run; it may then leave the logits unwritten (the step reads only the
    // tokens). NULL: the op writes only the logits.
    int *greedy_next, *greedy_written;
    // What the next decode step reads, left on the device: its position at [0] (the embedding writes
    // pos + T there) and each sequence's pick at [1 + b] (the logits op's greedy one, or the
    // sampler's), so that a chained step needs no copy from the host (gpu_engine.cu). NULL: nowhere.
    int *next_staging;
    // 1: the step's rows were gathered to the front after this layer's attention (a prompt's last layer,
    // one row a sequence: gpu_engine.cu, enqueue_model), so what an op measured on the rows before then
    // (the LayerNorm fold's means) belongs to other rows, or to an earlier step.
    int rows_gathered;
} GpuStep;

// Every op returns 0, or -1 with one line in err. Ops only enqueue work on s->stream.
typedef struct {
    const char *name;     // the Engine's name: "gpu", "gpu-reference"
    int unfused_buffers;  // 1: allocate ln and scratch (LayerNorm output, cuBLAS products)
    int score_buffers;    // 1: allocate att and att_p (the T x T scores of an unfused attention)
    int device_position;  // 1: every op honours GpuStep.pos_device, so decode replays as a CUDA graph
    // Bytes of scratch the table's kernels want (e.g. flash-decoding partials), for this state's
    // shapes (max_batch, max_seq, NH, HS); NULL or 0: none. The engine allocates it once with the
    // activations, zeroed, as s->workspace.
    size_t (*workspace_bytes)(const struct GpuState *s);
    // 1 where the embedding kernel should also write layer 0's ln1 into s->ln for this step (the
    // table's attn_in then runs no LayerNorm kernel for it); NULL: never.
    int (*embedding_writes_ln1)(const GpuState *s, const GpuStep *st);
    int (*attn_in)(GpuState *s, const GpuStep *st, int l, Error *err);
    int (*attention)(GpuState *s, const GpuStep *st, int l, Error *err);
    int (*attn_out)(GpuState *s, const GpuStep *st, int l, Error *err);
    int (*mlp_in)(GpuState *s, const GpuStep *st, int l, Error *err);
    int (*mlp_out)(GpuState *s, const GpuStep *st, int l, Error *err);
    // lnf + wte^T into s->logits: the first rows of x, all M of them for all positions, else B, one
    // a sequence (st->T is 1 then: the loop has moved each sequence's last row to the front). Row
    // stride s->logits_ld. It may also write greedy tokens (GpuStep.greedy_next).
    int (*logits)(GpuState *s, const GpuStep *st, int all_positions, Error *err);
} BlockOps;

// Buffers carved from one allocation start 256 bytes apart (cudaMalloc's alignment).
static inline size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

extern const BlockOps reference_ops;  // ops_reference.cu
extern const BlockOps fused_ops;      // ops_fused.cu
