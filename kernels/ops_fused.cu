// The fused op table (issue 5): five kernels per block where the reference runs fifteen or so.
//
//   attn_in    fused_ln_linear: ln1 folded into qkv (docs/DESIGN.md), q -> s->q [M, C], k/v straight
//              into the cache at pos..pos+T-1
//   attention  fused_attention: flash prefill / flash-decoding over the cache, out -> s->atty [M, C]
//   attn_out   linear_residual: x += atty @ attprojw^T + attprojb
//   mlp_in     fused_ln_linear: h = gelu(ln2(x) @ fcw^T + fcb)
//   mlp_out    linear_residual: x += h @ fcprojw^T + fcprojb
//   logits     fused_ln_linear: lnf folded into wte[:V]^T, fp32 logits; all rows, or each sequence's
//              last row (moved to the front of x by the loop: block_ops.h)
//
// Routing by rows. The fused linear kernels win while the weights' bytes dominate (decode: a GEMV
// reading each weight once over all SMs), and lose to cuBLAS's GEMMs once the rows make it a
// matrix product (docs/PERF.md, "Fused LayerNorm + Linear", H200: bf16 768->3072 is 1.56x faster
// at M = 1 but 0.81x at M = 16; fp32 1.44x at M = 16, 0.63x at M = 64; bf16 decode at batch 8:
// below). Past fused_rows() the linear ops run the LayerNorm kernel and GEMMs with the bias, GELU
// (bf16) and the residual add in their epilogue: gemm_rows (kernels/gemm_rows.h) where it takes the
// product (bf16 on Hopper: decode, the projections at every batch, and a short prompt's grids of
// one wave: 124M's products to 128 rows, its attention projection to 704), else cuBLASLt
// (kernels/matmul_lt.h).
// Seven launches per block in bf16 with the fused attention (fp32 adds a GELU pass, and in prefill
// qkv_split), where the reference table's linear steps (cuBLAS, then bias, GELU and residual
// kernels) took thirteen:
//   attn_in    LayerNorm -> qkv + bias in the compute dtype, left to the attention, which reads q, k
//              and v from it and stores k, v into the cache (fused_attention_qkv: batched decode,
//              bf16 prefill); fp32 prefill runs qkv_split first (q rows out, k/v into the cache).
//              Layer 0's LayerNorm is the embedding kernel's.
//   attn_out   x += atty @ attprojw^T + attprojb, one GEMM (beta = 1 on the fp32 residual)
//   mlp_in     LayerNorm -> gelu(fc + bias) into h, one GEMM (fp32: a GELU pass follows, matmul_lt.h)
//   mlp_out    x += h @ fcprojw^T + fcprojb, one GEMM
//   logits     LayerNorm -> ln @ wte[:V]^T, rows logits_ld apart: logits_rows (bf16 on Hopper, to 64
//              rows), else cuBLASLt; logits_rows, and the GEMV where it takes the logits, also take
//              greedy decoding's tokens
//              (no sampler kernel after them)
// Five at 1-16 rows in bf16 on Hopper (decode to batch 16, short prompts): there qkv and fc take their
// LayerNorm inside the product (gemm_rows_ln, ln_in_product below), with beta and the bias folded into b'.
// Five past layer 0 at 17-64 rows too: there the residual products write a copy of their rows for the
// next LayerNorm and qkv and fc fold it with the statistics taken beside their MMAs (gemm_rows_fold,
// ln_folded below). A prompt's 129-1024 rows of GPT-2 124M take gemm_tiles (kernels/gemm_tiles.h) for
// all four products, folded the same way with the statistics' parts from the residual products: no
// LayerNorm kernel past the embedding's ln1 (time to the first token at 1024 tokens 0.657-0.675 ->
// 0.595-0.597 ms on an H200, docs/PERF.md "Session 60"; at 768 tokens 0.578-0.586 -> 0.514-0.518, at
// 512 0.480-0.485 -> 0.422-0.425 since "Session 62", at 200 0.394-0.399 -> 0.342-0.348 since "Session 63").
// Attention stays fused at every size (2.4-3.3x the unfused attention in prefill).
//
// The folded vectors (qkv_s/b, fc_s/b, lnf_s/b) are computed at engine creation (ln_fold.cu).
#include <stdlib.h>
#include <string.h>

#include "block_ops.h"
#include "cuda_check.h"
#include "fused_attention.h"
#include "fused_ln_linear.h"
#include "gemm_rows.h"
#include "gemm_tiles.h"
#include "kernel_util.h"  // env_off
#include "linear_residual.h"
#include "logits_rows.h"
#include "reference_kernels.h"

#define FUSED_TRY(call)                                                                         \
    do {                                                                                        \
        int e_ = (call);                                                                        \
        if (e_ != 0) return cuda_fail(err, (cudaError_t)e_, #call, __FILE__, __LINE__);         \
    } while (0)

// The most rows the fused linear kernels take for a product of M x K -> N; more go through the
// many-row route (the LayerNorm kernel where there is one, then gemm_rows or cuBLASLt:
// many_rows_product below).
// bf16 where gemm_rows takes the product (Hopper): 0 for the projections, qkv and fc (gemm_rows at
// every row count, after the LayerNorm kernel or with it inside for qkv and fc), and 0 for the
// logits where logits_rows takes them; elsewhere 32 with the LayerNorm (the cluster GEMV) and without it
// (the skinny kernel), the logits 4; before sm_90: 4 (fused_linear_rows).
// Decode of GPT-2 124M on an H200, bench --quick, tokens/s (docs/PERF.md):
//   - the projections through gemm_rows at every batch against the skinny kernel (to 32 rows) and
//     cuBLASLt: B=1 +8%, B=2-16 +14-19% ("Session 22");
//   - LayerNorm + gemm_rows for qkv and fc against the cluster GEMV: B=8 -7%, B=16 -9%, B=24 +9%,
//     B=32 +12% ("Session 21"; with the projections on gemm_rows, B=8 -8%, B=16 -6%: "Session 22");
//     with the LayerNorms in the projections' epilogues instead of kernels, B=1 -4%, B=2 +9%,
//     B=4 +17%, B=8 +15%, B=16 +14% ("Session 23"); since the LayerNorm kernel loads its weights
//     before its wait ("Session 32"), the kernel from 2 rows against those epilogues: B=2 +6.5%,
//     B=4 +7.6%, B=8 +4.6%, B=16 +1.5%, B=24 +2%, B=128 +11% ("Session 33"), and at one row against
//     the cluster GEMV +4.3% ("Session 34"); gemm_rows_ln, the LayerNorm inside the product, lost to
//     the kernel at every batch in this chain (B=1 -7%, B=64 -15%, "Session 34"); since its
//     epilogue's chains overlap it wins at 2-16 rows ("Session 37") and at one row (B=1 +6%,
//     "Session 38"; LN_ROWS_TO below);
//   - before gemm_rows, the cluster GEMV for the LayerNorm ops against LayerNorm + cuBLASLt: B=8
//     18,040 vs 15,271, B=16 34,741 vs 29,598, B=32 59,796 vs 57,852, B=64 95,609 vs 117,261
//     ("Session 4"); the skinny kernel for the projections against cuBLASLt's bias + residual
//     epilogue: B=8 +10%, B=16 +10%, B=32 +6%, slower at 48 and 64 rows ("Session 10"; since its warps
//     split K, another +8% at B=8 and 16, and about even at 48 and 64: "Session 11").
// The logits (bf16) go through the LayerNorm kernel and logits_rows where it takes them (Hopper;
// kernels/logits_rows.h): B=2-4 +3-4% against the GEMV, B=5-64 +1.4-2.5% against the LayerNorm
// kernel + cuBLASLt ("Session 24", then with lnf folded in), and at one row B=1 +2.0% against the
// GEMV with lnf inside once qkv and fc had left the GEMVs ("Session 38");
// elsewhere the GEMV to 4 rows, then cuBLASLt (gemm_rows ran them 0.89x at 8-16 rows and 0.56x at 64:
// "Session 22").
// fp32: 16 (cuBLAS runs true fp32 on FMAs, no TF32, and the GEMV stays ahead to M = 16:
// docs/PERF.md, "Fused LayerNorm + Linear"), and the LayerNorm ops to 64 rows wherever the fp32 rows
// kernel takes them (tensor cores, 3xTF32; it takes 9-16 rows from the GEMV already): 1.5-2.4x the
// LayerNorm kernel + cuBLAS alone ("Session 36"; decode in the engine in "Session 37").
// GPT2_FUSED_ROWS=N overrides all three (0: every step through the many-row route),
// GPT2_FUSED_ROWS=N,P the ops with the LayerNorm (N) and the others (P) apart, GPT2_FUSED_ROWS=N,P,L
// the logits (L) apart from the plain ops too, to measure the crossover (scripts/gpu_check.sh
// crossover).
// The fewest rows gemm_rows takes qkv and fc over from the cluster GEMV: every row count. The
// LayerNorm epilogues of sessions 22-24 (ln2 in the attention projection, ln1 folded into qkv from
// the MLP projection's statistics, lnf into the logits) replaced the LayerNorm kernel there until it
// loaded its weights before its wait; then they lost at every row count (docs/PERF.md, "Session 33"),
// and went. Without them the LayerNorm kernel and gemm_rows beat the cluster GEMV at one row too
// (B = 1 +4.3%, "Session 34").
enum { GEMM_ROWS_FROM = 1 };
// qkv and fc through gemm_rows_ln (the LayerNorm inside the product, gemm_rows.h) at 1-16 rows of
// the many-row route, so no LayerNorm kernel and boundary before them: decode B = 1 +6.6% (three
// A/B runs, a one-token prompt -6%), B = 2 +2.2-4.0%, B = 4 +1.9%, B = 8 +2.6-3.0%, B = 16 +1.2-1.7%
// on an H200, short prompts even; past 16 rows (its 32-row tiles) it lost 3-4% (B = 32-64)
// (docs/PERF.md, "Session 37", "Session 38"; session 34's kernel had lost 7% at one row).
// GPT2_LN_ROWS=N takes it to N rows (0: never).
enum { LN_ROWS_TO = 16 };

static int fused_rows(const GpuState *s, LinearOp op, int M, int N, int K) {
    static int forced[3] = {-2, -2, -2};  // [LinearOp]; -2: not read yet; -1: not set
    if (forced[0] == -2) {
        const char *env = getenv("GPT2_FUSED_ROWS");
        forced[LINEAR_OP_LN] = forced[LINEAR_OP_PLAIN] = forced[LINEAR_OP_LOGITS] = env && *env ? atoi(env) : -1;
        const char *comma = env ? strchr(env, ',') : NULL;
        if (comma) forced[LINEAR_OP_PLAIN] = forced[LINEAR_OP_LOGITS] = atoi(comma + 1);
        if (comma && (comma = strchr(comma + 1, ','))) forced[LINEAR_OP_LOGITS] = atoi(comma + 1);
    }
    if (forced[op] >= 0) return forced[op];
    const int rows = fused_linear_rows(s->dtype, op);
    if (op == LINEAR_OP_LOGITS)
        return s->dtype == DTYPE_BF16 && logits_rows_takes(M, K) ? 0 : rows;
    if (s->dtype == DTYPE_F32 && op == LINEAR_OP_LN && fused_ln_linear_rows_f32_takes(M, N, K))
        return M;  // these rows stay on the fused op
    if (s->dtype != DTYPE_BF16 || !gemm_rows_takes(M, N, K)) return rows;
    if (op == LINEAR_OP_PLAIN) return 0;
    return M >= GEMM_ROWS_FROM && rows >= GEMM_ROWS_FROM ? GEMM_ROWS_FROM - 1 : rows;
}

// Whether the many-row route's product of M rows to N columns (qkv or fc) takes its LayerNorm inside
// (gemm_rows_ln), not from the LayerNorm kernel.
static int ln_in_product(const GpuState *s, int M, int N) {
    static int most = -2;  // -2: GPT2_LN_ROWS not read yet
    if (most == -2) {
        const char *env = getenv("GPT2_LN_ROWS");
        most = env && *env ? atoi(env) : LN_ROWS_TO;
    }
    return s->dtype == DTYPE_BF16 && M <= most && gemm_rows_ln_takes(M, N, s->C);
}

// A product of the many-row route: gemm_rows (bf16, a K that fits, on Hopper) where
// it takes the shape, since it joins the step's PDL chain where cuBLASLt's kernels cannot
// (docs/PERF.md, "Session 21"; GPT2_GEMM_ROWS=0 turns it off); gemm_tiles for a prompt's 129-1024
// rows of GPT-2 124M (gemm_tiles.h; GPT2_GEMM_TILES=0 turns it off); else cuBLASLt.
static int many_rows_product(GpuState *s, MatmulLtEpilogue epi, void *y, long long ldy, const void *x, const void *W,
                             const void *bias, int M, int N, int K, float *scratch, Error *err) {
    if (s->dtype == DTYPE_BF16 && gemm_rows_takes(M, N, K)) {
        CUDA_TRY(gemm_rows(epi, y, ldy, x, W, bias, M, N, K, s->stream));
        return 0;
    }
    if (s->dtype == DTYPE_BF16 && gemm_tiles_takes(M, N, K)) {
        CUDA_TRY(gemm_tiles(epi, y, ldy, x, W, bias, M, N, K, s->stream));
        return 0;
    }
    CUBLAS_TRY(matmul_lt(s->lt, epi, y, ldy, x, W, s->dtype, bias, M, N, K, scratch, s->stream));
    return 0;
}

// The table's workspace (s->workspace, allocated zeroed with the activations): the flash-decoding
// partials and split counters; greedy decoding's row bests and ticket in the logits' kernel
// (GREEDY_ROWS at most, left zero by every call).
// logits_rows takes greedy decoding's pick at every row count it runs (2-64), and then writes only
// the ids, not the logits: B = 2-32 +0.5-1.1% for the pick in the engine ("Session 27" in
// docs/PERF.md); with the logits' stores gone, B = 32 +0.9% and the step 0.3-0.6% shorter at 32-64
// rows, where the pick alone had saved nothing ("Session 30"). The GEMV takes it at the rows it
// takes the logits (Hopper: one; before it, to 4): PERF.md, "Session 28".
enum { GREEDY_ROWS = 64 };
// Then the LayerNorm fold's row means (ln_folded below): qkv's and fc's, each the shift c of the copy
// the next residual product writes; and gemm_tiles's statistics' parts, from a residual product to
// the folded product after it.
enum { MEAN_ROWS = GEMM_ROWS_FOLD_MAX_ROWS > GEMM_TILES_MAX_ROWS ? GEMM_ROWS_FOLD_MAX_ROWS : GEMM_TILES_MAX_ROWS };
typedef struct {
    size_t attention;                 // bytes
    unsigned long long *greedy_best;  // [GREEDY_ROWS], then the ticket
    float *qkv_mean, *fc_mean;        // [MEAN_ROWS] each
    float *tiles_parts;               // [GEMM_TILES_MAX_ROWS][GEMM_TILES_MAX_PARTS][2]
    size_t bytes;                     // all of it
} FusedWorkspace;

// The layout, in one place: the pointers into s->workspace (NULL before it exists) and its size.
static FusedWorkspace fused_workspace(const GpuState *s) {
    FusedWorkspace w;
    w.attention = align256(fused_attention_workspace_size(s->max_batch, s->NH, s->HS, s->max_seq));
    const size_t means = w.attention + align256((GREEDY_ROWS + 1) * 8);
    const size_t parts = means + align256(2 * MEAN_ROWS * sizeof(float));
    w.bytes = parts + (size_t)GEMM_TILES_MAX_ROWS * GEMM_TILES_MAX_PARTS * 2 * sizeof(float);
    char *base = (char *)s->workspace;
    w.greedy_best = base ? (unsigned long long *)(base + w.attention) : NULL;
    w.qkv_mean = base ? (float *)(base + means) : NULL;
    w.fc_mean = base ? w.qkv_mean + MEAN_ROWS : NULL;
    w.tiles_parts = base ? (float *)(base + parts) : NULL;
    return w;
}

static size_t fused_workspace_bytes(const GpuState *s) { return fused_workspace(s).bytes; }

// The many-row route's qkv product stays in s->scratch for the attention to read (it also stores the
// new keys and values into the cache) where the attention can: bf16 prefill and batched decode of one
// token a sequence. Elsewhere (fp32 prefill, T = 2..4) qkv_split copies q out and k, v into the cache
// first. The one place both ops ask.
static int attention_reads_qkv(const GpuState *s, const GpuStep *st) {
    return st->M > fused_rows(s, LINEAR_OP_LN, st->M, 3 * s->C, s->C) &&
           fused_attention_takes_qkv(s->dtype, st->T, s->HS);
}

// The logits of `rows` rows go through logits_rows (bf16 on Hopper, at every row count it takes: one
// persistent kernel streaming wte, docs/PERF.md "Session 24"), else the LayerNorm kernel and cuBLASLt.
static int logits_take_rows(const GpuState *s, int rows) {
    return s->dtype == DTYPE_BF16 && rows > fused_rows(s, LINEAR_OP_LOGITS, rows, s->V, s->C) &&
           logits_rows_takes(rows, s->C);
}

// Layer 0's ln1 comes from the embedding kernel wherever its qkv takes the many-row route (prefill,
// and decode on Hopper) without the LayerNorm inside: that route's LayerNorm
// kernel and its boundary go (docs/PERF.md, "Session 29"). The one place both ask.
static int fused_embedding_writes_ln1(const GpuState *s, const GpuStep *st) {
    return st->M > fused_rows(s, LINEAR_OP_LN, st->M, 3 * s->C, s->C) && !ln_in_product(s, st->M, 3 * s->C);
}

// Whether a step of M rows folds its LayerNorms into the products after them (gemm_rows.h, "The
// LayerNorm folded into the product"): past gemm_rows_ln's rows, where every product of the block takes
// the many-row route through gemm_rows (the residual products write the copies the folded ones read,
// so all four must agree: this is the one place they ask). ln1 from layer 1 on (layer 0's comes from
// the embedding kernel), ln2 in every layer; s->ln holds the copy, FusedWorkspace the means.
// On an H200 (124M, decode, against the LayerNorm kernel and gemm_rows): docs/PERF.md, "Session 50".
// GPT2_LN_FOLD=0 turns it off (to compare routes).
// A prompt's 129-1024 rows fold through gemm_tiles (its residual products write the statistics'
// parts, not only the copy): a 1024-row layer's four products 37.8 against 41.1-41.9 us with
// cuBLASLt and the LayerNorm kernels on an H200 (docs/PERF.md, "Session 60").
static int tiles_folded(const GpuState *s, int M) {
    const int C = s->C;
    return s->dtype == DTYPE_BF16 && gemm_tiles_takes(M, 3 * C, C) && gemm_tiles_takes(M, C, C) &&
           gemm_tiles_takes(M, 4 * C, C) && gemm_tiles_takes(M, C, 4 * C) && gemm_tiles_parts(C) > 0;
}

static int ln_folded(const GpuState *s, int M) {
    static int off = -1;
    if (off < 0) off = env_off("GPT2_LN_FOLD");
    const int C = s->C;
    if (!off && tiles_folded(s, M)) return 1;
    return !off && s->dtype == DTYPE_BF16 && M > 0 && !ln_in_product(s, M, 3 * C) && !ln_in_product(s, M, 4 * C) &&
           M > fused_rows(s, LINEAR_OP_LN, M, 3 * C, C) && M > fused_rows(s, LINEAR_OP_LN, M, 4 * C, C) &&
           M > fused_rows(s, LINEAR_OP_PLAIN, M, C, C) && M > fused_rows(s, LINEAR_OP_PLAIN, M, C, 4 * C) &&
           gemm_rows_takes(M, C, C) && gemm_rows_takes(M, C, 4 * C) && gemm_rows_fold_takes(M, 3 * C, C) &&
           gemm_rows_fold_takes(M, 4 * C, C);
}

// A folded product (qkv from layer 1 on, fc): the LayerNorm's copy in s->ln, the rows' statistics
// from s->x; c is the mean the other folded product measured last (the one the copy was made with),
// and this product's means go to its own buffer.
static int folded_product(GpuState *s, const GpuStep *st, MatmulLtEpilogue epi, void *y, int N, const void *W,
                          const float *fs, const float *fb, const float *shift, float *mean_out, Error *err) {
    if (tiles_folded(s, st->M)) {  // the statistics from the residual product's parts
        const GemmTilesFold in = {s->ln, fused_workspace(s).tiles_parts, gemm_tiles_parts(s->C), shift, mean_out};
        CUDA_TRY(gemm_tiles_fold(epi, y, N, &in, W, fs, fb, st->M, N, s->C, s->stream));
        return 0;
    }
    const GemmRowsFold in = {s->x, s->C, s->ln, shift, mean_out};
    CUDA_TRY(gemm_rows_fold(epi, y, N, &in, W, fs, fb, st->M, N, s->C, s->stream));
    return 0;
}

// A residual product that writes the copy for the next LayerNorm (gamma, the shift c its consumer
// will be given), or NULL (the last layer: lnf goes through its kernel).
static int residual_product(GpuState *s, const GpuStep *st, const void *x, const void *W, const void *bias, int K,
                            const float *gamma, const float *shift, Error *err) {
    if (!gamma)
        return many_rows_product(s, MATMUL_LT_BIAS_RESIDUAL, s->x, s->C, x, W, bias, st->M, s->C, K, NULL, err);
    if (tiles_folded(s, st->M)) {  // and the statistics' parts
        const GemmTilesCopy copy = {s->ln, gamma, shift, fused_workspace(s).tiles_parts};
        CUDA_TRY(gemm_tiles_residual_copy(s->x, s->C, x, W, (const float *)bias, st->M, s->C, K, &copy, s->stream));
        return 0;
    }
    const GemmRowsCopy copy = {s->ln, gamma, shift};
    CUDA_TRY(gemm_rows_residual_copy(s->x, s->C, x, W, bias, st->M, s->C, K, &copy, s->stream));
    return 0;
}

static int fused_attn_in(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    if (st->M > fused_rows(s, LINEAR_OP_LN, st->M, 3 * s->C, s->C)) {
        if (l > 0 && ln_folded(s, st->M)) {
            const FusedWorkspace w = fused_workspace(s);
            if (folded_product(s, st, MATMUL_LT_BIAS, s->scratch, 3 * s->C, ly->qkvw, ly->qkv_s, ly->qkv_b, w.fc_mean,
                               w.qkv_mean, err))
                return -1;
        } else if (ln_in_product(s, st->M, 3 * s->C)) {
            CUDA_TRY(gemm_rows_ln(MATMUL_LT_BIAS, s->scratch, 3 * s->C, s->x, s->C, ly->ln1w, ly->qkvw, ly->qkv_b,
                                  st->M, 3 * s->C, s->C, s->stream));
        } else {
            if (l > 0 || !fused_embedding_writes_ln1(s, st))
                CUDA_TRY(layernorm_forward(s->ln, s->x, ly->ln1w, ly->ln1b, st->M, s->C, s->dtype, s->stream));
            if (many_rows_product(s, MATMUL_LT_BIAS, s->scratch, 3 * s->C, s->ln, ly->qkvw, ly->qkvb_c, st->M,
                                  3 * s->C, s->C, NULL, err))
                return -1;
        }
        if (!attention_reads_qkv(s, st))
            CUDA_TRY(qkv_split(s->q, ly->k_cache, ly->v_cache, s->scratch, st->B, st->T, st->pos, st->pos_device,
                               s->NH, s->HS, s->max_seq, s->dtype, s->stream));
        return 0;
    }
    QKVDest dst = {s->q, ly->k_cache, ly->v_cache, st->T, st->pos, s->NH, s->HS, s->max_seq, st->pos_device};
    FUSED_TRY(fused_ln_linear(s->x, ly->ln1w, ly->qkvw, s->dtype, ly->qkv_s, ly->qkv_b, NULL, s->dtype, st->M, 3 * s->C,
                              s->C, ACT_NONE, &dst, s->stream));
    return 0;
}

static int fused_attention_op(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    // In a decode graph the position is read on the device; the host's only bounds it.
    const int pos = st->pos_device ? s->max_seq - st->T : st->pos;
    if (attention_reads_qkv(s, st)) {
        FUSED_TRY(fused_attention_qkv(s->scratch, ly->k_cache, ly->v_cache, s->atty, s->dtype, st->B, st->T, pos,
                                      st->pos_device, s->NH, s->HS, s->max_seq, s->workspace,
                                      fused_workspace(s).attention, s->stream));
        return 0;
    }
    FUSED_TRY(fused_attention(s->q, ly->k_cache, ly->v_cache, s->atty, s->dtype, st->B, st->T, pos, st->pos_device,
                              s->NH, s->HS, s->max_seq, s->workspace, fused_workspace(s).attention, s->stream));
    return 0;
}

// The shift c of ln2's copy and of fc's fold, which must agree: qkv's means from layer 1 on, where qkv
// folded its LayerNorm over this step's rows; none (c = 0, as in layer 0) where the rows were gathered
// after the attention, since qkv's means then belong to other rows (or, past gemm_rows_fold's rows, to
// an earlier step, and a prompt's logits would depend on what ran before it).
static const float *qkv_shift(const GpuState *s, const GpuStep *st, int l) {
    return l > 0 && !st->rows_gathered ? fused_workspace(s).qkv_mean : NULL;
}

// None of the ops below depends on the position.
static int fused_attn_out(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    if (st->M > fused_rows(s, LINEAR_OP_PLAIN, st->M, s->C, s->C)) {
        const int fold = ln_folded(s, st->M);  // the copy for ln2
        return residual_product(s, st, s->atty, ly->attprojw, ly->attprojb, s->C, fold ? ly->ln2w : NULL,
                                qkv_shift(s, st, l), err);
    }
    FUSED_TRY(linear_residual(s->atty, ly->attprojw, s->dtype, ly->attprojb, s->x, st->M, s->C, s->C, s->stream));
    return 0;
}

static int fused_mlp_in(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    if (st->M > fused_rows(s, LINEAR_OP_LN, st->M, 4 * s->C, s->C)) {
        if (ln_folded(s, st->M))
            return folded_product(s, st, MATMUL_LT_BIAS_GELU, s->h, 4 * s->C, ly->fcw, ly->fc_s, ly->fc_b,
                                  qkv_shift(s, st, l), fused_workspace(s).fc_mean, err);
        if (ln_in_product(s, st->M, 4 * s->C)) {
            CUDA_TRY(gemm_rows_ln(MATMUL_LT_BIAS_GELU, s->h, 4 * s->C, s->x, s->C, ly->ln2w, ly->fcw, ly->fc_b, st->M,
                                  4 * s->C, s->C, s->stream));
            return 0;
        }
        CUDA_TRY(layernorm_forward(s->ln, s->x, ly->ln2w, ly->ln2b, st->M, s->C, s->dtype, s->stream));
        if (many_rows_product(s, MATMUL_LT_BIAS_GELU, s->h, 4 * s->C, s->ln, ly->fcw, ly->fcb_c, st->M, 4 * s->C,
                              s->C, s->scratch, err))
            return -1;
        return 0;
    }
    FUSED_TRY(fused_ln_linear(s->x, ly->ln2w, ly->fcw, s->dtype, ly->fc_s, ly->fc_b, s->h, s->dtype, st->M, 4 * s->C,
                              s->C, ACT_GELU, NULL, s->stream));
    return 0;
}

static int fused_mlp_out(GpuState *s, const GpuStep *st, int l, Error *err) {
    const GpuLayer *ly = &s->layers[l];
    if (st->M > fused_rows(s, LINEAR_OP_PLAIN, st->M, s->C, 4 * s->C)) {
        const int fold = l + 1 < s->L && ln_folded(s, st->M);  // the copy for the next ln1, shifted by fc's means
        return residual_product(s, st, s->h, ly->fcprojw, ly->fcprojb, 4 * s->C, fold ? s->layers[l + 1].ln1w : NULL,
                                fused_workspace(s).fc_mean, err);
    }
    FUSED_TRY(linear_residual(s->h, ly->fcprojw, s->dtype, ly->fcprojb, s->x, st->M, s->C, 4 * s->C, s->stream));
    return 0;
}

// Greedy decoding's pick inside the logits' kernel (greedy_pick.h: logits_rows or the GEMV) where the
// step asks for it: each sequence's token, so that no sampler kernel runs after the logits, and
// only the tokens (the step reads nothing else).
static const LogitsGreedy *logits_greedy(const GpuState *s, const GpuStep *st, int all_positions, LogitsGreedy *g) {
    if (!st->greedy_next || all_positions || st->B > GREEDY_ROWS) return NULL;
    const FusedWorkspace w = fused_workspace(s);
    *g = (LogitsGreedy){.next = st->greedy_next,
                        .best = w.greedy_best,
                        .ticket = (unsigned *)(w.greedy_best + GREEDY_ROWS),
                        .ids_only = 1,
                        .next_copy = st->next_staging ? st->next_staging + 1 : NULL};
    *st->greedy_written = 1;
    return g;
}

static int fused_logits(GpuState *s, const GpuStep *st, int all_positions, Error *err) {
    const int rows = all_positions ? st->M : st->B;
    LogitsGreedy greedy;
    // Past the fused rows the LayerNorm kernel, then logits_rows or cuBLASLt.
    if (rows > fused_rows(s, LINEAR_OP_LOGITS, rows, s->V, s->C)) {
        CUDA_TRY(layernorm_forward(s->ln, s->x, s->lnfw, s->lnfb, rows, s->C, s->dtype, s->stream));
        if (logits_take_rows(s, rows)) {
            CUDA_TRY(logits_rows(s->logits, s->logits_ld, s->ln, s->C, s->wte, rows, s->V, s->C,
                                 logits_greedy(s, st, all_positions, &greedy), s->stream));
            return 0;
        }
        // All logits_ld columns (wte's padding rows are zero): with N = V = 50257 cuBLASLt falls back
        // to an unvectorised sm75 kernel, 6x slower.
        CUBLAS_TRY(matmul_lt(s->lt, MATMUL_LT_NONE, s->logits, s->logits_ld, s->ln, s->wte, s->dtype, NULL, rows,
                             s->logits_ld, s->C, NULL, s->stream));
        return 0;
    }
    FUSED_TRY(fused_ln_linear_ex(s->x, s->C, s->lnfw, s->wte, s->dtype, s->lnf_s, s->lnf_b, s->logits, s->logits_ld, DTYPE_F32,
                                 rows, s->V, s->C, ACT_NONE, NULL, logits_greedy(s, st, all_positions, &greedy),
                                 LINEAR_PATH_AUTO, s->stream));
    return 0;
}

const BlockOps fused_ops = {
    .name = "gpu",
    .unfused_buffers = 1,  // ln and scratch for the cuBLASLt route of many rows
    .score_buffers = 0,
    .device_position = 1,
    .workspace_bytes = fused_workspace_bytes,
    .embedding_writes_ln1 = fused_embedding_writes_ln1,
    .attn_in = fused_attn_in,
    .attention = fused_attention_op,
    .attn_out = fused_attn_out,
    .mlp_in = fused_mlp_in,
    .mlp_out = fused_mlp_out,
    .logits = fused_logits,
};
