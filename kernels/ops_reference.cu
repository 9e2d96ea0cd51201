// The reference op table: every op a separate kernel or cuBLAS call, fp32 accumulation, the
// layouts cuBLAS likes. Slow on purpose and simple on purpose: it is what the fused kernels
// (ops_fused.cu) are checked against on the GPU, and it is itself checked against PyTorch. The
// fused table also hands its linear ops here when a step has many rows, where cuBLAS wins.
//
//   attn_in    LayerNorm -> qkv = ln @ qkvw^T (cuBLAS) -> + bias -> q [B,NH,T,HS], k/v into the cache
//   attention  S = q K^T (strided batched over B*NH, K read in place from the cache)
//              -> P = softmax(S / sqrt(HS) + causal mask) -> Y = P V (strided batched) -> rows
//   attn_out   x += atty @ attprojw^T + attprojb
//   mlp_in     LayerNorm -> ln @ fcw^T -> + bias -> GELU (tanh)
//   mlp_out    x += h @ fcprojw^T + fcprojb
//   logits     LayerNorm (all rows, or each sequence's last) -> ln @ wte[:V]^T
#include <math.h>

#include "block_ops.h"
#include "cuda_check.h"
#include "reference_kernels.h"

static int ref_attn_in(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    int C = s->C;
    CUDA_TRY(layernorm_forward(s->ln, s->x, ly->ln1w, ly->ln1b, st->M, C, s->dtype, s->stream));
    CUBLAS_TRY(matmul_nt(s->cublas, s->scratch, 3 * C, s->ln, ly->qkvw, st->M, 3 * C, C, s->dtype));
    CUDA_TRY(bias_add(s->scratch, ly->qkvb, st->M, 3 * C, s->stream));
    CUDA_TRY(qkv_to_heads(s->q, ly->k_cache, ly->v_cache, s->scratch, st->B, st->T, st->pos, s->NH, s->HS,
                          s->max_seq, s->dtype, s->stream));
    return 0;
}

static int ref_attention(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    int T = st->T, Tk = st->pos + st->T, HS = s->HS, BNH = st->B * s->NH;
    long long cache_stride = (long long)s->max_seq * HS;
    // S (T x Tk per head, row-major) = Q K^T; column-major: S^T (Tk x T) = K (HS x Tk)^T Q (HS x T).
    CUBLAS_TRY(matmul_strided_batched(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, Tk, T, HS, ly->k_cache, HS, cache_stride,
                                      s->q, HS, (long long)T * HS, s->att, Tk, (long long)T * Tk, BNH, s->dtype));
    CUDA_TRY(softmax_causal(s->att_p, s->att, BNH, T, Tk, st->pos, 1.0f / sqrtf((float)HS), s->dtype, s->stream));
    // Y (T x HS per head, row-major) = P V; column-major: Y^T (HS x T) = V (HS x Tk) P^T (Tk x T).
    CUBLAS_TRY(matmul_strided_batched(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, Tk, ly->v_cache, HS, cache_stride,
                                      s->att_p, Tk, (long long)T * Tk, s->scratch, HS, (long long)T * HS, BNH,
                                      s->dtype));
    CUDA_TRY(heads_to_rows(s->atty, s->scratch, st->B, T, s->NH, HS, s->dtype, s->stream));
    return 0;
}

static int ref_attn_out(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    CUBLAS_TRY(matmul_nt(s->cublas, s->scratch, s->C, s->atty, ly->attprojw, st->M, s->C, s->C, s->dtype));
    CUDA_TRY(residual_add_bias(s->x, s->scratch, ly->attprojb, st->M, s->C, s->stream));
    return 0;
}

static int ref_mlp_in(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    int C = s->C;
    CUDA_TRY(layernorm_forward(s->ln, s->x, ly->ln2w, ly->ln2b, st->M, C, s->dtype, s->stream));
    CUBLAS_TRY(matmul_nt(s->cublas, s->scratch, 4 * C, s->ln, ly->fcw, st->M, 4 * C, C, s->dtype));
    CUDA_TRY(bias_add(s->scratch, ly->fcb, st->M, 4 * C, s->stream));
    CUDA_TRY(gelu_forward(s->h, s->scratch, (size_t)st->M * 4 * C, s->dtype, s->stream));
    return 0;
}

static int ref_mlp_out(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    CUBLAS_TRY(matmul_nt(s->cublas, s->scratch, s->C, s->h, ly->fcprojw, st->M, s->C, 4 * s->C, s->dtype));
    CUDA_TRY(residual_add_bias(s->x, s->scratch, ly->fcprojb, st->M, s->C, s->stream));
    return 0;
}

static int ref_logits(GpuState *s, const GpuStep *st, int all_positions, Error *err) {
    int rows = all_positions ? st->M : st->B;
    CUDA_TRY(layernorm_forward(s->ln, s->x, s->lnfw, s->lnfb, rows, s->C, s->dtype, s->stream));
    CUBLAS_TRY(matmul_nt(s->cublas, s->logits, s->logits_ld, s->ln, s->wte, rows, s->V, s->C, s->dtype));
    return 0;
}

const BlockOps reference_ops = {
    .name = "gpu-reference",
    .unfused_buffers = 1,
    .score_buffers = 1,
    .device_position = 0,  // cuBLAS calls sized by the position: no graph replay
    .workspace_bytes = NULL,
    .embedding_writes_ln1 = NULL,  // ln1 stays the LayerNorm kernel's
    .attn_in = ref_attn_in,
    .attention = ref_attention,
    .attn_out = ref_attn_out,
    .mlp_in = ref_mlp_in,
    .mlp_out = ref_mlp_out,
    .logits = ref_logits,
};
