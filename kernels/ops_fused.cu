// The fused op table (issue 5): five kernels per block instead of the reference's fifteen or so.
//
//   attn_in    fused_ln_linear: ln1 folded into qkv (docs/DESIGN.md), q -> s->q [M, C], k/v straight
//              into the cache at pos..pos+T-1
//   attention  fused_attention: flash prefill / flash-decoding over the cache, out -> s->atty [M, C]
//   attn_out   linear_residual: x += atty @ attprojw^T + attprojb
//   mlp_in     fused_ln_linear: h = gelu(ln2(x) @ fcw^T + fcb)
//   mlp_out    linear_residual: x += h @ fcprojw^T + fcprojb
//   logits     fused_ln_linear: lnf folded into wte[:V]^T, fp32 logits; all rows, or each sequence's
//              last row (x rows T*C apart)
//
// The folded vectors (qkv_s/b, fc_s/b, lnf_s/b) are computed at engine creation (ln_fold.cu).
#include "block_ops.h"
#include "cuda_check.h"
#include "fused_attention.h"
#include "fused_ln_linear.h"
#include "linear_residual.h"

// Flash-decoding workspace: GpuState has no slot for it, so it is allocated on the first attention
// call, sized for the engine's max_batch and max_seq, and kept for the process (grown if a later
// engine needs more). TODO(lead): move into GpuState, allocated with the other buffers.
static void *attn_ws;
static size_t attn_ws_bytes;

#define FUSED_TRY(call)                                                                         \
    do {                                                                                        \
        int e_ = (call);                                                                        \
        if (e_ != 0) return cuda_fail(err, (cudaError_t)e_, #call, __FILE__, __LINE__);         \
    } while (0)

static int fused_attn_in(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    QKVDest dst = {s->q, ly->k_cache, ly->v_cache, st->T, st->pos, s->NH, s->HS, s->max_seq};
    FUSED_TRY(fused_ln_linear(s->x, ly->ln1w, ly->qkvw, s->dtype, ly->qkv_s, ly->qkv_b, NULL, s->dtype, st->M, 3 * s->C,
                              s->C, ACT_NONE, &dst, s->stream));
    return 0;
}

static int fused_attention_op(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    const size_t need = fused_attention_workspace_size(s->max_batch, s->NH, s->HS, s->max_seq);
    if (need > attn_ws_bytes) {
        if (attn_ws) CUDA_TRY(cudaFree(attn_ws));
        attn_ws = NULL;
        attn_ws_bytes = 0;
        if (gpu_alloc(&attn_ws, need, "the attention workspace", err)) return -1;
        attn_ws_bytes = need;
    }
    FUSED_TRY(fused_attention(s->q, ly->k_cache, ly->v_cache, s->atty, s->dtype, st->B, st->T, st->pos, s->NH, s->HS,
                              s->max_seq, attn_ws, attn_ws_bytes, s->stream));
    return 0;
}

static int fused_attn_out(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    FUSED_TRY(linear_residual(s->atty, ly->attprojw, s->dtype, ly->attprojb, s->x, st->M, s->C, s->C, s->stream));
    return 0;
}

static int fused_mlp_in(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    FUSED_TRY(fused_ln_linear(s->x, ly->ln2w, ly->fcw, s->dtype, ly->fc_s, ly->fc_b, s->h, s->dtype, st->M, 4 * s->C,
                              s->C, ACT_GELU, NULL, s->stream));
    return 0;
}

static int fused_mlp_out(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    FUSED_TRY(linear_residual(s->h, ly->fcprojw, s->dtype, ly->fcprojb, s->x, st->M, s->C, 4 * s->C, s->stream));
    return 0;
}

static int fused_logits(GpuState *s, const GpuStep *st, int all_positions, Error *err) {
    const int rows = all_positions ? st->M : st->B;
    const float *x = all_positions ? s->x : s->x + (size_t)(st->T - 1) * s->C;
    const long long ldx = all_positions ? s->C : (long long)st->T * s->C;
    FUSED_TRY(fused_ln_linear_ex(x, ldx, s->lnfw, s->wte, s->dtype, s->lnf_s, s->lnf_b, s->logits, s->V, DTYPE_F32,
                                 rows, s->V, s->C, ACT_NONE, NULL, LINEAR_PATH_AUTO, s->stream));
    return 0;
}

const BlockOps fused_ops = {
    .name = "gpu",
    .unfused_buffers = 0,
    .attn_in = fused_attn_in,
    .attention = fused_attention_op,
    .attn_out = fused_attn_out,
    .mlp_in = fused_mlp_in,
    .mlp_out = fused_mlp_out,
    .logits = fused_logits,
};
