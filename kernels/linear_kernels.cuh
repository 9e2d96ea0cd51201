// The kernels behind fused_ln_linear.cu and linear_residual.cu (issue 5): one family of
// "y = x W^T" kernels for W [N, K] row-major (llm.c layout), each with an optional LayerNorm in
// front (fused into the K loop) and one of three epilogues behind:
//   OUT_PLAIN     y[m, n] = act(v)                      fp32 or bf16, row stride ldy
//   OUT_QKV       as PLAIN, but column n of 3C goes to q [M, C] or this layer's K/V cache
//   OUT_RESIDUAL  residual[m, n] += v                   fp32, read-modify-write
// where v = acc + b[n] (plain linear), or v = rstd (acc - dmean s[n]) + b'[n] (LayerNorm folded,
// docs/DESIGN.md; dmean and acc taken around a per-row shift, see "Numerics" in fused_ln_linear.h).
//
// Seven kernels, picked by the launchers by M and dtype (auto_path, at the end):
//   gemv_kernel     M <= 16 (decode). Each block stages its rows of x in shared memory once
//                   (with LN shifted and scaled by gamma there; each warp takes exact two-pass
//                   statistics of whole rows with shuffles, and the epilogue applies the folded
//                   form), then each warp streams whole W rows with 16-byte loads, NPW rows at a
//                   time, every SM busy; lanes split K, a butterfly sums them.
//   gemv_tc_kernel  bf16, 8 < M <= 16 with LN: the same staging (rows as bf16), then mma.sync fed
//                   with W straight from global memory into B fragments.
//   cluster_kernel  bf16, 4 < M <= 32 with LN on sm_90: the GEMV layout with the rows of x
//                   normalised and staged once per thread-block cluster through distributed
//                   shared memory, W in registers feeding mma.sync.
//   skinny_kernel   bf16, 4 < M <= 64 without LN on sm_90: a BM x 64-128 output tile a block,
//                   its W slice in shared memory before the PDL wait, K split over the block's
//                   warps and over a cluster.
//   tc_kernel       bf16, larger M (prefill). mma.sync m16n8k16 bf16 -> fp32, ldmatrix, cp.async
//                   rings of W, x and gamma tiles. With LN the fp32 x tile is shifted, summed
//                   (row statistics in the same K loop), scaled by gamma and rounded to bf16 in
//                   shared memory before the MMAs.
//   rows_f32_kernel fp32 with LN, 9 <= M <= 64: a block's 24-32 columns of W in shared memory, a
//                   chunk ahead of x's chunks; x normalised in registers as the MMAs' A fragments
//                   are built (the tiled kernels' shifted statistics); 3xTF32 mma.sync (fp32-level
//                   error on tensor cores).
//   simt_kernel     fp32, larger M: register-tiled FFMA (no plain TF32: the fp32 path must match fp32
//                   references to 1e-5), same LN handling as tc_kernel.
// Measured speed and what is still slow: docs/PERF.md, "Fused LayerNorm + Linear", "Session 4"
// and "Session 10".
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <stdint.h>

#include "cluster.cuh"
#include "fused_ln_linear.h"  // LinearPath
#include "greedy_pick.cuh"
#include "kernel_util.h"    // gelu_tanh
#include "mma.cuh"
#include "pdl.cuh"

namespace lin {

typedef __nv_bfloat16 bf16;

enum { OUT_PLAIN = 0, OUT_QKV = 1, OUT_RESIDUAL = 2 };

constexpr float LN_EPS = 1e-5f;

struct Epilogue {
    int mode;            // OUT_*
    int gelu;            // 1: GELU (tanh approximation) after the bias
    int y_bf16;          // PLAIN / QKV: output dtype
    void *y;             // PLAIN: [M, N] row stride ldy; QKV: q [M, C]
    long long ldy;
    void *k_cache, *v_cache;  // QKV: [B][NH][max_seq][HS]
    int T, pos, nh, hs, max_seq, C;
    const int *pos_dev;  // QKV: when not NULL, the position is read here as the kernel runs
    float *residual;     // RESIDUAL: [M, N] fp32
    const float *bias;   // b (plain linear) or b' (LN folded); NULL: none
    const float *s;      // LN folded: s_n
    int N;
    LogitsGreedy pick;   // GEMV, PLAIN fp32 without GELU: greedy decoding's pick too (pick.next NULL: none)
};

// Row m, column n with its final pre-bias value v.
__device__ __forceinline__ void epi_store(const Epilogue &e, int m, int n, float v) {
    if (e.bias) v += e.bias[n];
    if (e.mode == OUT_RESIDUAL) {
        float *p = e.residual + (size_t)m * e.N + n;
        *p += v;
        return;
    }
    if (e.gelu) v = gelu_tanh(v);
    size_t idx;
    void *dst;
    if (e.mode == OUT_QKV) {
        int which = n / e.C, c = n - which * e.C;
        if (which == 0) {
            dst = e.y;
            idx = (size_t)m * e.C + c;
        } else {
            int b = m / e.T, t = m - b * e.T;
            int h = c / e.hs, d = c - h * e.hs;
            const int pos = e.pos_dev ? __ldg(e.pos_dev) : e.pos;
            dst = which == 1 ? e.k_cache : e.v_cache;
            idx = (((size_t)b * e.nh + h) * e.max_seq + pos + t) * e.hs + d;
        }
    } else {
        dst = e.y;
        idx = (size_t)m * e.ldy + n;
    }
    if (e.y_bf16) ((bf16 *)dst)[idx] = __float2bfloat16_rn(v);
    else ((float *)dst)[idx] = v;
}

// Folded LayerNorm: v = rstd * (acc - dmean * s_n); plain: v = acc.
__device__ __forceinline__ float ln_apply(const Epilogue &e, bool ln, int n, float acc, float dmean, float rstd) {
    return ln ? rstd * (acc - dmean * e.s[n]) : acc;
}

// Columns n and n + 1 of row m (the tiled kernels' accumulator pairs): one 4- or 8-byte store when
// both land side by side and aligned, else two.
__device__ __forceinline__ void epi_store2(const Epilogue &e, int m, int n, float v0, float v1) {
    if (n + 1 >= e.N) {
        if (n < e.N) epi_store(e, m, n, v0);
        return;
    }
    if (e.mode == OUT_RESIDUAL) {
        float *p = e.residual + (size_t)m * e.N + n;
        if (e.bias) v0 += e.bias[n], v1 += e.bias[n + 1];
        if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
            float2 r = *reinterpret_cast<float2 *>(p);
            r.x += v0;
            r.y += v1;
            *reinterpret_cast<float2 *>(p) = r;
        } else {
            p[0] += v0;
            p[1] += v1;
        }
        return;
    }
    size_t idx;
    void *dst;
    if (e.mode == OUT_QKV) {
        int which = n / e.C, c = n - which * e.C;
        int h = c / e.hs, d = c - h * e.hs;
        if (d + 1 >= e.hs) {  // the pair straddles two heads (odd head size)
            epi_store(e, m, n, v0);
            epi_store(e, m, n + 1, v1);
            return;
        }
        if (which == 0) {
            dst = e.y;
            idx = (size_t)m * e.C + c;
        } else {
            int b = m / e.T, t = m - b * e.T;
            const int pos = e.pos_dev ? __ldg(e.pos_dev) : e.pos;
            dst = which == 1 ? e.k_cache : e.v_cache;
            idx = (((size_t)b * e.nh + h) * e.max_seq + pos + t) * e.hs + d;
        }
    } else {
        dst = e.y;
        idx = (size_t)m * e.ldy + n;
    }
    if (e.bias) v0 += e.bias[n], v1 += e.bias[n + 1];
    if (e.gelu) v0 = gelu_tanh(v0), v1 = gelu_tanh(v1);
    if (e.y_bf16) {
        bf16 *p = (bf16 *)dst + idx;
        if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) {
            *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(v0, v1);
        } else {
            p[0] = __float2bfloat16_rn(v0);
            p[1] = __float2bfloat16_rn(v1);
        }
    } else {
        float *p = (float *)dst + idx;
        if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
            *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
        } else {
            p[0] = v0;
            p[1] = v1;
        }
    }
}

__device__ __forceinline__ float bf16lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

// ----------------------------------------------------------------------------
// GEMV (decode): M <= MT <= 16 rows.
//
// A decode step's GEMVs are small (0.6 to 4.7 MB of bf16 weights for GPT-2 124M: 1 to 4 us at the
// H200's copy rate) and back to back, so what costs is not the arithmetic but (a) bytes in flight:
// DRAM needs ~25-30 KB outstanding per SM to run at full rate, and (b) the boundary between
// kernels: drain, launch, and a DRAM latency before the first weights arrive. So:
//   - every SM gets an even share of W, and each warp issues its whole first batch of 16-byte
//     loads (U chunks x NPW rows: up to 8 KB a warp) before it does anything else;
//   - that first batch is issued before pdl_wait() (kernels/pdl.cuh): the weights do not depend
//     on the previous kernel, so under programmatic dependent launch they stream in while it
//     finishes. 256-thread blocks, one per SM, leave room for the next kernel's block beside it:
//     the one-row kernel is held to 112 registers (3 batches of 16 bytes per row in flight, all
//     of K = 768), so that two GEMV blocks and a decode-attention block (64 registers x 128
//     threads) fit in one SM's 64K registers;
//   - when W has few rows and long ones (the MLP projection: 768 rows of 3072), the K range is
//     split over the KSPLIT warps of a warp group, so that all of an SM's share is in flight at
//     once instead of one warp walking it batch by batch; the group's partial sums meet in shared
//     memory.
//
// The LayerNorm is kept short after the wait:
//   - gamma is staged before the wait: after a step's weights it is no longer in L2;
//   - the rows are staged as gamma (x - c), c = x[0], with a second copy x - c;
//   - the two-pass statistics of whole rows come from that copy, with shuffles only. At one row
//     a warp that holds no W rows takes them while the others multiply, else every warp takes
//     them itself (no block barrier);
//   - the epilogue applies them: rstd (acc - dmean s_n) + b'.
// Normalising the rows in shared memory first (block-wide sums, three barriers) cost ~1 us a
// call; the statistics now ~0.4 (docs/PERF.md, "Session 9").
//
// Shared memory: xs[MT][KP] of XT (fp32, or bf16 for a bf16 plain-linear x), KP = K rounded up to
// one warp chunk (32 lanes x VEC). With fp32 xs and bf16 W (VEC = 8) a lane needs 8 consecutive
// floats = two 16-byte reads 32 bytes apart from its neighbour's: a 2-way bank conflict. So within
// each 256-element chunk the first halves of all lanes' 8-groups are stored first, then the second
// halves (xs_pos), and each of the lane's two reads is conflict-free.

constexpr int GEMV_THREADS = 256;
constexpr int GEMV_WARPS = GEMV_THREADS / 32;
// Shared memory a GEMV of one block an SM leaves beside its block for the next kernel's (launch_gemv_mt).
constexpr int GEMV_ROOM = 128 * 1024;

// Shared memory of a GEMV block in bytes: xs [mt][KP] of XT; with LN the shifted rows xr [mt][KP],
// gamma [KP] and the statistics [2][mt] (fp32); the split-K partials [WARPS][32]; greedy's pick:
// each row's best rank key [mt] and the block's ticket (8 bytes).
__host__ __device__ constexpr long long gemv_smem_bytes(int mt, bool ln, long long KP, int xt_bytes) {
    return mt * KP * xt_bytes + (ln ? (mt * KP + KP + 2 * mt) * 4 : 0) + GEMV_WARPS * 32 * 4 + (mt + 1) * 8;
}

template <typename WT, typename XT>
__device__ __forceinline__ int xs_pos(int k) {
    if (sizeof(WT) == 2 && sizeof(XT) == 4)
        return (k & ~255) | (((k >> 2) & 1) << 7) | (((k >> 3) & 31) << 2) | (k & 3);
    return k;
}

// x element (m, k) of the caller's x as float.
template <typename XT>
__device__ __forceinline__ float load_x(const XT *x, long long ldx, int m, int k) {
    if constexpr (sizeof(XT) == 2) return __bfloat162float(x[(size_t)m * ldx + k]);
    else return x[(size_t)m * ldx + k];
}

// 16 bytes of a row of K elements from column k: 16 / sizeof(T) elements as raw bits, zero past K;
// vec: the row and K allow one 16-byte load.
template <typename T>
__device__ __forceinline__ uint4 load_row16(const T *row, int k, int K, bool vec) {
    constexpr int VEC = 16 / sizeof(T);
    uint4 r = make_uint4(0, 0, 0, 0);
    if (k >= K) return r;
    const T *p = row + k;
    if (vec) {
        r = __ldg(reinterpret_cast<const uint4 *>(p));
    } else {
        T tmp[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) tmp[e] = (k + e < K) ? p[e] : T(0.0f);
        memcpy(&r, tmp, 16);
    }
    return r;
}

// 16 bytes of W row n at column k; zero past N or K.
template <typename WT>
__device__ __forceinline__ uint4 load_w16(const WT *W, int N, int K, int n, int k, bool vec) {
    return n < N ? load_row16(W + (size_t)n * K, k, K, vec) : make_uint4(0, 0, 0, 0);
}

// acc[m][j] += dot(w (VEC elements), xs[m][k .. k+VEC)).
template <typename WT, typename XT, int MT, int NPW>
__device__ __forceinline__ void gemv_fma(float (&acc)[MT][NPW], const uint4 (&w)[NPW], const XT *xs, int KP, int k) {
    constexpr int VEC = 16 / sizeof(WT);
    float wf[NPW][VEC];
#pragma unroll
    for (int j = 0; j < NPW; j++) {
        if constexpr (VEC == 8) {
            const uint32_t u[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                wf[j][2 * q] = bf16lo(u[q]);
                wf[j][2 * q + 1] = bf16hi(u[q]);
            }
        } else {
            wf[j][0] = __uint_as_float(w[j].x);
            wf[j][1] = __uint_as_float(w[j].y);
            wf[j][2] = __uint_as_float(w[j].z);
            wf[j][3] = __uint_as_float(w[j].w);
        }
    }
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float xv[VEC];
        const XT *row = xs + (size_t)m * KP;
        if constexpr (sizeof(XT) == 2) {  // bf16 xs, VEC = 8: one 16-byte read
            uint4 u = *reinterpret_cast<const uint4 *>(row + k);
            const uint32_t uu[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                xv[2 * q] = bf16lo(uu[q]);
                xv[2 * q + 1] = bf16hi(uu[q]);
            }
        } else if constexpr (VEC == 8) {  // fp32 xs, permuted: halves 128 floats apart
            const int base = (k & ~255) + (((k >> 3) & 31) << 2);
            float4 a = *reinterpret_cast<const float4 *>(row + base);
            float4 b = *reinterpret_cast<const float4 *>(row + base + 128);
            xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
            xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
        } else {
            float4 a = *reinterpret_cast<const float4 *>(row + k);
            xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        }
#pragma unroll
        for (int j = 0; j < NPW; j++)
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[m][j] = fmaf(wf[j][e], xv[e], acc[m][j]);
    }
}

// LayerNorm statistics of one row from its shifted copy d = x - c (fp32, K elements, zero up to
// the next multiple of 4), taken by one warp: dmean = mean(d) and rstd = 1 / sqrt(var + eps), the
// variance exact two-pass around dmean. Every lane returns both.
__device__ __forceinline__ float2 warp_ln_stats(const float *d, int K, int lane) {
    float s = 0.0f;
#pragma unroll 4
    for (int k = 4 * lane; k < K; k += 128) {
        const float4 v = *reinterpret_cast<const float4 *>(d + k);
        s += (v.x + v.y) + (v.z + v.w);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float dmean = s / K;
    float q = 0.0f;
#pragma unroll 4
    for (int k = 4 * lane; k < K; k += 128) {
        const float4 v = *reinterpret_cast<const float4 *>(d + k);
        const float t[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float u = k + i < K ? t[i] - dmean : 0.0f;
            q = fmaf(u, u, q);
        }
    }
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    return make_float2(dmean, 1.0f / sqrtf(q / K + LN_EPS));
}

// Rows [m0, m0 + MT) ∩ [0, M) of x (row stride ldx) against all N columns. LN: x fp32, gamma and
// e.s given; acc sums W_nk gamma_k (x_k - c) and the epilogue makes it rstd (acc - dmean s_n) + b'.
// Work: NPW consecutive rows of W form a group; a warp group of ksplit warps takes a group, warp
// ks of it the ks-th slice of the K chunks. Warp group wg of block b takes groups
// b + gridDim * (wg + (WARPS / ksplit) * i), so each SM gets an even share whatever N is.
template <typename WT, typename XT, int MT, int NPW, int U, bool LN>
__global__ void __maxnreg__(MT == 1 ? 112 : 128)
gemv_kernel(const XT *__restrict__ x, long long ldx, const float *__restrict__ gamma, const WT *__restrict__ W,
            int m0, int M, int N, int K, int KP, int ksplit, Epilogue e) {
    constexpr int VEC = 16 / sizeof(WT);
    constexpr int CH = 32 * VEC;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    XT *xs = reinterpret_cast<XT *>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int rows = min(MT, M - m0);
    const bool vec = (K % VEC) == 0 && (reinterpret_cast<uintptr_t>(W) % 16) == 0;
    const int ngroups = (N + NPW - 1) / NPW;
    const int nch = KP / CH;
    const int groups_per_block = GEMV_WARPS / ksplit, wg = warp / ksplit, ks = warp - wg * ksplit;
    const int per_slice = (nch + ksplit - 1) / ksplit;
    const int c_begin = min(nch, ks * per_slice), c_end = min(nch, c_begin + per_slice);
    const int g_step = gridDim.x * groups_per_block;

    // Staging: row m of x (zero past K and past the last row, so padded lanes add nothing), with LN
    // xs = gamma (x - c) and xr = x - c around c = x[m][0] (x - c is exact for a row whose mean is
    // large against its spread). 16-byte loads, four in flight per thread before any is stored.
    float *xr = reinterpret_cast<float *>(xs + (size_t)MT * KP);  // LN: [MT][KP], k in order
    float *gs = xr + (LN ? (size_t)MT * KP : 0);                  // LN: gamma [KP]
    float *stats = gs + (LN ? KP : 0);                            // LN, MT > 1: dmean [MT], rstd [MT]
    float *split_sums = stats + (LN ? 2 * MT : 0);                // [WARPS][32]
    unsigned long long *row_best = reinterpret_cast<unsigned long long *>(split_sums + GEMV_WARPS * 32);  // [MT]
    constexpr int XE = 16 / sizeof(XT);  // x elements per 16 bytes
    const bool xvec = (K % XE) == 0 && (ldx % XE) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
                      (!LN || (reinterpret_cast<uintptr_t>(gamma) % 16) == 0);
    const int qpr = KP / XE;
    auto stage = [&]() {
        if (xvec) {
            const int total = MT * qpr;
            for (int base = tid; base < total; base += 4 * GEMV_THREADS) {
                uint4 v[4];
                float c[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int q = base + j * GEMV_THREADS, m = q / qpr, k = XE * (q - m * qpr);
                    v[j] = make_uint4(0, 0, 0, 0);
                    c[j] = 0.0f;
                    if (q < total && k < K && m < rows) {
                        const XT *row = x + (size_t)(m0 + m) * ldx;
                        v[j] = __ldg(reinterpret_cast<const uint4 *>(row + k));
                        if constexpr (LN) c[j] = __ldg(reinterpret_cast<const float *>(row));
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int q = base + j * GEMV_THREADS, m = q / qpr, k = XE * (q - m * qpr);
                    if (q >= total) continue;
                    XT *dst = xs + (size_t)m * KP + xs_pos<WT, XT>(k);
                    if constexpr (LN) {
                        const float4 xv = *reinterpret_cast<const float4 *>(&v[j]);
                        const float4 g = *reinterpret_cast<const float4 *>(gs + k);
                        const float4 d = make_float4(xv.x - c[j], xv.y - c[j], xv.z - c[j], xv.w - c[j]);
                        *reinterpret_cast<float4 *>(xr + (size_t)m * KP + k) = d;
                        *reinterpret_cast<float4 *>(dst) = make_float4(g.x * d.x, g.y * d.y, g.z * d.z, g.w * d.w);
                    } else {
                        *reinterpret_cast<uint4 *>(dst) = v[j];
                    }
                }
            }
        } else {
            for (int i = tid; i < MT * KP; i += GEMV_THREADS) {
                const int m = i / KP, k = i - m * KP;
                const bool in = m < rows && k < K;
                float v = in ? load_x<XT>(x, ldx, m0 + m, k) : 0.0f;
                if constexpr (LN) {
                    v -= in ? load_x<XT>(x, ldx, m0 + m, 0) : 0.0f;
                    xr[(size_t)m * KP + k] = v;
                    v *= gs[k];
                }
                if constexpr (sizeof(XT) == 2) xs[(size_t)m * KP + k] = __float2bfloat16_rn(v);
                else xs[(size_t)m * KP + xs_pos<WT, XT>(k)] = v;
            }
        }
    };

    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();
    // Weights first, before the wait for the previous kernel: this warp's first W batch, and the
    // bias (and LN: s_n) of the column this lane will store (lane i < MT * NPW stores item
    // (i / NPW, i % NPW) of its group).
    int g = blockIdx.x + gridDim.x * wg;
    uint4 wv[U][NPW];
    auto load_batch = [&](int grp, int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NPW; j++)
                wv[u][j] = (c0 + u < c_end) ? load_w16<WT>(W, N, K, grp * NPW + j, (c0 + u) * CH + lane * VEC, vec)
                                            : make_uint4(0, 0, 0, 0);
    };
    const int store_m = lane / NPW;
    const bool stores = ks == 0 && lane < MT * NPW && store_m < rows;
    float bias_n = 0.0f, s_n = 0.0f;
    auto load_bias = [&](int grp) {
        const int n = grp * NPW + lane % NPW;
        const bool here = stores && grp < ngroups && n < N;
        bias_n = (here && e.bias) ? __ldg(e.bias + n) : 0.0f;
        if constexpr (LN) s_n = here ? __ldg(e.s + n) : 0.0f;
    };
    if (g < ngroups) load_batch(g, c_begin);
    load_bias(g);
    if constexpr (LN) {  // gamma (zero past K) before the wait too: it is not in L2 after a step's weights
        for (int k = XE * tid; k < KP; k += XE * GEMV_THREADS) {
            float4 gk = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (xvec && k < K) gk = __ldg(reinterpret_cast<const float4 *>(gamma + k));
            else if (!xvec)
                for (int i = 0; i < 4; i++) (&gk.x)[i] = k + i < K ? gamma[k + i] : 0.0f;
            *reinterpret_cast<float4 *>(gs + k) = gk;
        }
        __syncthreads();
    }
    Epilogue e_nobias = e;  // the bias is added from bias_n
    e_nobias.bias = nullptr;
    if (e.pos_dev) {  // a decode graph's position: its host-to-device copy precedes the step's first kernel
        e_nobias.pos = __ldg(e.pos_dev);
        e_nobias.pos_dev = nullptr;
    }
    const bool pick = e.pick.next != nullptr;
    if (pick && tid < MT) row_best[tid] = 0ull;
    pdl_wait();
    stage();
    __syncthreads();
    // LN at one row: when the block's last warp holds no group (one round, no K split: the qkv and
    // fc GEMVs) and greedy's pick needs no block barrier at the end, it takes the statistics while the
    // others multiply, and hands them over at the named barrier 1 before their epilogue; else every
    // warp takes them itself (no barrier).
    const bool has_stats_warp = LN && MT == 1 && ksplit == 1 && !pick && ngroups <= g_step &&
                                blockIdx.x + gridDim.x * (GEMV_WARPS - 1) >= ngroups;
    float dmean = 0.0f, rstd = 1.0f;  // LN: the statistics of row store_m
    if constexpr (LN) {
        if constexpr (MT == 1) {
            if (!has_stats_warp || warp == GEMV_WARPS - 1) {
                const float2 r = warp_ln_stats(xr, K, lane);
                dmean = r.x, rstd = r.y;
            }
            if (has_stats_warp && warp == GEMV_WARPS - 1) {
                if (lane == 0) stats[0] = dmean, stats[1] = rstd;
                asm volatile("bar.arrive 1, %0;" ::"n"(GEMV_THREADS) : "memory");
                return;
            }
        } else {  // warp w takes rows w, w + WARPS, ...
            for (int m = warp; m < MT; m += GEMV_WARPS) {
                const float2 r = warp_ln_stats(xr + (size_t)m * KP, K, lane);
                if (lane == 0) stats[m] = r.x, stats[MT + m] = r.y;
            }
            __syncthreads();
            const int sm = min(store_m, MT - 1);
            dmean = stats[sm], rstd = stats[MT + sm];
        }
    }

    // Greedy's pick: the largest value this lane stores and its column (the first: a lane meets its
    // columns in increasing order).
    float pick_v = -INFINITY;
    int pick_n = -1;
    // Rounds are block-uniform (the split-K sums meet at __syncthreads); a warp group whose group
    // is past N idles through its last round.
    for (int first = blockIdx.x; first < ngroups; first += g_step, g += g_step) {
        const bool active = g < ngroups;
        const int store_n = g * NPW + lane % NPW;
        // The residual this lane adds to, read now so that the store waits on nothing.
        const float resid = (!LN && e.mode == OUT_RESIDUAL && stores && active && store_n < N)
                                ? e.residual[(size_t)(m0 + store_m) * e.N + store_n]
                                : 0.0f;
        float acc[MT][NPW];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NPW; j++) acc[m][j] = 0.0f;
        for (int c0 = c_begin; active && c0 < c_end; c0 += U) {
            if (c0 > c_begin) load_batch(g, c0);
#pragma unroll
            for (int u = 0; u < U; u++)
                if (c0 + u < c_end) gemv_fma<WT, XT, MT, NPW>(acc, wv[u], xs, KP, (c0 + u) * CH + lane * VEC);
        }
        if (g + g_step < ngroups) load_batch(g + g_step, c_begin);  // next group's first batch under this one's sums
        // Butterfly: every lane ends with every sum; lane i keeps item i and makes the one store
        // (one inlined epilogue, not MT * NPW of them: the unrolled copies overflowed the
        // instruction cache).
        static_assert(MT * NPW <= 32, "one item per lane");
        float mine = 0.0f;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NPW; j++) {
                float v = acc[m][j];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                mine = (m * NPW + j == lane) ? v : mine;
            }
        if (has_stats_warp) {  // the statistics from the last warp (every other warp passes here once)
            asm volatile("bar.sync 1, %0;" ::"n"(GEMV_THREADS) : "memory");
            dmean = stats[0], rstd = stats[1];
        }
        if (ksplit > 1) {  // the group's first warp adds the other slices' sums, in slice order
            split_sums[warp * 32 + lane] = mine;
            __syncthreads();
            if (ks == 0)
                for (int j = 1; j < ksplit; j++) mine += split_sums[(warp + j) * 32 + lane];
            __syncthreads();  // split_sums is rewritten next round
        }
        if (stores && active && store_n < N) {
            const float v = (LN ? rstd * (mine - dmean * s_n) : mine) + bias_n;
            if (!LN && e.mode == OUT_RESIDUAL) e.residual[(size_t)(m0 + store_m) * e.N + store_n] = resid + v;
            else if (!(pick && e.pick.ids_only)) epi_store(e_nobias, m0 + store_m, store_n, v);
            if (pick && v > pick_v) pick_v = v, pick_n = store_n;
        }
        load_bias(g + g_step);
    }
    // Greedy's pick: the NPW lanes of a row meet by shuffles, the warps in shared memory, the blocks
    // in greedy_publish (greedy_pick.cuh).
    if (pick) {
        unsigned long long b = pick_n < 0 ? 0ull : rank_key(float_key(pick_v), pick_n);
#pragma unroll
        for (int o = 1; o < NPW; o *= 2) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
        if (stores && lane % NPW == 0 && b) atomicMax(&row_best[store_m], b);
        __syncthreads();
        greedy_publish(e.pick, row_best, reinterpret_cast<unsigned *>(row_best + MT), m0, rows, tid, GEMV_THREADS,
                       [] { __syncthreads(); });
    }
}

// ----------------------------------------------------------------------------
// Tiled kernels: shared pieces.
//
// Every tile of x, W and gamma arrives by cp.async, STAGES deep, so that several K steps' loads
// are in flight while one multiplies (one tile of register prefetch left small-M shapes waiting a
// full memory latency per K step: 4-5x slower, measured). fp32 x tiles land raw; one pass over
// shared memory then applies the LayerNorm pieces (shift, row sums, * gamma) and writes the
// operand layout the math wants: bf16 [m][k] for ldmatrix, or fp32 [k][m] for the FFMA kernel.

// One 16-byte chunk of a row-major matrix (row stride ld, nrows rows, K columns): elements
// [gk, gk + 16 / sizeof(T)) of row gr into d, by cp.async, zero-filled outside [nrows, K); plain
// loads and stores when `vec` is false (K or ld not a multiple of 16 bytes, or an unaligned base).
template <typename T>
__device__ __forceinline__ void load_chunk16(T *d, const T *__restrict__ src, long long ld, int nrows, int K, int gr,
                                             int gk, bool vec) {
    constexpr int EPC = 16 / sizeof(T);
    if (vec) {
        const bool ok = gr < nrows && gk < K;
        cp_async16(d, ok ? src + (size_t)gr * ld + gk : src, ok ? 16 : 0);
    } else {
#pragma unroll
        for (int e = 0; e < EPC; e++) d[e] = (gr < nrows && gk + e < K) ? src[(size_t)gr * ld + gk + e] : T(0.0f);
    }
}

// A [ROWS][BKE] tile of a row-major matrix (row stride ld) at (r0, k0) into dst (row stride dld),
// chunk by chunk (load_chunk16).
template <typename T, int ROWS, int BKE, int THREADS>
__device__ __forceinline__ void load_tile(T *dst, int dld, const T *__restrict__ src, long long ld, int nrows, int K,
                                          int r0, int k0, bool vec, int tid) {
    constexpr int EPC = 16 / sizeof(T);
    constexpr int CPR = BKE / EPC;
    constexpr int CHUNKS = ROWS * CPR;
#pragma unroll
    for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; i++) {
        const int q = tid + i * THREADS;
        if (CHUNKS % THREADS == 0 || q < CHUNKS) {
            const int r = q / CPR, kc = EPC * (q % CPR);
            load_chunk16(dst + r * dld + kc, src, ld, nrows, K, r0 + r, k0 + kc, vec);
        }
    }
}

// The LayerNorm side of a tiled kernel: a thread owns quads q = tid + i * THREADS of each BM x BK
// tile (row q / (BK/4), columns 4 * (q % (BK/4)): THREADS is a multiple of BK/4, so always the same
// column quad and rows), and keeps its rows' shift and running sums in registers for the K loop.
template <int BM, int BK, int THREADS>
struct LnRows {
    static constexpr int QPR = BK / 4;
    static constexpr int NQ = (BM * QPR + THREADS - 1) / THREADS;
    float c[NQ], s1[NQ], s2[NQ];

    // raw: the [BM][BK] fp32 tile at column k0; g: gamma [BK]. put(r, kq, t[4]) stores the operand.
    // On the first tile the shift c is the mean of the row's first min(K, 32) values, summed as 4
    // in-thread then a butterfly over the 8 lanes holding them (tests/test_fused_linear.c repeats
    // this order exactly to emulate the bf16 rounding).
    template <typename Put>
    __device__ __forceinline__ void process(const float *raw, const float *g, int K, int k0, bool first, int tid,
                                            Put put) {
        const int kq = 4 * (tid % QPR);
        const float4 gv = *reinterpret_cast<const float4 *>(g + kq);
        const float gg[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
        for (int i = 0; i < NQ; i++) {
            const int q = tid + i * THREADS, r = q / QPR;
            const bool valid = (BM * QPR) % THREADS == 0 || q < BM * QPR;
            float4 v = valid ? *reinterpret_cast<const float4 *>(raw + r * BK + kq) : make_float4(0.f, 0.f, 0.f, 0.f);
            if (first) {  // quads past column 32 add exact zeros, so BK = 64 sums as BK = 32 does
                float sum = kq < 32 ? ((v.x + v.y) + v.z) + v.w : 0.0f;  // zero past K
#pragma unroll
                for (int o = 1; o < QPR; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                c[i] = sum / (float)min(K, 32);
                s1[i] = s2[i] = 0.0f;
            }
            float t[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float d = (k0 + kq + e < K) ? t[e] - c[i] : 0.0f;
                s1[i] += d;
                s2[i] = fmaf(d, d, s2[i]);
                t[e] = d * gg[e];
            }
            if (valid) put(r, kq, t);
        }
    }

    // After the K loop: each row's (dmean, rstd) into shared memory.
    __device__ __forceinline__ void finish(float *row_dmean, float *row_rstd, int K, int tid) {
#pragma unroll
        for (int i = 0; i < NQ; i++) {
            float a = s1[i], b = s2[i];
#pragma unroll
            for (int o = 1; o < QPR; o <<= 1) {
                a += __shfl_xor_sync(0xffffffffu, a, o);
                b += __shfl_xor_sync(0xffffffffu, b, o);
            }
            const int q = tid + i * THREADS;
            if (q % QPR == 0 && q < BM * QPR) {
                const float dm = a / K;
                const float var = fmaxf(b / K - dm * dm, 0.0f);
                row_dmean[q / QPR] = dm;
                row_rstd[q / QPR] = 1.0f / sqrtf(var + LN_EPS);
            }
        }
    }
};

// ----------------------------------------------------------------------------
// Tensor-core GEMV (bf16, 4 < M <= 64): the FMA GEMV above turns shared-memory-bound past a few
// rows (each W element meets M rows of x). Here the block's rows, normalised, sit in shared memory
// as bf16 [MT][AS]; each warp owns 8 output columns and streams its 8 W rows straight from global
// memory into mma.sync B fragments, 16 bytes per lane: within each 32-wide K block, lane (gid, tig)
// loads W[n0 + gid][8 tig .. 8 tig + 8) and uses its halves as the B fragments of two k16 steps;
// the A fragments read x at the same physical k (k order inside a dot product is free), also 16
// bytes per row per lane. x's statistics: one-pass around c = x[row][0] (exact x - c for offset
// rows; this path is bf16 only, whose operand rounding dwarfs the one-pass error).

// The tensor-core GEMVs' k permutation (here and in cluster_kernel): in each 32-wide K block, lane
// (gid, tig) holds 16 bytes of its W row at k = 8 tig .. 8 tig + 8 and uses them as the B fragments
// of two k16 steps; the A fragments are the same 16 bytes of rows gid and gid + 8 of the staged x
// (the order of the terms of a dot product is free).
struct AFrag32 {
    uint32_t a0[4], a1[4];
};
__device__ __forceinline__ AFrag32 load_a32(const bf16 *As, int AS, int row, int k) {
    const uint4 lo = *reinterpret_cast<const uint4 *>(As + row * AS + k);
    const uint4 hi = *reinterpret_cast<const uint4 *>(As + (row + 8) * AS + k);
    return AFrag32{{lo.x, hi.x, lo.y, hi.y}, {lo.z, hi.z, lo.w, hi.w}};
}
// acc (rows row, row + 8 of a 16-row tile x 8 columns) += that 32-wide K block.
__device__ __forceinline__ void mma_k32(float (&acc)[4], const AFrag32 &a, uint4 w) {
    mma_bf16_16816(acc, a.a0, w.x, w.y);
    mma_bf16_16816(acc, a.a1, w.z, w.w);
}

constexpr int TG_THREADS = 256;
constexpr int TG_WARPS = TG_THREADS / 32;
constexpr int TG_U = 8;  // K blocks of 32 per batch of W loads in flight

// A row stride (bf16): 64 bytes mod 128, so the two rows a quarter-warp reads hit distinct banks.
__host__ __device__ inline int tg_row_stride(int KP) { return KP + ((KP % 64) ? 0 : 32); }

template <int MT, bool LN>
__global__ void __launch_bounds__(TG_THREADS)
gemv_tc_kernel(const void *__restrict__ x_, long long ldx, const float *__restrict__ gamma, const bf16 *__restrict__ W,
               int m0, int M, int N, int K, int KP, Epilogue e) {
    constexpr int MI = MT / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int AS = tg_row_stride(KP);
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);
    float *gs = reinterpret_cast<float *>(As + MT * AS);  // LN: gamma [KP]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int rows = min(MT, M - m0);
    const bool wvec = (K % 8) == 0 && (reinterpret_cast<uintptr_t>(W) % 16) == 0;
    const int ngroups = (N + 7) / 8, nkb = KP / 32;

    int g = blockIdx.x + gridDim.x * warp;
    uint4 wv[TG_U];
    auto load_batch = [&](int grp, int kb0) {
#pragma unroll
        for (int u = 0; u < TG_U; u++)
            wv[u] = (kb0 + u < nkb) ? load_w16<bf16>(W, N, K, grp * 8 + gid, (kb0 + u) * 32 + 8 * tig, wvec)
                                    : make_uint4(0, 0, 0, 0);
    };
    if (g < ngroups) load_batch(g, 0);  // in flight while x is staged

    if constexpr (LN) {
        const float *x = reinterpret_cast<const float *>(x_);
        for (int k = tid; k < KP; k += TG_THREADS) gs[k] = k < K ? gamma[k] : 0.0f;
        __syncthreads();
        const bool xvec = (K % 4) == 0 && (ldx % 4) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
        for (int m = warp; m < MT; m += TG_WARPS) {  // a warp per row, the row in registers (K <= 2048)
            bf16 *arow = As + m * AS;
            float4 v[16];
            const float *xr = x + (size_t)(m0 + min(m, rows - 1)) * ldx;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int k = 4 * lane + 128 * i;
                v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (m < rows && k < K) {
                    if (xvec) v[i] = __ldg(reinterpret_cast<const float4 *>(xr + k));
                    else {
                        v[i].x = xr[k];
                        if (k + 1 < K) v[i].y = xr[k + 1];
                        if (k + 2 < K) v[i].z = xr[k + 2];
                        if (k + 3 < K) v[i].w = xr[k + 3];
                    }
                }
            }
            const float c = __shfl_sync(0xffffffffu, v[0].x, 0);
            float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int k = 4 * lane + 128 * i;
                const float t[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (k + q < K) {
                        const float d = t[q] - c;
                        s1 += d;
                        s2 = fmaf(d, d, s2);
                    }
            }
            for (int o = 16; o > 0; o >>= 1) {
                s1 += __shfl_xor_sync(0xffffffffu, s1, o);
                s2 += __shfl_xor_sync(0xffffffffu, s2, o);
            }
            const float dm = s1 / K, rstd = 1.0f / sqrtf(fmaxf(s2 / K - dm * dm, 0.0f) + LN_EPS);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int k = 4 * lane + 128 * i;
                if (k < KP) {
                    const float t[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
                    float o4[4];
#pragma unroll
                    for (int q = 0; q < 4; q++) o4[q] = (k + q < K) ? ((t[q] - c) - dm) * rstd * gs[k + q] : 0.0f;
                    *reinterpret_cast<uint2 *>(arow + k) = make_uint2(pack_bf16x2(o4[0], o4[1]), pack_bf16x2(o4[2], o4[3]));
                }
            }
        }
    } else {
        const bf16 *x = reinterpret_cast<const bf16 *>(x_);
        const bool xvec = (K % 8) == 0 && (ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
        const int qpr = KP / 8, total = MT * qpr;
        for (int base = tid; base < total; base += 4 * TG_THREADS) {
            uint4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int q = base + j * TG_THREADS, m = q / qpr, k = 8 * (q - m * qpr);
                v[j] = q < total && m < rows ? load_row16(x + (size_t)(m0 + m) * ldx, k, K, xvec) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int q = base + j * TG_THREADS, m = q / qpr, k = 8 * (q - m * qpr);
                if (q < total) *reinterpret_cast<uint4 *>(As + m * AS + k) = v[j];
            }
        }
    }
    __syncthreads();

    for (; g < ngroups; g += gridDim.x * TG_WARPS) {
        float acc[MI][4];
#pragma unroll
        for (int i = 0; i < MI; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
        for (int kb0 = 0; kb0 < nkb; kb0 += TG_U) {
            if (kb0 > 0) load_batch(g, kb0);
#pragma unroll
            for (int u = 0; u < TG_U; u++) {
                const int kb = kb0 + u;
                if (kb < nkb) {
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        mma_k32(acc[mi], load_a32(As, AS, mi * 16 + gid, kb * 32 + 8 * tig), wv[u]);
                    }
                }
            }
        }
        const int gn = g + gridDim.x * TG_WARPS;
        if (gn < ngroups) load_batch(gn, 0);
        const int n = g * 8 + 2 * tig;
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = mi * 16 + gid + 8 * h;
                if (r < rows && n < N) epi_store2(e, m0 + r, n, acc[mi][2 * h], acc[mi][2 * h + 1]);
            }
    }
}

// ----------------------------------------------------------------------------
// Cluster GEMV (sm_90 thread-block clusters; bf16 with the LayerNorm, 4 < M <= 64: batched decode).
//
// Why: at 8-64 rows cuBLASLt covers a 768 x 3072 product with a few dozen tiles, so most SMs stream
// no weights (5-7 us for ~1 us of bytes), while a GEMV grid over every SM needs all M rows of x in
// every block: 64 fp32 rows re-read by 132 blocks is 26 MB of L2 traffic, five times the weights.
// A cluster of CS blocks (up to 8, one GPC) shares that work through distributed shared memory:
// the cluster's blocks own different column groups and all of K; block r loads rows r, r + CS, ...
// of x, normalises each (exact two-pass statistics from registers, gamma applied:
// x_hat = (x - mean) rstd gamma, beta folded into b'), and writes it as bf16 into every block's
// shared memory, so a row leaves L2 once per cluster instead of once per block. Each of the 8
// warps owns a K range of the block's G column groups (8 columns each) and holds those weights in
// registers, loaded before pdl_wait() so they stream in while the previous kernel finishes; they
// feed mma.sync as B fragments with the k permutation of load_a32, against A fragments read from
// the staged rows. The warps' partial sums are added in warp order through shared memory. Shared
// memory stays under half an SM's, so the next kernel's block fits beside it.
// (Plain linears had two more modes here, rows broadcast as bf16 and K split over the cluster;
// the skinny kernel beat both at every size and they were removed: docs/PERF.md, "Session 10".)

constexpr int CL_THREADS = 256;
constexpr int CL_WARPS = CL_THREADS / 32;
constexpr int CL_U = 3;           // K blocks of 32 per warp per batch of W loads in registers
constexpr int CL_MAX_CLUSTER = 8; // the portable cluster size
constexpr int CL_LN_MAX_K = 2048; // LayerNorm rows held in registers: 64 floats a lane
constexpr int CL_LN_MAX_ROWS = 32; // auto routing's limit with LayerNorm: LN + cuBLASLt wins above (docs/PERF.md)

// Shared memory of one block: the staged rows [MT][AS] bf16 and gamma [KP] fp32 after them; once
// the products are done the same space holds the warps' partial sums [WARPS][MT][NT] fp32.
__host__ __device__ constexpr int cl_smem_bytes(int MT, int NT, int AS, int KP) {
    const int rows = MT * AS * 2 + KP * 4, sums = CL_WARPS * MT * NT * 4;
    return rows > sums ? rows : sums;
}

// Element q (a constant once unrolled) of eight floats held as two float4.
__device__ __forceinline__ float &f8_ref(float4 (&v)[2], int q) {
    float4 &h = v[q / 4];
    return q % 4 == 0 ? h.x : q % 4 == 1 ? h.y : q % 4 == 2 ? h.z : h.w;
}

template <int MI, int G>
__global__ void __launch_bounds__(CL_THREADS, 2)
cluster_kernel(const float *__restrict__ x, long long ldx, const float *__restrict__ gamma, const bf16 *__restrict__ W,
               int m0, int M, int N, int K, int AS, Epilogue e) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int MT = 16 * MI, NT = 8 * G;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int CS = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int rows = min(MT, M - m0), KP = (K + 31) / 32 * 32;
    float *gs = reinterpret_cast<float *>(As + MT * AS);  // gamma [KP]
    // This block's column groups [g0, g0 + G); this warp's K blocks of 32.
    const int g0 = (int)blockIdx.x * G;
    const int nkb = KP / 32, kpw = (nkb + CL_WARPS - 1) / CL_WARPS;
    const int kb_begin = min(nkb, warp * kpw), kb_end = min(nkb, kb_begin + kpw);
    const bool active = g0 * 8 < N;
    const bool wvec = (K % 8) == 0 && (reinterpret_cast<uintptr_t>(W) % 16) == 0;

    pdl_launch_dependents();
    cluster_arrive_relaxed();  // "started": others may write here once all arrive
    uint4 wv[G][CL_U];
    auto load_batch = [&](int kb) {
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int u = 0; u < CL_U; u++)
                wv[gi][u] = (active && kb + u < kb_end)
                                ? load_w16<bf16>(W, N, K, (g0 + gi) * 8 + gid, (kb + u) * 32 + 8 * tig, wvec)
                                : make_uint4(0, 0, 0, 0);
    };
    load_batch(kb_begin);  // weights (and gamma below) only: allowed before pdl_wait()
    for (int k = tid; k < KP; k += CL_THREADS) gs[k] = k < K ? __ldg(gamma + k) : 0.0f;
    __syncthreads();
    // The staged rows' address in every block of the cluster.
    uint32_t dst[CL_MAX_CLUSTER];
#pragma unroll
    for (int r = 0; r < CL_MAX_CLUSTER; r++) dst[r] = r >= CS ? 0 : cluster_map(As, r);
    pdl_wait();

    // --- stage x: a warp a row, normalised, into every block of the cluster ---
    const bool xvec = (K % 4) == 0 && (ldx % 4) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
    bool waited = false;
    for (int m = rank + CS * warp; m < MT; m += CS * CL_WARPS) {  // a warp per row
        // Lane's elements: 8 at k = 8 lane + 256 i (two float4), the row held in registers.
        float4 v[8][2];
        const float *xr = x + (size_t)(m0 + min(m, rows - 1)) * ldx;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int k = 8 * lane + 256 * i;
            v[i][0] = v[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m >= rows || k >= K) continue;
            if (xvec) {
                v[i][0] = __ldg(reinterpret_cast<const float4 *>(xr + k));
                if (k + 4 < K) v[i][1] = __ldg(reinterpret_cast<const float4 *>(xr + k + 4));
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (k + q < K) f8_ref(v[i], q) = xr[k + q];
            }
        }
        float s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            s1 += ((v[i][0].x + v[i][0].y) + (v[i][0].z + v[i][0].w)) + ((v[i][1].x + v[i][1].y) + (v[i][1].z + v[i][1].w));
        for (int o = 16; o > 0; o >>= 1) s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        const float mean = s1 / K;
        float s2 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int k = 8 * lane + 256 * i;
            if (k >= K) break;
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (k + q < K) s2 = fmaf(f8_ref(v[i], q) - mean, f8_ref(v[i], q) - mean, s2);
        }
        for (int o = 16; o > 0; o >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        const float rstd = m < rows ? 1.0f / sqrtf(s2 / K + LN_EPS) : 0.0f;  // rows past M: zeros
        if (!waited) cluster_wait(), waited = true;  // (warps without a row wait below)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int k = 8 * lane + 256 * i;
            if (k >= KP) break;  // gamma is zero from K to KP: the padding is written as zeros
            float o8[8];
#pragma unroll
            for (int q = 0; q < 8; q++) o8[q] = (f8_ref(v[i], q) - mean) * rstd * gs[k + q];
            const uint4 packed = make_uint4(pack_bf16x2(o8[0], o8[1]), pack_bf16x2(o8[2], o8[3]),
                                            pack_bf16x2(o8[4], o8[5]), pack_bf16x2(o8[6], o8[7]));
#pragma unroll
            for (int r = 0; r < CL_MAX_CLUSTER; r++)
                if (r < CS) st_cluster(dst[r] + 2 * (m * AS + k), packed);
        }
    }
    if (!waited) cluster_wait();
    cluster.sync();  // every block's rows have landed in every block

    // --- this warp's K range: acc[mi][gi] = rows mi*16.. x columns (g0 + gi)*8.. ---
    float acc[MI][G][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int gi = 0; gi < G; gi++) acc[mi][gi][0] = acc[mi][gi][1] = acc[mi][gi][2] = acc[mi][gi][3] = 0.0f;
    if (active)
        for (int kb = kb_begin; kb < kb_end; kb += CL_U) {
            if (kb > kb_begin) load_batch(kb);
#pragma unroll
            for (int u = 0; u < CL_U; u++) {
                if (kb + u >= kb_end) break;
                const int kk = (kb + u) * 32 + 8 * tig;
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    const AFrag32 a = load_a32(As, AS, mi * 16 + gid, kk);
#pragma unroll
                    for (int gi = 0; gi < G; gi++) mma_k32(acc[mi][gi], a, wv[gi][u]);
                }
            }
        }

    // --- the warps' partial sums, added in warp order ---
    __syncthreads();  // the staged rows are dead: their space takes the sums
    float *red = reinterpret_cast<float *>(smem_raw);  // [WARPS][MT][NT]
    store_acc(red + warp * MT * NT, NT, acc, lane);
    __syncthreads();
    for (int i = tid; i < MT * NT / 2; i += CL_THREADS) {
        const int row = i / (NT / 2), col = 2 * (i % (NT / 2));
        float2 v = make_float2(0.0f, 0.0f);
        for (int w = 0; w < CL_WARPS; w++) {
            const float2 t = *reinterpret_cast<const float2 *>(red + (w * MT + row) * NT + col);
            v.x += t.x;
            v.y += t.y;
        }
        if (row < rows && active) epi_store2(e, m0 + row, g0 * 8 + col, v.x, v.y);
    }
#endif
}

// ----------------------------------------------------------------------------
// Tensor-core kernel (bf16 W; x fp32 with LN, bf16 without).

// Shared memory: Bs[S][BN][LDS] bf16, then with LN: Araw[S][BM][BK] fp32, Graw[S][BK] fp32,
// As[BM][LDS] bf16, row_dmean/rstd[BM]; without: As[S][BM][LDS] bf16. LDS = BK + 8 bf16 per
// operand row (a multiple of 16 bytes that is not of 128: ldmatrix rows hit distinct banks).
template <int BM, int BN, int BK, int S, bool LN>
constexpr int tc_smem_bytes() {
    return S * BN * (BK + 8) * 2 +
           (LN ? S * BM * BK * 4 + S * BK * 4 + BM * (BK + 8) * 2 + 2 * BM * 4 : S * BM * (BK + 8) * 2);
}

// A warp's MI x NI accumulator tiles (m16n8k16), zeroed.
template <int MI, int NI>
__device__ __forceinline__ void zero_acc(float (&acc)[MI][NI][4]) {
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
}

// One k16 step of a warp's MI x NI accumulator tiles (m16n8k16): the A fragments from rows
// a_row.. of x at `a`, the B fragments from rows b_row.. of W (the output's columns) at `b`, both
// bf16 with row stride ld, at column kk; ldmatrix, then MI x NI mma.sync.
template <int MI, int NI>
__device__ __forceinline__ void warp_mma_k16(float (&acc)[MI][NI][4], const bf16 *a, int a_row, const bf16 *b,
                                             int b_row, int ld, int kk, int lane) {
    static_assert(NI % 2 == 0, "B fragments come in pairs of n8 tiles");
    uint32_t af[MI][4], bfr[NI][2];
#pragma unroll
    for (int i = 0; i < MI; i++) ldmatrix_x4(af[i], a + (a_row + i * 16 + (lane % 16)) * ld + kk + (lane / 16) * 8);
#pragma unroll
    for (int j = 0; j < NI; j += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, b + (b_row + j * 8 + (lane % 8) + (lane / 16) * 8) * ld + kk + ((lane / 8) % 2) * 8);
        bfr[j][0] = r[0];
        bfr[j][1] = r[1];
        bfr[j + 1][0] = r[2];
        bfr[j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) mma_bf16_16816(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
}

template <int BM, int BN, int WARPS_M, int WARPS_N, int BK, int S, bool LN>
__global__ void __launch_bounds__(WARPS_M *WARPS_N * 32)
tc_kernel(const void *__restrict__ x_, long long ldx, const float *__restrict__ gamma, const bf16 *__restrict__ W,
          int M, int N, int K, Epilogue e) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int TC_BK = BK, TC_LDS = BK + 8;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Bs = reinterpret_cast<bf16 *>(smem_raw);
    float *Araw = reinterpret_cast<float *>(Bs + S * BN * TC_LDS);
    float *Graw = Araw + S * BM * TC_BK;
    bf16 *As = LN ? reinterpret_cast<bf16 *>(Graw + S * TC_BK) : reinterpret_cast<bf16 *>(Araw);
    float *row_dmean = reinterpret_cast<float *>(As + BM * TC_LDS);
    float *row_rstd = row_dmean + BM;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int KT = (K + TC_BK - 1) / TC_BK;
    const bool wvec = (K % 8) == 0 && (reinterpret_cast<uintptr_t>(W) % 16) == 0;
    const float *xf = reinterpret_cast<const float *>(x_);
    const bf16 *xb = reinterpret_cast<const bf16 *>(x_);
    const int xq = LN ? 4 : 8;
    const bool xvec = (ldx % xq) == 0 && (K % xq) == 0 && (reinterpret_cast<uintptr_t>(x_) % 16) == 0;
    const bool gvec = (K % 4) == 0 && (reinterpret_cast<uintptr_t>(gamma) % 16) == 0;

    auto issue = [&](int t) {
        const int st = t % S;
        load_tile<bf16, BN, TC_BK, THREADS>(Bs + st * BN * TC_LDS, TC_LDS, W, K, N, K, n0, t * TC_BK, wvec, tid);
        if constexpr (LN) {
            load_tile<float, BM, TC_BK, THREADS>(Araw + st * BM * TC_BK, TC_BK, xf, ldx, M, K, m0, t * TC_BK, xvec, tid);
            load_tile<float, 1, TC_BK, THREADS>(Graw + st * TC_BK, TC_BK, gamma, 0, 1, K, 0, t * TC_BK, gvec, tid);
        } else {
            load_tile<bf16, BM, TC_BK, THREADS>(As + st * BM * TC_LDS, TC_LDS, xb, ldx, M, K, m0, t * TC_BK, xvec, tid);
        }
    };
#pragma unroll
    for (int t = 0; t < S - 1; t++) {
        if (t < KT) issue(t);
        cp_async_commit();
    }

    LnRows<BM, TC_BK, THREADS> ln;
    float acc[MI][NI][4];
    zero_acc(acc);

    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<S - 2>();
        __syncthreads();  // tile kt landed for all; iteration kt-1's readers are done
        if (kt + S - 1 < KT) issue(kt + S - 1);
        cp_async_commit();
        const bf16 *as;
        if constexpr (LN) {
            ln.process(Araw + (kt % S) * BM * TC_BK, Graw + (kt % S) * TC_BK, K, kt * TC_BK, kt == 0, tid,
                       [&](int r, int kq, const float (&t)[4]) {
                           *reinterpret_cast<uint2 *>(As + r * TC_LDS + kq) =
                               make_uint2(pack_bf16x2(t[0], t[1]), pack_bf16x2(t[2], t[3]));
                       });
            __syncthreads();
            as = As;
        } else {
            as = As + (kt % S) * BM * TC_LDS;
        }
        const bf16 *bs = Bs + (kt % S) * BN * TC_LDS;
#pragma unroll
        for (int kk = 0; kk < TC_BK; kk += 16) {
            warp_mma_k16<MI, NI>(acc, as, wm * WTM, bs, wn * WTN, TC_LDS, kk, lane);
        }
    }
    cp_async_wait<0>();
    if constexpr (LN) ln.finish(row_dmean, row_rstd, K, tid);
    __syncthreads();  // every warp is done with the operand tiles: Cs reuses them

    // Epilogue through shared memory: the accumulators land in Cs [BM][BN + 4] fp32, then the
    // block stores rows of column pairs (coalesced), with one inlined copy of the epilogue.
    static_assert(BM * (BN + 4) * 4 <= tc_smem_bytes<BM, BN, BK, S, LN>(), "Cs fits");
    float *Cs = reinterpret_cast<float *>(smem_raw);
    store_acc(Cs + wm * WTM * (BN + 4) + wn * WTN, BN + 4, acc, lane);
    __syncthreads();
#pragma unroll 1
    for (int idx = tid; idx < BM * BN / 2; idx += THREADS) {
        const int r = idx / (BN / 2), c = 2 * (idx % (BN / 2)), m = m0 + r, n = n0 + c;
        if (m >= M || n >= N) continue;
        const float2 v = *reinterpret_cast<const float2 *>(Cs + r * (BN + 4) + c);
        const float dm = LN ? row_dmean[r] : 0.0f, rs = LN ? row_rstd[r] : 1.0f;
        epi_store2(e, m, n, ln_apply(e, LN, n, v.x, dm, rs), n + 1 < N ? ln_apply(e, LN, n + 1, v.y, dm, rs) : 0.0f);
    }
}

// ----------------------------------------------------------------------------
// Skinny GEMM (bf16, no LayerNorm: few rows, many columns; batched decode past the GEMVs).
//
// At 17-64 rows a decode step's products still read more weight than x (0.6-4.7 MB of W against
// 50-400 KB of bf16 rows), and every step runs them back to back, so what costs is the same as at
// one row: the boundary between kernels and the first DRAM latency. cuBLASLt's kernels cannot be
// launched programmatically dependent (kernels/pdl.cuh), so each of its GEMMs waits for the
// previous kernel to drain before its first weight load: ~2 us a boundary at batch 64, half the
// step (docs/PERF.md, "Session 5"). Here:
//   - a block owns a BM x BN output tile (BM = 16, 32 or 64 rows, BN = 64 or 128 columns) over a slice
//     of K: all of it, or 1/CS of it when the CS blocks of a thread-block cluster split K;
//   - its W slice [BN][KB] goes into shared memory by cp.async *before* pdl_wait(): the weights
//     stream in while the previous kernel finishes. Its rows of x [BM][KB] follow after the wait;
//   - eight warps multiply it (mma.sync m16n8k16), WN over the columns (32 each) times WK = 8 / WN
//     over the K slice, so a warp's chain of dependent MMAs is KB / (16 WK) steps long; the WK
//     partial tiles are added in warp order through shared memory (with 2 x 4 warps over the
//     tile and each one the whole slice, the products were ~1/3 of the kernel at 64 rows:
//     docs/PERF.md, "Session 11"). Where that leaves a warp under two k16 steps (a 768-long K
//     split eight ways), WM = 2 warps share the rows instead and WK halves: fewer partial tiles
//     to add for the same chain;
//   - with a split, each block leaves its partial tile in shared memory and, after one cluster
//     barrier, block r sums rows r BM/CS .. (r + 1) BM/CS - 1 of all CS partials through
//     distributed shared memory and applies the epilogue to them (bias, GELU, residual add, bf16
//     or fp32 out).
// Every block reads all of its rows' K slice, so x is read N / BN times over: wide tiles, with K
// split to give the SMs enough blocks, keep that to a few MB (a first version with 16-32 columns a
// block read x 24-96 times and lost to cuBLASLt at 64 rows: docs/PERF.md, "Session 10").
// Rows past BM run as more row tiles (grid.y), re-reading W from L2: fine for a few, not a GEMM.

constexpr int SK_THREADS = 256;
constexpr int SK_MAX_CLUSTER = 8;  // the portable cluster size
// The most rows for which the skinny kernel beats cuBLASLt's bias + residual epilogue in a decode
// step (GPT-2 124M's projections, H200: 5-32 rows; at 48 and 64 about even, docs/PERF.md,
// "Session 11").
constexpr int SK_ENGINE_MAX_ROWS = 32;

// Row stride of the staged operands: KB + 8 bf16, an odd multiple of 16 bytes (KB is a multiple
// of 16), so the eight row addresses of an ldmatrix hit distinct banks.
__host__ __device__ constexpr int sk_ld(int kb) { return kb + 8; }
// The partial tile's row stride in floats: BN + 8 puts the eight rows of a warp's accumulator
// store 8 banks apart (conflict-free float2 stores per half warp).
__host__ __device__ constexpr int sk_part_ld(int bn) { return bn + 8; }

// Warps over the K slice for a tile of bn columns (each warp 32 columns) whose rows wm warps share.
__host__ __device__ constexpr int sk_wk(int wm, int bn) { return SK_THREADS / 32 / (wm * (bn / 32)); }

// Shared memory: As [BM][LD] and Ws [BN][LD] bf16; once the products are done, over them, the
// warps' partial tiles [WK][BM][BN + 8] fp32 (slot 0: the block's sum, for the cluster's K split).
__host__ __device__ constexpr long long skinny_smem_bytes(int bm, int bn, int wm, int kb) {
    const long long operands = (long long)(bm + bn) * sk_ld(kb) * 2;
    const long long partials = (long long)sk_wk(wm, bn) * bm * sk_part_ld(bn) * 4;
    return operands > partials ? operands : partials;
}

// Rows [r0, r0 + ROWS) x k [k0, k0 + kb) of a bf16 matrix (row stride ld, `rows` rows, K columns)
// into dst (row stride dld) by the whole block, chunk by chunk (load_chunk16).
template <int ROWS>
__device__ __forceinline__ void sk_load(bf16 *dst, int dld, const bf16 *__restrict__ src, long long ld, int rows,
                                        int K, int r0, int k0, int kb, bool vec, int tid) {
    // Chunk q = r * cpr + kc / 8 for q = tid, tid + THREADS, ...: one division for the first, then
    // a carry (a division a chunk, ~20 integer instructions, in a kernel ncu found issue-bound).
    const int cpr = kb / 8, dr = SK_THREADS / cpr, dkc = 8 * (SK_THREADS % cpr);
    int r = tid / cpr, kc = 8 * (tid % cpr);
    for (int q = tid; q < ROWS * cpr; q += SK_THREADS, r += dr, kc += dkc) {
        if (kc >= kb) kc -= kb, r++;
        load_chunk16(dst + r * dld + kc, src, ld, rows, K, r0 + r, k0 + kc, vec);
    }
}

// A warp: 16 MI of the BM = 16 MI WM rows x 32 columns (4 n8 tiles) over 1/WK of the K slice;
// WN = BN / 32.
template <int MI, int WM, int WN, bool SPLIT>
__global__ void __launch_bounds__(SK_THREADS)
skinny_kernel(const bf16 *__restrict__ x, long long ldx, const bf16 *__restrict__ W, int M, int N, int K, int SB,
              Epilogue e) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    constexpr int NI = 4, BM = 16 * MI * WM, BN = 32 * WN, WK = sk_wk(WM, BN), PLD = sk_part_ld(BN);
    static_assert(WM * WN * WK * 32 == SK_THREADS, "the warps tile the rows, the columns and the K slice");
    pdl_launch_dependents();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const int CS = SPLIT ? (int)cg::this_cluster().num_blocks() : 1;
    const int rank = SPLIT ? (int)cg::this_cluster().block_rank() : 0;
#else
    constexpr int CS = 1, rank = 0;  // clusters exist from sm_90; the launcher splits only there
#endif
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int KB = 16 * SB, LD = sk_ld(KB);
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *Ws = As + BM * LD;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // The warp's 32 columns, its rows and its share of the K slice.
    const int wn = warp % WN, wm = warp / WN % WM, wk = warp / (WN * WM), a_row = 16 * MI * wm;
    const int n0 = (blockIdx.x / CS) * BN, m0 = blockIdx.y * BM, kb0 = rank * KB;
    const bool wvec = (K % 8) == 0 && (reinterpret_cast<uintptr_t>(W) % 16) == 0;
    const bool xvec = (K % 8) == 0 && (ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;

    // The weights first: nothing earlier in the step writes them.
    sk_load<BN>(Ws, LD, W, K, N, K, n0, kb0, KB, wvec, tid);
    cp_async_commit();
    pdl_wait();
    sk_load<BM>(As, LD, x, ldx, M, K, m0, kb0, KB, xvec, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float acc[MI][NI][4];
    zero_acc(acc);
    const int kk0 = 16 * (wk * SB / WK), kk1 = 16 * ((wk + 1) * SB / WK);
#pragma unroll 2
    for (int kk = kk0; kk < kk1; kk += 16) warp_mma_k16<MI, NI>(acc, As, a_row, Ws, 32 * wn, LD, kk, lane);

    // --- the WK partial tiles, added in warp order by the warps of the first K share ---
    const int gid = lane / 4, tig = lane % 4;
    float *part = reinterpret_cast<float *>(smem_raw);  // [WK][BM][PLD]; slot 0: the block's sum
    auto slot = [&](int q, int i, int h, int j) {
        return reinterpret_cast<float2 *>(part + (q * BM + a_row + i * 16 + gid + 8 * h) * PLD + 32 * wn + j * 8 +
                                          2 * tig);
    };
    __syncthreads();  // every warp is done with the operands: the partial tiles go over them
    if (wk > 0) store_acc(part + (wk * BM + a_row) * PLD + 32 * wn, PLD, acc, lane);
    __syncthreads();
    if (wk == 0) {
#pragma unroll
        for (int q = 1; q < WK; q++)
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < NI; j++) {
                        const float2 v = *slot(q, i, h, j);
                        acc[i][j][2 * h] += v.x;
                        acc[i][j][2 * h + 1] += v.y;
                    }
        if constexpr (SPLIT) {
            store_acc(part + a_row * PLD + 32 * wn, PLD, acc, lane);
        } else {
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < NI; j++) {
                        const int m = m0 + a_row + i * 16 + gid + 8 * h, n = n0 + 32 * wn + j * 8 + 2 * tig;
                        if (m < M && n < N) epi_store2(e, m, n, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                    }
        }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (SPLIT) {
        // --- the cluster's K split: block r sums rows r BM/CS.. of the CS blocks' tiles ---
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();  // every block's tile is complete
        const int rows = BM / CS, r0 = rank * rows;  // CS divides BM (powers of two, CS <= 8 <= BM / 2)
        for (int idx = tid; idx < rows * BN / 2; idx += SK_THREADS) {
            const int r = r0 + idx / (BN / 2), c = 2 * (idx % (BN / 2));
            float2 v[SK_MAX_CLUSTER], sum = make_float2(0.0f, 0.0f);
#pragma unroll
            for (int q = 0; q < SK_MAX_CLUSTER; q++)  // all loads in flight, then the sum in rank order
                if (q < CS) v[q] = *reinterpret_cast<const float2 *>(cluster.map_shared_rank(part, q) + r * PLD + c);
#pragma unroll
            for (int q = 0; q < SK_MAX_CLUSTER; q++)
                if (q < CS) sum.x += v[q].x, sum.y += v[q].y;
            const int m = m0 + r, n = n0 + c;
            if (m < M && n < N) epi_store2(e, m, n, sum.x, sum.y);
        }
        cluster.sync();  // no block leaves while another may still read its tile
    }
#endif
}

// ----------------------------------------------------------------------------
// fp32 SIMT kernel: BM x BN tile, TM x TN per thread, BK = 32, 3 stages of raw tiles by cp.async;
// each K step transposes its tiles into k-major operands (LayerNorm applied to x on the way), so
// each thread reads its TM and TN values as float4s.

constexpr int SIMT_BK = 32;
constexpr int SIMT_STAGES = 3;

template <int BM, int BN, int TM, int TN>
constexpr int simt_threads() { return (BM / TM) * (BN / TN); }

template <int BM, int BN>
constexpr int simt_smem_bytes() {
    return (SIMT_STAGES * (BM + BN + 1) * SIMT_BK + SIMT_BK * (BM + 4) + SIMT_BK * (BN + 4) + 2 * BM) * 4;
}

template <int BM, int BN, int TM, int TN, bool LN>
__global__ void __launch_bounds__(simt_threads<BM, BN, TM, TN>(), 1)
simt_kernel(const float *__restrict__ x, long long ldx, const float *__restrict__ gamma, const float *__restrict__ W,
            int M, int N, int K, Epilogue e) {
    constexpr int THREADS = simt_threads<BM, BN, TM, TN>();
    constexpr int BK = SIMT_BK, S = SIMT_STAGES;
    constexpr int QPR = BK / 4;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *Araw = reinterpret_cast<float *>(smem_raw);  // [S][BM][BK]
    float *Braw = Araw + S * BM * BK;                   // [S][BN][BK]
    float *Graw = Braw + S * BN * BK;                   // [S][BK]
    float *At = Graw + S * BK;                          // [BK][BM + 4]
    float *Bt = At + BK * (BM + 4);                     // [BK][BN + 4]
    float *row_dmean = Bt + BK * (BN + 4), *row_rstd = row_dmean + BM;

    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int KT = (K + BK - 1) / BK;
    const bool xvec = (ldx % 4) == 0 && (K % 4) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
    const bool wvec = (K % 4) == 0 && (reinterpret_cast<uintptr_t>(W) % 16) == 0;
    const bool gvec = (K % 4) == 0 && (reinterpret_cast<uintptr_t>(gamma) % 16) == 0;

    auto issue = [&](int t) {
        const int st = t % S;
        load_tile<float, BM, BK, THREADS>(Araw + st * BM * BK, BK, x, ldx, M, K, m0, t * BK, xvec, tid);
        load_tile<float, BN, BK, THREADS>(Braw + st * BN * BK, BK, W, K, N, K, n0, t * BK, wvec, tid);
        if constexpr (LN) load_tile<float, 1, BK, THREADS>(Graw + st * BK, BK, gamma, 0, 1, K, 0, t * BK, gvec, tid);
    };
#pragma unroll
    for (int t = 0; t < S - 1; t++) {
        if (t < KT) issue(t);
        cp_async_commit();
    }

    LnRows<BM, BK, THREADS> ln;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<S - 2>();
        __syncthreads();
        if (kt + S - 1 < KT) issue(kt + S - 1);
        cp_async_commit();
        const int st = kt % S;
        if constexpr (LN) {
            ln.process(Araw + st * BM * BK, Graw + st * BK, K, kt * BK, kt == 0, tid,
                       [&](int r, int kq, const float (&t)[4]) {
#pragma unroll
                           for (int q = 0; q < 4; q++) At[(kq + q) * (BM + 4) + r] = t[q];
                       });
        } else {
            for (int q = tid; q < BM * QPR; q += THREADS) {
                const int r = q / QPR, kq = 4 * (q % QPR);
                const float4 v = *reinterpret_cast<const float4 *>(Araw + st * BM * BK + r * BK + kq);
                At[(kq + 0) * (BM + 4) + r] = v.x;
                At[(kq + 1) * (BM + 4) + r] = v.y;
                At[(kq + 2) * (BM + 4) + r] = v.z;
                At[(kq + 3) * (BM + 4) + r] = v.w;
            }
        }
        for (int q = tid; q < BN * QPR; q += THREADS) {
            const int r = q / QPR, kq = 4 * (q % QPR);
            const float4 v = *reinterpret_cast<const float4 *>(Braw + st * BN * BK + r * BK + kq);
            Bt[(kq + 0) * (BN + 4) + r] = v.x;
            Bt[(kq + 1) * (BN + 4) + r] = v.y;
            Bt[(kq + 2) * (BN + 4) + r] = v.z;
            Bt[(kq + 3) * (BN + 4) + r] = v.w;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; k++) {
            float av[TM], bv[TN];
#pragma unroll
            for (int i = 0; i < TM; i += 4) {
                float4 t = *reinterpret_cast<const float4 *>(At + k * (BM + 4) + ty * TM + i);
                av[i] = t.x; av[i + 1] = t.y; av[i + 2] = t.z; av[i + 3] = t.w;
            }
#pragma unroll
            for (int j = 0; j < TN; j += 4) {
                float4 t = *reinterpret_cast<const float4 *>(Bt + k * (BN + 4) + tx * TN + j);
                bv[j] = t.x; bv[j + 1] = t.y; bv[j + 2] = t.z; bv[j + 3] = t.w;
            }
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    if constexpr (LN) ln.finish(row_dmean, row_rstd, K, tid);
    __syncthreads();

    // Epilogue through shared memory (as tc_kernel): Cs [BM][BN + 4] over the raw tiles.
    static_assert(BM * (BN + 4) <= S * (BM + BN + 1) * BK, "Cs fits");
    float *Cs = Araw;
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j += 4)
            *reinterpret_cast<float4 *>(Cs + (ty * TM + i) * (BN + 4) + tx * TN + j) =
                make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
    __syncthreads();
#pragma unroll 1
    for (int idx = tid; idx < BM * BN / 2; idx += THREADS) {
        const int r = idx / (BN / 2), c = 2 * (idx % (BN / 2)), m = m0 + r, n = n0 + c;
        if (m >= M || n >= N) continue;
        const float2 v = *reinterpret_cast<const float2 *>(Cs + r * (BN + 4) + c);
        const float dm = LN ? row_dmean[r] : 0.0f, rs = LN ? row_rstd[r] : 1.0f;
        epi_store2(e, m, n, ln_apply(e, LN, n, v.x, dm, rs), n + 1 < N ? ln_apply(e, LN, n + 1, v.y, dm, rs) : 0.0f);
    }
}

// ----------------------------------------------------------------------------
// fp32 rows kernel: LayerNorm + Linear (+ GELU) for 9-64 rows of fp32 W, on tensor cores at fp32's
// accuracy (3xTF32).
//
// At 9-64 rows of fp32 the FMA GEMV reads x from shared memory once per W row it multiplies
// (shared-memory bound: 12.95 us at 16 rows of 768 -> 3072 on an H200), the 32 x 64 tiles leave
// a third of the SMs idle and wait on every K step (33 us at 64 rows), and cuBLAS's SGEMM alone
// takes 13.0-21.3 us. Measured speed and what limits it: docs/PERF.md, "Session 36". Here:
//   - a block owns BN = 32 output columns (24 where that fills more of the SMs: N = 3072 on 132) and
//     all of K: its W slice (BN x K fp32, 72-96 KB at K = 768) stays in shared memory; its first chunk of
//     128 k arrives by cp.async before the PDL wait, with gamma, then chunk c + 1 with x's chunk c, so
//     the MMAs start once the first chunks land, not all of W;
//   - after the wait x's rows arrive in chunks of RF_KC = 128 k into a ring of RF_RING_ROWS / MT
//     slots (all of K = 768 at 16 rows, the next chunk at 64), each slot refilled as it frees up;
//   - every row is shifted by the mean of its first chunk, and its statistics are taken in one pass
//     around that shift, as the tiled kernels take them (fused_ln_linear.h, "Numerics");
//   - the 16 warps form RF_KG = 8 groups along k (16 k of every chunk a group) times two halves of
//     the MT x BN tile. A lane turns its x values into gamma (x - shift) in registers as it builds
//     the A fragments, summing d = x - shift and d^2 for the statistics on the way, so no pass over
//     the chunk stands between its arrival and the MMAs;
//   - the products are three tf32 MMAs, a_lo b_hi + a_hi b_lo + a_hi b_hi with a = a_hi + a_lo
//     (mma.cuh's split_tf32): about fp32's error (the dropped a_lo b_lo is 2^-22 of the product), at
//     three times the MMAs of plain TF32, which is off by 2^-11;
//   - at the end the k groups' partial tiles and sums meet in shared memory, summed in a fixed order
//     (the same bits every run).

constexpr int RF_BN = 32;                  // output columns a block, at most (24 where that fills more SMs)
constexpr int RF_KC = 128;                 // k a chunk of x
constexpr int RF_THREADS = 512;
constexpr int RF_WARPS = RF_THREADS / 32;
constexpr int RF_KG = 8;                   // the warps' groups along k: 16 k of each chunk a group
constexpr int RF_XS = RF_KC + 16;          // a chunk row in shared memory: 16 mod 32 floats
constexpr int RF_PS = RF_BN + 8;           // a row of a partial tile: 8 mod 32 floats
constexpr int RF_RING_ROWS = 128;          // the ring of x chunks: RF_RING_ROWS / MT slots of MT rows
constexpr int RF_MAX_ROWS = 64;            // rows a launch (more run as slices)
// AUTO's fewest rows for it: to 8 rows the FMA GEMV (8 rows a block) is as fast or faster, from 9 (16
// rows a block) it takes 1.6x as long (H200, fp32 768 -> 2304 / 3072, 1024 -> 3072 / 4096: PERF.md,
// "Session 36").
constexpr int RF_FROM = 9;

// W's row stride in shared memory: K rounded up to whole chunks (the last chunk's MMAs read all of
// it: zeros past K), plus 16 floats. Rows 16 mod 32 floats apart (W's and the chunks') keep the
// fragments' 16-byte reads free of bank conflicts: a quarter warp reads 4 float4s of one row and 4 of
// the next.
__host__ __device__ constexpr int rf_ws(int K) { return (K + RF_KC - 1) / RF_KC * RF_KC + 16; }

// The ring of x chunks [slots][mt][RF_XS], whose space the k groups' partial tiles [RF_KG][mt][RF_PS]
// reuse at the end, floats.
__host__ __device__ constexpr int rf_ring_floats(int mt) {
    return RF_RING_ROWS * RF_XS > RF_KG * mt * RF_PS ? RF_RING_ROWS * RF_XS : RF_KG * mt * RF_PS;
}

// Shared memory of a block, bytes: W [bn][rf_ws(K)], the ring, gamma [K rounded to a chunk], [2][mt]
// for the rows' shifts and then their dmean and rstd, and the k groups' sums [RF_KG][mt][2].
__host__ __device__ constexpr long long rf_smem_bytes(int mt, int bn, int K) {
    return 4LL * ((long long)bn * rf_ws(K) + rf_ring_floats(mt) + (K + RF_KC - 1) / RF_KC * RF_KC + 2 * mt +
                  RF_KG * mt * 2);
}

template <int MT, int BN>
__global__ void __launch_bounds__(RF_THREADS, 1)
rows_f32_kernel(const float *__restrict__ x, long long ldx, const float *__restrict__ gamma,
                const float *__restrict__ W, int m0, int M, int N, int K, Epilogue e) {
    // The warps: RF_KG groups along k times two halves of the MT x BN tile, split along m where the
    // tile has two m16 tiles or more, else along n; a warp holds WMI x WNT m16n8 accumulator tiles.
    constexpr bool SPLIT_M = MT >= 32;
    constexpr int WMI = SPLIT_M ? MT / 32 : MT / 16, WNT = SPLIT_M ? BN / 8 : BN / 16;
    constexpr int TPR = RF_THREADS / MT;            // the shift's pass: threads a row
    constexpr int FPT = RF_KC / 4 / TPR;            // float4s a thread of the first chunk's row
    constexpr int NB = RF_RING_ROWS / MT;           // the ring's slots
    constexpr int FIN_ROWS = RF_WARPS;              // the epilogue: column lane, rows warp + FIN_ROWS i
    static_assert(NB >= 2 && MT % 16 == 0, "two slots at least; whole m16 tiles");
    static_assert(BN <= RF_BN && BN % 8 == 0 && (SPLIT_M || BN % 16 == 0), "whole n8 tiles for each warp");
    static_assert(RF_WARPS == 2 * RF_KG && RF_KG * 16 == RF_KC && RF_KG == 8, "two warps a k group; 16 k a group");
    extern __shared__ __align__(16) float rf_smem[];
    const int ws = rf_ws(K), nch = (K + RF_KC - 1) / RF_KC;
    float *Ws = rf_smem;                              // [BN][ws]
    float *xs = Ws + BN * ws;                         // [NB][MT][RF_XS]
    float *gs = xs + rf_ring_floats(MT);              // [nch * RF_KC], zero past K
    float *stats = gs + nch * RF_KC;                  // the rows' shifts [MT]; after the loop dmean, rstd [2][MT]
    float *sums = stats + 2 * MT;                     // [RF_KG][MT][2]: sum d, sum d^2
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n0 = blockIdx.x * BN, rows = min(MT, M - m0);

    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();
    // W's chunk c, the 128 k of its BN rows (zeros past N and K: the padding may hold NaNs): warp w copies
    // rows w and w + 16, a lane 16 bytes.
    static_assert(BN <= 2 * RF_WARPS, "two W rows a warp at most");
    auto load_w = [&](int c) {
        if (c >= nch) return;
        const int k = c * RF_KC + 4 * lane;
#pragma unroll
        for (int r = warp; r < BN; r += RF_WARPS) {
            const bool ok = n0 + r < N && k < K;
            cp_async16(Ws + r * ws + k, ok ? W + (size_t)(n0 + r) * K + k : W, ok ? 16 : 0);
        }
    };
    // Before the wait: W's first chunk, gamma (zero past K), and the s_n and b'_n of the column this
    // thread finishes. The rest of W comes a chunk ahead of x's (below), so the MMAs start as soon as
    // the first chunks land, not all of W.
    load_w(0);
    for (int k = 4 * tid; k < nch * RF_KC; k += 4 * RF_THREADS)
        cp_async16(gs + k, k < K ? gamma + k : gamma, k < K ? 16 : 0);
    cp_async_commit();
    const int fin_n = lane, fin_m = warp;
    const bool fin_ok = fin_n < BN && n0 + fin_n < N;
    const float s_n = fin_ok ? __ldg(e.s + n0 + fin_n) : 0.0f;
    const float bias_n = fin_ok && e.bias ? __ldg(e.bias + n0 + fin_n) : 0.0f;
    Epilogue e_nobias = e;  // the bias is added from bias_n, loaded now: epi_store's would wait on each store
    e_nobias.bias = nullptr;
    pdl_wait();

    // Chunk c of x's rows, then W's chunk c + 1, two commit groups (empty past K): warp w copies x's rows
    // w + 16 i, a lane 16 bytes.
    const float *x_lane = x + (size_t)(m0 + warp) * ldx + 4 * lane;
    auto load_chunk = [&](int c) {
        if (c < nch) {
            const bool k_ok = c * RF_KC + 4 * lane < K;
            float *dst = xs + (c % NB) * MT * RF_XS + warp * RF_XS + 4 * lane;
#pragma unroll
            for (int i = 0; i < MT / RF_WARPS; i++) {
                const bool ok = k_ok && warp + RF_WARPS * i < rows;
                cp_async16(dst + i * RF_WARPS * RF_XS, ok ? x_lane + (size_t)i * RF_WARPS * ldx + c * RF_KC : x,
                           ok ? 16 : 0);
            }
        }
        cp_async_commit();
        load_w(c + 1);
        cp_async_commit();
    };
#pragma unroll 1
    for (int c = 0; c < NB; c++) load_chunk(c);

    // Committed: W's chunk 0 and gamma, then x's chunk c and W's c + 1 for c up to max(c + NB - 2, NB - 1)
    // (the first NB, then one an iteration from c = 1). x's chunk 0 (and W's chunk 0) has landed once
    // at most 2 NB - 1 groups are pending; in the loop, x's chunk c (and W's chunk c) once at most
    // 2 NB - 3 are: waiting for x's chunk does not wait for W's next one.
    cp_async_wait<2 * NB - 1>();
    __syncthreads();
    {  // each row's shift: the mean of its first chunk (zeros past K add nothing)
        const int r = tid / TPR, p = tid % TPR;
        float a = 0.0f;
#pragma unroll
        for (int f = 0; f < FPT; f++) {
            const float4 v = *reinterpret_cast<const float4 *>(xs + r * RF_XS + 4 * (p + TPR * f));
            a += (v.x + v.y) + (v.z + v.w);
        }
#pragma unroll
        for (int o = 1; o < TPR; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (p == 0) stats[r] = a / min(RF_KC, K);
    }
    __syncthreads();

    const int gid = lane / 4, tig = lane % 4, kg = warp % RF_KG, half = warp / RF_KG;
    const int wm0 = SPLIT_M ? 16 * WMI * half : 0, wn0 = SPLIT_M ? 0 : 8 * WNT * half;  // the warp's tile
    // The lane's rows wm0 + 16 i + gid + 8 h: their shifts and sums of d = x - shift and d^2.
    float shift[WMI][2], sum_d[WMI][2], sum_d2[WMI][2];
#pragma unroll
    for (int i = 0; i < WMI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            shift[i][h] = stats[wm0 + 16 * i + gid + 8 * h];
            sum_d[i][h] = sum_d2[i][h] = 0.0f;
        }
    float acc[WMI][WNT][4];
    zero_acc(acc);

    for (int c = 0; c < nch; c++) {
        if (c > 0) {
            cp_async_wait<2 * NB - 3>();
            __syncthreads();  // chunk c landed for all; every warp is done with chunk c - 1's slot
            load_chunk(c + NB - 1);
        }
        // The group's 16 k of the chunk as two k8 steps of 3xTF32 MMAs. The MMA's k order is free, so
        // lane (gid, tig) takes k = 4 tig .. 4 tig + 3 in one 16-byte read of x's row and of W's
        // column: step s's fragment k = tig is physical k 4 tig + 2 s, fragment k = tig + 4 is 4 tig +
        // 2 s + 1, the same in A and B.
        const int k = c * RF_KC + 16 * kg + 4 * tig;
        const float *xw = xs + (c % NB) * MT * RF_XS + wm0 * RF_XS + 16 * kg + 4 * tig;
        const float *ww = Ws + wn0 * ws + k;
        const float4 g = *reinterpret_cast<const float4 *>(gs + k);
        float in_k[4];  // 1 at k < K: the statistics skip the zero fill past K (gamma = 0 keeps it out of A)
#pragma unroll
        for (int q = 0; q < 4; q++) in_k[q] = k + q < K ? 1.0f : 0.0f;
        uint32_t bh[WNT][2][2], bl[WNT][2][2];  // [n tile][k step][b0, b1]
#pragma unroll
        for (int j = 0; j < WNT; j++) {
            const float4 w = *reinterpret_cast<const float4 *>(ww + (8 * j + gid) * ws);
            split_tf32(w.x, bh[j][0][0], bl[j][0][0]);
            split_tf32(w.y, bh[j][0][1], bl[j][0][1]);
            split_tf32(w.z, bh[j][1][0], bl[j][1][0]);
            split_tf32(w.w, bh[j][1][1], bl[j][1][1]);
        }
#pragma unroll
        for (int i = 0; i < WMI; i++) {
            float a[2][4];  // gamma (x - shift) of rows gid, gid + 8 at the lane's 4 k
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float4 v = *reinterpret_cast<const float4 *>(xw + (16 * i + gid + 8 * h) * RF_XS);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float d = (&v.x)[q] - shift[i][h], dk = d * in_k[q];
                    sum_d[i][h] += dk;
                    sum_d2[i][h] = fmaf(dk, d, sum_d2[i][h]);
                    a[h][q] = (&g.x)[q] * d;
                }
            }
#pragma unroll
            for (int st = 0; st < 2; st++) {
                uint32_t ah[4], al[4];
                split_tf32(a[0][2 * st], ah[0], al[0]);
                split_tf32(a[1][2 * st], ah[1], al[1]);
                split_tf32(a[0][2 * st + 1], ah[2], al[2]);
                split_tf32(a[1][2 * st + 1], ah[3], al[3]);
#pragma unroll
                for (int j = 0; j < WNT; j++) {  // the small products first
                    mma_tf32_1688(acc[i][j], al, bh[j][st][0], bh[j][st][1]);
                    mma_tf32_1688(acc[i][j], ah, bl[j][st][0], bl[j][st][1]);
                    mma_tf32_1688(acc[i][j], ah, bh[j][st][0], bh[j][st][1]);
                }
            }
        }
    }

    // The rows' sums: a row's four tig lanes by shuffles, then one slot a k group (the two halves of an
    // n split hold the same rows: the first writes).
#pragma unroll
    for (int i = 0; i < WMI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float s1 = sum_d[i][h], s2 = sum_d2[i][h];
            s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
            s2 += __shfl_xor_sync(0xffffffffu, s2, 1);
            s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
            s2 += __shfl_xor_sync(0xffffffffu, s2, 2);
            if (tig == 0 && (SPLIT_M || half == 0)) {
                float *dst = sums + (kg * MT + wm0 + 16 * i + gid + 8 * h) * 2;
                dst[0] = s1, dst[1] = s2;
            }
        }
    __syncthreads();  // every warp is done with the chunks (their space takes the partial tiles) and the shifts
    float *part = xs;  // [RF_KG][MT][RF_PS]
    store_acc(part + (kg * MT + wm0) * RF_PS + wn0, RF_PS, acc, lane);
    if (tid < MT) {  // row tid's statistics, summed in a fixed order
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int g = 0; g < RF_KG; g++) s1 += sums[(g * MT + tid) * 2], s2 += sums[(g * MT + tid) * 2 + 1];
        const float dmean = s1 / K;
        stats[tid] = dmean;
        stats[MT + tid] = 1.0f / sqrtf(fmaxf(s2 / K - dmean * dmean, 0.0f) + LN_EPS);
    }
    __syncthreads();
    if (!fin_ok) return;  // lanes past BN or N (no barrier follows)
#pragma unroll
    for (int i = 0; i < MT / FIN_ROWS; i++) {
        const int m = fin_m + FIN_ROWS * i;
        const float *p = part + m * RF_PS + fin_n;
        const float v = ((p[0] + p[MT * RF_PS]) + (p[2 * MT * RF_PS] + p[3 * MT * RF_PS])) +
                        ((p[4 * MT * RF_PS] + p[5 * MT * RF_PS]) + (p[6 * MT * RF_PS] + p[7 * MT * RF_PS]));
        if (m < rows) epi_store(e_nobias, m0 + m, n0 + fin_n, stats[MT + m] * (v - stats[m] * s_n) + bias_n);
    }
}

// ----------------------------------------------------------------------------
// Host side: device facts cached per device, and the dynamic shared memory opt-in.

struct DeviceInfo {
    int sms, smem_optin, smem_sm, cc;
};

inline int device_info(DeviceInfo *out) {
    static DeviceInfo cache[16];
    static int have[16];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return (int)err;
    if (dev < 16 && have[dev]) {
        *out = cache[dev];
        return 0;
    }
    DeviceInfo d;
    int major = 0, minor = 0;
    if ((err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return (int)err;
    if ((err = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess)
        return (int)err;
    if ((err = cudaDeviceGetAttribute(&d.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev)) != cudaSuccess)
        return (int)err;
    if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess) return (int)err;
    if ((err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess) return (int)err;
    d.cc = major * 10 + minor;
    if (dev < 16) {
        cache[dev] = d;
        have[dev] = 1;
    }
    *out = d;
    return 0;
}

// Raises a kernel's dynamic shared memory limit to `bytes` (above 48 KB only). `done` is the
// caller's per-kernel record of what each device already allows.
template <typename F>
inline cudaError_t allow_smem(F *kernel, int bytes, int (&done)[16]) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 16 && done[dev] >= bytes) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && dev < 16) done[dev] = bytes;
    return err;
}

}  // namespace lin

// ----------------------------------------------------------------------------
// The dispatch both launchers share: LN = LayerNorm folded in (x fp32, gamma given), else a
// plain linear with x in W's dtype. `path` is one of the LINEAR_PATH_* values of
// fused_ln_linear.h (0 = auto).

namespace lin {

// Auto routing, from tests/bench_fused_linear.c's sweep of every path on an H200 (docs/PERF.md):
// fp32 with LayerNorm at 9-64 rows the fp32 rows kernel (1.6-3.5x the GEMV and the tiled kernel:
// "Sessions 35-36"); bf16 from 5 rows where the device has clusters, the cluster GEMV with LayerNorm (to
// CL_LN_MAX_ROWS) and the skinny kernel without (to 64; past 32 rows LN + cuBLASLt or cuBLASLt
// wins, and the engine goes there); else the FMA GEMV up to 16 rows (bf16 with LayerNorm: up to
// 8, then the tensor-core GEMV up to 16), 32 x 32 tiles up to 128 rows, then 128 x 128 tiles
// (fp32: 64 x 64 until 128 x 128 tiles would cover the SMs).
inline int auto_path(int M, int N, bool w_bf16, bool ln, bool tg_ok, bool cluster_ok, bool skinny_ok, bool rows_f32_ok,
                     const DeviceInfo &d) {
    if (rows_f32_ok && M >= RF_FROM && M <= RF_MAX_ROWS) return LINEAR_PATH_ROWS_F32;
    if (w_bf16 && !ln && skinny_ok && d.cc >= 90 && M > 4 && M <= 64) return LINEAR_PATH_SKINNY;
    if (w_bf16 && ln && cluster_ok && M > 4 && M <= CL_LN_MAX_ROWS) return LINEAR_PATH_CLUSTER;
    if (w_bf16 && ln && M > 8 && M <= 16 && tg_ok) return LINEAR_PATH_GEMV_TC;
    if (M <= 16) return LINEAR_PATH_GEMV;
    if (M <= 128) return LINEAR_PATH_TILED_XS;
    if (w_bf16) return LINEAR_PATH_TILED_L;
    const long long tiles_l = (long long)((M + 127) / 128) * ((N + 127) / 128);
    return tiles_l >= 128 * d.sms / 132 ? LINEAR_PATH_TILED_L : LINEAR_PATH_TILED_S;
}

template <typename WT, typename XT, int MT, int NPW, int U, bool LN>
inline cudaError_t launch_gemv_mt(const XT *x, long long ldx, const float *gamma, const WT *W, int M, int N, int K,
                                  const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    constexpr int CH = 32 * (16 / sizeof(WT));
    const int KP = (K + CH - 1) / CH * CH;
    const int smem = (int)gemv_smem_bytes(MT, LN, KP, (int)sizeof(XT));
    auto kern = gemv_kernel<WT, XT, MT, NPW, U, LN>;
    static int done[16];
    cudaError_t err = allow_smem(kern, smem, done);
    if (err != cudaSuccess) return err;
    // Split K while the warps still cover every (group, slice) task in one round: few long rows
    // (the MLP projection) then have all their loads in flight at once.
    const int ngroups = (N + NPW - 1) / NPW, nch = KP / CH;
    int ksplit = 1;
    while (ksplit < GEMV_WARPS && 2 * ksplit <= nch && (long long)ngroups * 2 * ksplit <= (long long)d.sms * GEMV_WARPS)
        ksplit *= 2;
    // One block per SM leaves room for the next kernel's block (PDL); a W of many rows (the logits:
    // 12,565 groups) streams through many rounds instead, and a second block per SM doubles its
    // loads in flight.
    int grid = ngroups < d.sms ? ngroups : d.sms;
    if ((long long)ngroups >= 4LL * d.sms * GEMV_WARPS) grid = 2 * d.sms;
    // A GEMV of one block an SM asks for an L1/shared split that leaves room beside its block for
    // the next kernel's on Hopper: gemm_rows's (the MLP projection after fc at one row: ~125 KB of W
    // and x tiles). With the driver's choice (the most L1 for a 10 KB block) the projection's blocks
    // waited on a third of its SMs until fc had completed, then loaded their W on the step's path;
    // with room, B = 1 +1.1% on an H200 (docs/PERF.md, "Session 28"). The logits GEMV (two blocks an
    // SM, many rounds) keeps the driver's choice: it streams W through L1, and lost 1.3 us with less.
    const int carveout = d.cc >= 90 && grid <= d.sms && d.smem_sm > 0
                             ? (int)((100LL * (smem + 1024 + GEMV_ROOM) + d.smem_sm - 1) / d.smem_sm)
                             : PDL_CARVEOUT_DRIVER;
    for (int m0 = 0; m0 < M; m0 += MT)
        if ((err = launch_pdl_ex(kern, dim3(grid), dim3(GEMV_THREADS), smem, 1, carveout > 100 ? 100 : carveout,
                                 stream, x, ldx, gamma, W, m0, M, N, K, KP, ksplit, e)) != cudaSuccess)
            return err;
    return cudaSuccess;
}

template <typename WT, typename XT, bool LN>
inline cudaError_t launch_gemv(const XT *x, long long ldx, const float *gamma, const WT *W, int M, int N, int K,
                               const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    constexpr int CH = 32 * (16 / sizeof(WT));
    const long long KP = ((long long)K + CH - 1) / CH * CH;
    int mt = 1;
    while (mt < 16 && mt < M) mt *= 2;
    while (mt > 1 && gemv_smem_bytes(mt, LN, KP, sizeof(XT)) > d.smem_optin) mt /= 2;
    if (gemv_smem_bytes(1, LN, KP, sizeof(XT)) > d.smem_optin) return cudaErrorInvalidValue;  // one row does not fit
    switch (mt) {
    case 1: return launch_gemv_mt<WT, XT, 1, 4, 3, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    case 2: return launch_gemv_mt<WT, XT, 2, 4, 4, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    case 4: return launch_gemv_mt<WT, XT, 4, 4, 2, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    case 8: return launch_gemv_mt<WT, XT, 8, 4, 2, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    default: return launch_gemv_mt<WT, XT, 16, 2, 2, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    }
}

template <int MT, bool LN>
inline cudaError_t launch_gemv_tc_mt(const void *x, long long ldx, const float *gamma, const bf16 *W, int M, int N,
                                     int K, int KP, const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    const int smem = MT * tg_row_stride(KP) * 2 + (LN ? KP * 4 : 0);
    auto kern = gemv_tc_kernel<MT, LN>;
    static int done[16];
    cudaError_t err = allow_smem(kern, smem, done);
    if (err != cudaSuccess) return err;
    const int ngroups = (N + 7) / 8;
    const int grid = ngroups < d.sms ? ngroups : d.sms;
    for (int m0 = 0; m0 < M; m0 += MT) {
        kern<<<grid, TG_THREADS, smem, stream>>>(x, ldx, gamma, W, m0, M, N, K, KP, e);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    return cudaSuccess;
}

template <bool LN>
inline bool gemv_tc_fits(int M, int K, const DeviceInfo &d) {
    const int KP = (K + 31) / 32 * 32;
    return (!LN || K <= 2048) && 16 * tg_row_stride(KP) * 2 + (LN ? KP * 4 : 0) <= d.smem_optin;
    (void)M;
}

template <bool LN>
inline cudaError_t launch_gemv_tc(const void *x, long long ldx, const float *gamma, const bf16 *W, int M, int N, int K,
                                  const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    if (!gemv_tc_fits<LN>(M, K, d)) return cudaErrorInvalidValue;
    const int KP = (K + 31) / 32 * 32;
    auto bytes = [&](int mt) { return (long long)mt * tg_row_stride(KP) * 2 + (LN ? KP * 4 : 0); };
    int mt = M <= 16 ? 16 : M <= 32 ? 32 : 64;
    while (mt > 16 && bytes(mt) > d.smem_optin) mt /= 2;
    if (mt == 16) return launch_gemv_tc_mt<16, LN>(x, ldx, gamma, W, M, N, K, KP, e, d, stream);
    if (mt == 32) return launch_gemv_tc_mt<32, LN>(x, ldx, gamma, W, M, N, K, KP, e, d, stream);
    return launch_gemv_tc_mt<64, LN>(x, ldx, gamma, W, M, N, K, KP, e, d, stream);
}

// How the cluster GEMV covers a product: rows per launch (16 mi), column groups per block (g),
// blocks per cluster (cs), the staged rows' stride (as), blocks.
struct ClusterPlan {
    int mi, g, cs, as, blocks;
};

// false where the kernel cannot run: no clusters (before sm_90), rows longer than CL_LN_MAX_K, or
// not even 16 rows fit.
inline bool cluster_plan(int M, int N, int K, const DeviceInfo &d, ClusterPlan *p) {
    if (d.cc < 90 || K > CL_LN_MAX_K) return false;
    const int budget = d.smem_sm / 2 - 1024;  // half an SM (less its per-block reserve): two blocks fit
    const int KP = (K + 31) / 32 * 32, ngroups = (N + 7) / 8;
    ClusterPlan c = {};
    c.cs = CL_MAX_CLUSTER, c.as = tg_row_stride(KP);
    for (c.mi = M <= 16 ? 1 : M <= 32 ? 2 : 4; 16 * c.mi * c.as * 2 + KP * 4 > budget; c.mi /= 2)
        if (c.mi == 1) return false;  // the most rows whose staging fits
    // The fewest column groups a block (up to 3: registers) that still put every block on its own SM.
    for (c.g = 1;; c.g++) {
        const int sets = (ngroups + c.g - 1) / c.g;
        while (c.cs > 1 && c.cs / 2 >= sets) c.cs /= 2;  // a cluster no wider than the work
        c.blocks = (sets + c.cs - 1) / c.cs * c.cs;
        if (c.blocks <= d.sms || c.g == 3) break;
    }
    if (cl_smem_bytes(16 * c.mi, 8 * c.g, c.as, KP) > d.smem_optin) return false;
    *p = c;
    return true;
}

template <int MI, int G>
inline cudaError_t launch_cluster_k(const float *x, long long ldx, const float *gamma, const bf16 *W, int M, int N,
                                    int K, const ClusterPlan &c, const Epilogue &e, cudaStream_t stream) {
    constexpr int MT = 16 * MI;
    const int smem = cl_smem_bytes(MT, 8 * G, c.as, (K + 31) / 32 * 32);
    auto kern = cluster_kernel<MI, G>;
    static int done[16];
    cudaError_t err = allow_smem(kern, smem, done);
    if (err != cudaSuccess) return err;
    for (int m0 = 0; m0 < M; m0 += MT)
        if ((err = launch_pdl_cluster(kern, dim3(c.blocks), dim3(CL_THREADS), smem, c.cs, stream, x, ldx, gamma, W, m0,
                                      M, N, K, c.as, e)) != cudaSuccess)
            return err;
    return cudaSuccess;
}

template <int MI>
inline cudaError_t launch_cluster_g(const float *x, long long ldx, const float *gamma, const bf16 *W, int M, int N,
                                    int K, const ClusterPlan &c, const Epilogue &e, cudaStream_t stream) {
    switch (c.g) {
    case 1: return launch_cluster_k<MI, 1>(x, ldx, gamma, W, M, N, K, c, e, stream);
    case 2: return launch_cluster_k<MI, 2>(x, ldx, gamma, W, M, N, K, c, e, stream);
    default: return launch_cluster_k<MI, 3>(x, ldx, gamma, W, M, N, K, c, e, stream);
    }
}

inline cudaError_t launch_cluster(const float *x, long long ldx, const float *gamma, const bf16 *W, int M, int N, int K,
                                  const ClusterPlan &c, const Epilogue &e, cudaStream_t stream) {
    switch (c.mi) {
    case 1: return launch_cluster_g<1>(x, ldx, gamma, W, M, N, K, c, e, stream);
    case 2: return launch_cluster_g<2>(x, ldx, gamma, W, M, N, K, c, e, stream);
    default: return launch_cluster_g<4>(x, ldx, gamma, W, M, N, K, c, e, stream);
    }
}

template <int BM, int BN, int WM, int WN, int BK, int S, bool LN>
inline cudaError_t launch_tc(const void *x, long long ldx, const float *gamma, const bf16 *W, int M, int N, int K,
                             const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    constexpr int smem = tc_smem_bytes<BM, BN, BK, S, LN>();
    if (smem > d.smem_optin) return cudaErrorInvalidValue;
    auto kern = tc_kernel<BM, BN, WM, WN, BK, S, LN>;
    static int done[16];  // per instantiation and device
    cudaError_t err = allow_smem(kern, smem, done);
    if (err != cudaSuccess) return err;
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    if (grid.y > 65535) return cudaErrorInvalidValue;
    kern<<<grid, WM * WN * 32, smem, stream>>>(x, ldx, gamma, W, M, N, K, e);
    return cudaGetLastError();
}

// How the skinny kernel covers a product: rows a block (bm), output columns a block (bn), blocks of
// a cluster that split K (cs), k16 steps a block (sb), warps that share the rows (wm).
struct SkinnyPlan {
    int bm, bn, cs, sb, wm;
};

// The first of (128 columns, 64) x (no split, split 2, 4, 8) whose operands fit shared memory and
// that gives at least half the SMs a block; failing that the fitting plan with the most blocks.
// Wide tiles come first (x is read N / bn times over), then the least split. GPT-2 124M at 64 rows
// on an H200: qkv 128 columns split 4 (72 blocks), fc 128 split 4 (96), the attention projection
// 64 split 8 (96, two warps to the rows: 3 k16 steps a warp), the MLP projection 64 split 8 (96).
inline bool skinny_plan(int M, int N, int K, const DeviceInfo &d, SkinnyPlan *p) {
    const int bm = M <= 16 ? 16 : M <= 32 ? 32 : 64, steps = (K + 15) / 16;
    const long long mtiles = (M + bm - 1) / bm;
    long long best = 0;
    for (int bn = 128; bn >= 64; bn /= 2)
        for (int cs = 1; cs <= (d.cc >= 90 ? SK_MAX_CLUSTER : 1) && cs <= steps; cs *= 2) {
            const int sb = (steps + cs - 1) / cs;
            // Split rows over two warps where the K split alone would leave a warp under two steps.
            const int wm = bn == 64 && bm >= 32 && cs > 1 && sb < 2 * sk_wk(1, bn) ? 2 : 1;
            if (skinny_smem_bytes(bm, bn, wm, 16 * sb) > d.smem_optin) continue;
            const long long blocks = (N + bn - 1) / bn * cs * mtiles;
            if (blocks > best) *p = {bm, bn, cs, sb, wm}, best = blocks;
            if (2 * blocks >= d.sms) return true;
        }
    return best > 0;
}

template <int MI, int WM, int WN, bool SPLIT>
inline cudaError_t launch_skinny_k(const bf16 *x, long long ldx, const bf16 *W, int M, int N, int K,
                                   const SkinnyPlan &c, const Epilogue &e, cudaStream_t stream) {
    constexpr int BM = 16 * MI * WM, BN = 32 * WN;
    const int smem = (int)skinny_smem_bytes(BM, BN, WM, 16 * c.sb);  // fits: skinny_plan
    auto kern = skinny_kernel<MI, WM, WN, SPLIT>;
    static int done[16];
    cudaError_t err = allow_smem(kern, smem, done);
    if (err != cudaSuccess) return err;
    const dim3 grid((N + BN - 1) / BN * c.cs, (M + BM - 1) / BM);
    if (grid.y > 65535) return cudaErrorInvalidValue;
    return launch_pdl_cluster(kern, grid, dim3(SK_THREADS), smem, c.cs, stream, x, ldx, W, M, N, K, c.sb, e);
}

// BM = 16 MI rows a block; two warps to the rows only at 64 columns with a split (skinny_plan).
template <int MI>
inline cudaError_t launch_skinny_m(const bf16 *x, long long ldx, const bf16 *W, int M, int N, int K,
                                   const SkinnyPlan &c, const Epilogue &e, cudaStream_t stream) {
    if (c.bn == 128) {
        if (c.cs > 1) return launch_skinny_k<MI, 1, 4, true>(x, ldx, W, M, N, K, c, e, stream);
        return launch_skinny_k<MI, 1, 4, false>(x, ldx, W, M, N, K, c, e, stream);
    }
    if constexpr (MI > 1)
        if (c.wm == 2) return launch_skinny_k<MI / 2, 2, 2, true>(x, ldx, W, M, N, K, c, e, stream);
    if (c.cs > 1) return launch_skinny_k<MI, 1, 2, true>(x, ldx, W, M, N, K, c, e, stream);
    return launch_skinny_k<MI, 1, 2, false>(x, ldx, W, M, N, K, c, e, stream);
}

inline cudaError_t launch_skinny(const bf16 *x, long long ldx, const bf16 *W, int M, int N, int K,
                                 const SkinnyPlan &c, const Epilogue &e, cudaStream_t stream) {
    if (c.bm == 16) return launch_skinny_m<1>(x, ldx, W, M, N, K, c, e, stream);
    if (c.bm == 32) return launch_skinny_m<2>(x, ldx, W, M, N, K, c, e, stream);
    return launch_skinny_m<4>(x, ldx, W, M, N, K, c, e, stream);
}

template <int BM, int BN, int TM, int TN, bool LN>
inline cudaError_t launch_simt(const float *x, long long ldx, const float *gamma, const float *W, int M, int N, int K,
                               const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    constexpr int smem = simt_smem_bytes<BM, BN>();
    if (smem > d.smem_optin) return cudaErrorInvalidValue;
    auto kern = simt_kernel<BM, BN, TM, TN, LN>;
    static int done[16];
    cudaError_t err = allow_smem(kern, smem, done);
    if (err != cudaSuccess) return err;
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    if (grid.y > 65535) return cudaErrorInvalidValue;
    kern<<<grid, simt_threads<BM, BN, TM, TN>(), smem, stream>>>(x, ldx, gamma, W, M, N, K, e);
    return cudaGetLastError();
}

// The fp32 rows kernel's columns a block: 24 where that leaves less work on the busiest SM (rounds of
// blocks x columns) than 32 (N = 3072 on 132 SMs: one round either way, 24 columns an SM, not 32),
// else 32; at 16 rows always 32 (its warps split the columns in two halves of whole n8 tiles).
inline int rows_f32_bn(int mt, int N, const DeviceInfo &d) {
    auto work = [&](int bn) { return (long long)((N + bn - 1) / bn + d.sms - 1) / d.sms * bn; };
    return mt >= 32 && work(24) < work(RF_BN) ? 24 : RF_BN;
}

// The fp32 rows kernel takes the shape: K a multiple of 4 whose block fits in shared memory.
inline bool rows_f32_shape_fits(int M, int N, int K, const DeviceInfo &d) {
    const int mt = M <= 16 ? 16 : M <= 32 ? 32 : RF_MAX_ROWS;
    return K % 4 == 0 && rf_smem_bytes(mt, rows_f32_bn(mt, N, d), K) <= d.smem_optin;
}

// ... and the call: x, W and gamma 16-byte aligned, x's rows a multiple of 4 floats apart.
inline bool rows_f32_fits(int M, int N, int K, long long ldx, const void *x, const void *W, const float *gamma,
                          const DeviceInfo &d) {
    return rows_f32_shape_fits(M, N, K, d) && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(W) % 16 == 0 && reinterpret_cast<uintptr_t>(gamma) % 16 == 0;
}

template <int MT, int BN>
inline cudaError_t launch_rows_f32_mt(const float *x, long long ldx, const float *gamma, const float *W, int M, int N,
                                      int K, const Epilogue &e, cudaStream_t stream) {
    const int smem = (int)rf_smem_bytes(MT, BN, K);
    auto kern = rows_f32_kernel<MT, BN>;
    static int done[16];
    cudaError_t err = allow_smem(kern, smem, done);
    for (int m0 = 0; err == cudaSuccess && m0 < M; m0 += MT)
        err = launch_pdl(kern, dim3((N + BN - 1) / BN), dim3(RF_THREADS), smem, stream, x, ldx, gamma, W, m0, M, N, K,
                         e);
    return err;
}

inline cudaError_t launch_rows_f32(const float *x, long long ldx, const float *gamma, const float *W, int M, int N,
                                   int K, const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    if (M <= 16) return launch_rows_f32_mt<16, RF_BN>(x, ldx, gamma, W, M, N, K, e, stream);
    if (M <= 32)
        return rows_f32_bn(32, N, d) == 24 ? launch_rows_f32_mt<32, 24>(x, ldx, gamma, W, M, N, K, e, stream)
                                           : launch_rows_f32_mt<32, RF_BN>(x, ldx, gamma, W, M, N, K, e, stream);
    return rows_f32_bn(RF_MAX_ROWS, N, d) == 24
               ? launch_rows_f32_mt<RF_MAX_ROWS, 24>(x, ldx, gamma, W, M, N, K, e, stream)
               : launch_rows_f32_mt<RF_MAX_ROWS, RF_BN>(x, ldx, gamma, W, M, N, K, e, stream);
}

template <bool LN>
inline cudaError_t launch_linear(const void *x, long long ldx, const float *gamma, const void *W, bool w_bf16, int M,
                                 int N, int K, const Epilogue &e, int path, cudaStream_t stream) {
    DeviceInfo d;
    int rc = device_info(&d);
    if (rc) return (cudaError_t)rc;
    ClusterPlan plan;
    const bool cluster_ok = LN && w_bf16 && cluster_plan(M, N, K, d, &plan);
    SkinnyPlan splan = {};
    const bool skinny_ok = !LN && w_bf16 && skinny_plan(M, N, K, d, &splan);
    const bool rows_f32_ok = LN && !w_bf16 && rows_f32_fits(M, N, K, ldx, x, W, gamma, d);
    if (path == LINEAR_PATH_AUTO)
        path = auto_path(M, N, w_bf16, LN, w_bf16 && gemv_tc_fits<LN>(M, K, d), cluster_ok, skinny_ok, rows_f32_ok, d);
    if (path == LINEAR_PATH_ROWS_F32) {  // fp32 with the LayerNorm
        if (!rows_f32_ok) return cudaErrorInvalidValue;
        return launch_rows_f32((const float *)x, ldx, gamma, (const float *)W, M, N, K, e, d, stream);
    }
    if (path == LINEAR_PATH_CLUSTER) {  // bf16 with the LayerNorm
        if (!cluster_ok)
            return !LN || !w_bf16 ? cudaErrorInvalidValue : d.cc < 90 ? cudaErrorNotSupported : cudaErrorInvalidValue;
        return launch_cluster((const float *)x, ldx, gamma, (const bf16 *)W, M, N, K, plan, e, stream);
    }
    if (path == LINEAR_PATH_SKINNY) {  // a plain bf16 linear (x is bf16 already) whose K slices fit
        if (!skinny_ok) return cudaErrorInvalidValue;
        return launch_skinny((const bf16 *)x, ldx, (const bf16 *)W, M, N, K, splan, e, stream);
    }
    if (path == LINEAR_PATH_GEMV_TC) {
        if (!w_bf16) return cudaErrorInvalidValue;
        return launch_gemv_tc<LN>(x, ldx, gamma, (const bf16 *)W, M, N, K, e, d, stream);
    }
    if (path == LINEAR_PATH_GEMV) {
        if (w_bf16) {
            if constexpr (LN)
                return launch_gemv<bf16, float, LN>((const float *)x, ldx, gamma, (const bf16 *)W, M, N, K, e, d, stream);
            else
                return launch_gemv<bf16, bf16, LN>((const bf16 *)x, ldx, gamma, (const bf16 *)W, M, N, K, e, d, stream);
        }
        return launch_gemv<float, float, LN>((const float *)x, ldx, gamma, (const float *)W, M, N, K, e, d, stream);
    }
    if (w_bf16) {
        const bf16 *Wb = (const bf16 *)W;
        switch (path) {
        case LINEAR_PATH_TILED_XS: return launch_tc<32, 32, 2, 2, 64, 6, LN>(x, ldx, gamma, Wb, M, N, K, e, d, stream);
        case LINEAR_PATH_TILED_S: return launch_tc<64, 64, 2, 2, 64, 3, LN>(x, ldx, gamma, Wb, M, N, K, e, d, stream);
        case LINEAR_PATH_TILED_L: return launch_tc<128, 128, 2, 4, 32, 4, LN>(x, ldx, gamma, Wb, M, N, K, e, d, stream);
        default: return cudaErrorInvalidValue;
        }
    }
    const float *xf = (const float *)x, *Wf = (const float *)W;
    switch (path) {
    case LINEAR_PATH_TILED_XS: return launch_simt<32, 64, 4, 4, LN>(xf, ldx, gamma, Wf, M, N, K, e, d, stream);
    case LINEAR_PATH_TILED_S: return launch_simt<64, 64, 4, 4, LN>(xf, ldx, gamma, Wf, M, N, K, e, d, stream);
    case LINEAR_PATH_TILED_L: return launch_simt<128, 128, 8, 8, LN>(xf, ldx, gamma, Wf, M, N, K, e, d, stream);
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace lin
