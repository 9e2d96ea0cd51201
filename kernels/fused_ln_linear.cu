// LayerNorm + Linear (+ GELU) in one pass: the launcher. What is computed, the output modes and
// the numerics are in fused_ln_linear.h; the kernels are in linear_kernels.cuh (shared with
// linear_residual.cu).
#include "fused_ln_linear.h"

#include <stdint.h>

#include "gemm_rows.h"
#include "linear_kernels.cuh"

extern "C" int fused_ln_linear_ex(const float *x, long long ldx, const float *ln_gamma, const void *W, DType wtype,
                                  const float *s, const float *b_folded, void *y, long long ldy, DType ytype, int M,
                                  int N, int K, Activation act, const QKVDest *qkv, const LogitsGreedy *greedy,
                                  LinearPath path, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldx < K || !x || !ln_gamma || !W || !s) return cudaErrorInvalidValue;
    if (wtype != DTYPE_F32 && wtype != DTYPE_BF16) return cudaErrorInvalidValue;
    if (ytype != DTYPE_F32 && ytype != DTYPE_BF16) return cudaErrorInvalidValue;
    if (path < LINEAR_PATH_AUTO || path > LINEAR_PATH_ROWS_F32) return cudaErrorInvalidValue;
    if (greedy && (qkv || ytype != DTYPE_F32 || act != ACT_NONE || !greedy->next || !greedy->best ||
                   !greedy->ticket || (uintptr_t)greedy->best % 8 ||
                   (path != LINEAR_PATH_AUTO && path != LINEAR_PATH_GEMV)))
        return cudaErrorInvalidValue;
    if (M == 0) return cudaSuccess;
    // gemm_rows_ln wherever it takes the call: on an H200 1.1-2.0x the next best path (the GEMVs, the
    // tiled kernel) at 1-64 rows of 768 -> 3072 and 1024 -> 4096 (docs/PERF.md, "Session 34").
    if (path == LINEAR_PATH_AUTO && !qkv && !greedy && wtype == DTYPE_BF16 && ytype == DTYPE_BF16 && y &&
        ldy >= N && ldx % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)ln_gamma % 16 == 0 &&
        (uintptr_t)W % 16 == 0 && gemm_rows_ln_takes(M, N, K))
        path = LINEAR_PATH_ROWS;
    if (path == LINEAR_PATH_ROWS) {
        if (qkv || wtype != DTYPE_BF16 || ytype != DTYPE_BF16 || !y || ldy < N) return cudaErrorInvalidValue;
        return (int)gemm_rows_ln(act == ACT_GELU ? MATMUL_LT_BIAS_GELU : MATMUL_LT_BIAS, y, ldy, x, ldx, ln_gamma, W,
                                 b_folded, M, N, K, stream);
    }
    lin::Epilogue e = {};
    e.gelu = act == ACT_GELU;
    e.y_bf16 = ytype == DTYPE_BF16;
    e.bias = b_folded;
    e.s = s;
    e.N = N;
    if (qkv) {
        const int C = qkv->num_heads * qkv->head_size;
        if (qkv->num_heads <= 0 || qkv->head_size <= 0 || N != 3 * C || qkv->T <= 0 || M % qkv->T != 0 ||
            qkv->pos < 0 || qkv->pos + qkv->T > qkv->max_seq || !qkv->q || !qkv->k_cache || !qkv->v_cache)
            return cudaErrorInvalidValue;
        e.mode = lin::OUT_QKV;
        e.y = qkv->q;
        e.k_cache = qkv->k_cache;
        e.v_cache = qkv->v_cache;
        e.T = qkv->T;
        e.pos = qkv->pos;
        e.nh = qkv->num_heads;
        e.hs = qkv->head_size;
        e.max_seq = qkv->max_seq;
        e.C = C;
        e.pos_dev = qkv->pos_device;
    } else {
        if (!y || ldy < N) return cudaErrorInvalidValue;
        e.mode = lin::OUT_PLAIN;
        e.y = y;
        e.ldy = ldy;
    }
    if (greedy) {  // the GEMV takes the pick
        e.pick = *greedy;
        path = LINEAR_PATH_GEMV;
    }
    return (int)lin::launch_linear<true>(x, ldx, ln_gamma, W, wtype == DTYPE_BF16, M, N, K, e, (int)path, stream);
}

extern "C" int fused_ln_linear(const float *x, const float *ln_gamma, const void *W, DType wtype, const float *s,
                               const float *b_folded, void *y, DType ytype, int M, int N, int K, Activation act,
                               const QKVDest *qkv, cudaStream_t stream) {
    return fused_ln_linear_ex(x, K, ln_gamma, W, wtype, s, b_folded, y, N, ytype, M, N, K, act, qkv, NULL,
                              LINEAR_PATH_AUTO, stream);
}

extern "C" int fused_ln_linear_rows_f32_takes(int M, int N, int K) {
    lin::DeviceInfo d;
    return !lin::device_info(&d) && M >= lin::RF_FROM && M <= lin::RF_MAX_ROWS && lin::rows_f32_shape_fits(M, N, K, d);
}

extern "C" int fused_linear_rows(DType wtype, LinearOp op) {
    lin::DeviceInfo d;
    if (lin::device_info(&d)) return 0;
    if (wtype != DTYPE_BF16) return 16;
    if (d.cc < 90 || op == LINEAR_OP_LOGITS) return 4;
    return op == LINEAR_OP_LN ? lin::CL_LN_MAX_ROWS : lin::SK_ENGINE_MAX_ROWS;
}
